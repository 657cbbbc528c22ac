"""The Tether wire protocol (``proto/PROTOCOL.md``): frames, the handshake, streams and credit
flow control. This is the only package that touches frames; the rest of the SDK opens a
:class:`Stream` for an operation and reads :class:`Data` and control messages from it.

Layout of a frame (section 5): one byte version/kind, a u32 stream id, one channel byte,
then the payload. Data frames carry raw bytes; control frames carry one JSON object.
"""

from __future__ import annotations

from .connection import Connection
from .frames import (
    CHANNELS,
    KIND_CONTROL,
    KIND_DATA,
    KIND_WINDOW,
    Data,
    Frame,
    Message,
    decode_control,
    decode_frame,
    encode_control,
    encode_data,
    encode_window,
)
from .stream import Stream, expect_reply, raise_if_error

__all__ = [
    "CHANNELS",
    "KIND_CONTROL",
    "KIND_DATA",
    "KIND_WINDOW",
    "Connection",
    "Data",
    "Frame",
    "Message",
    "Stream",
    "decode_control",
    "decode_frame",
    "encode_control",
    "encode_data",
    "encode_window",
    "expect_reply",
    "raise_if_error",
]
