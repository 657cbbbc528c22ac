"""Frames (PROTOCOL.md section 5): the 6-byte header, data, window and control frames, and
the checks a receiver makes, in the document's order. Pure functions: no sockets."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

from .._constants import FRAME_VERSION, HEADER_LEN, MAX_PAYLOAD
from ..errors import ProtocolError

KIND_DATA = 1
KIND_WINDOW = 2
KIND_CONTROL = 3
CHANNELS = ("in", "out", "err")
HEADER = struct.Struct(">BIB")
CREDIT = struct.Struct(">I")
MAX_STREAM_ID = 0xFFFF_FFFF


@dataclass(frozen=True)
class Data:
    """Bytes the agent sent on a stream's ``out`` or ``err`` channel."""

    channel: str
    data: bytes


Message = dict[str, Any]
"""A decoded control message (``{"type": ..., ...}``)."""


# --- frames -------------------------------------------------------------------------------


def encode_data(stream: int, channel: str, payload: bytes) -> bytes:
    """A data frame. The payload must be 1 to ``MAX_PAYLOAD`` bytes."""
    return HEADER.pack((FRAME_VERSION << 4) | KIND_DATA, stream, CHANNELS.index(channel)) + payload


def encode_window(stream: int, credit: int) -> bytes:
    """A window frame granting ``credit`` bytes on ``stream``."""
    return HEADER.pack((FRAME_VERSION << 4) | KIND_WINDOW, stream, 0) + CREDIT.pack(credit)


def encode_control(message: Message) -> bytes:
    """A control frame holding ``message`` as compact JSON."""
    payload = json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode()
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(
            f"the {message.get('op') or message.get('type')} request is {len(payload)} bytes "
            f"of JSON, over the protocol's {MAX_PAYLOAD}-byte limit; send less per request"
        )
    return HEADER.pack((FRAME_VERSION << 4) | KIND_CONTROL, 0, 0) + payload


@dataclass(frozen=True)
class Frame:
    """A decoded frame: ``kind`` is data, window or control."""

    kind: int
    stream: int
    channel: str
    payload: bytes


def decode_frame(buf: bytes) -> Frame:
    """Checks a frame in the order of section 5 and decodes its header.

    Raises :class:`ProtocolError` naming the first rule broken.
    """
    if len(buf) < HEADER_LEN:
        raise ProtocolError(f"frame truncated: {len(buf)} bytes, a header is {HEADER_LEN}")
    if len(buf) - HEADER_LEN > MAX_PAYLOAD:
        raise ProtocolError(f"frame too large: {len(buf) - HEADER_LEN} payload bytes")
    first, stream, channel = HEADER.unpack_from(buf)
    if first >> 4 != FRAME_VERSION:
        raise ProtocolError(f"unsupported frame version {first >> 4}")
    kind = first & 0x0F
    if kind not in (KIND_DATA, KIND_WINDOW, KIND_CONTROL):
        raise ProtocolError(f"unknown frame kind {kind}")
    if channel > 2:
        raise ProtocolError(f"unknown channel {channel}")
    payload = buf[HEADER_LEN:]
    if kind != KIND_CONTROL and stream == 0:
        raise ProtocolError("data or window frame on stream 0")
    if kind == KIND_DATA and not payload:
        raise ProtocolError(f"empty data frame on stream {stream}")
    if kind == KIND_WINDOW:
        if len(payload) != 4 or CREDIT.unpack(payload)[0] == 0:
            raise ProtocolError(f"window frame on stream {stream} is not a credit of at least 1")
    return Frame(kind, stream, CHANNELS[channel], payload)


def decode_control(payload: bytes) -> Message:
    """Parses a control frame's payload: one JSON object with a string ``type``."""
    try:
        message = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolError(f"control message is not UTF-8 JSON: {exc}") from None
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise ProtocolError("control message is not a JSON object with a type")
    return message
