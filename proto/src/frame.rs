//! Binary framing of every WebSocket message.
//!
//! ```text
//!  byte 0          bytes 1..5        byte 5    bytes 6..
//! +---------------+-----------------+---------+----------------
//! | ver<<4 | kind | stream id (BE)  | channel | payload
//! +---------------+-----------------+---------+----------------
//! ```
//!
//! Data frames carry raw bytes, window frames a 4-byte credit increment, control frames one
//! JSON-encoded [`Control`] message. Decoding happens in two phases, as in mini-redis: a cheap
//! header check ([`Frame::check`]) that allocates nothing, then the parse, which for data frames
//! slices the received buffer instead of copying it.

use bytes::{BufMut, Bytes, BytesMut};

use crate::control::Control;
use crate::error::ProtoError;
use crate::ids::{Channel, StreamId};
use crate::limits::{FRAME_VERSION, HEADER_LEN, MAX_PAYLOAD};

/// The kind of a frame, in the low nibble of its first byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    /// Raw stream bytes.
    Data = 1,
    /// Flow-control credit for one direction of a stream.
    Window = 2,
    /// A JSON control message.
    Control = 3,
}

/// One decoded frame.
#[derive(Clone, Debug, PartialEq)]
pub enum Frame {
    /// Bytes of `stream` on `channel`. Never empty: end of data is a [`Control::Eof`].
    Data {
        /// The stream the bytes belong to.
        stream: StreamId,
        /// Which byte stream of it.
        channel: Channel,
        /// The bytes, shared with the receive buffer.
        payload: Bytes,
    },
    /// The receiver of `stream`'s data grants the sender `credit` more bytes.
    Window {
        /// The stream whose sender may send more.
        stream: StreamId,
        /// Bytes of additional credit, at least 1.
        credit: u32,
    },
    /// A control message.
    Control(Control),
}

/// The parsed fixed header of a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// What the payload is.
    pub kind: FrameKind,
    /// The stream, 0 for control frames.
    pub stream: StreamId,
    /// The channel, 0 for window and control frames.
    pub channel: Channel,
}

impl Frame {
    /// Phase one: validates the header and size of `buf` without allocating.
    pub fn check(buf: &[u8]) -> Result<Header, ProtoError> {
        if buf.len() < HEADER_LEN {
            return Err(ProtoError::Truncated(buf.len()));
        }
        let payload = buf.len() - HEADER_LEN;
        if payload > MAX_PAYLOAD {
            return Err(ProtoError::TooLarge(payload));
        }
        let version = buf[0] >> 4;
        if version != FRAME_VERSION {
            return Err(ProtoError::WrongVersion(version));
        }
        let kind = match buf[0] & 0x0f {
            1 => FrameKind::Data,
            2 => FrameKind::Window,
            3 => FrameKind::Control,
            k => return Err(ProtoError::UnknownKind(k)),
        };
        let stream = StreamId(u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]));
        let channel = Channel::from_u8(buf[5]).ok_or(ProtoError::UnknownChannel(buf[5]))?;
        if kind != FrameKind::Control && stream == StreamId::CONNECTION {
            return Err(ProtoError::ZeroStream);
        }
        Ok(Header {
            kind,
            stream,
            channel,
        })
    }

    /// Phase two: decodes a whole WebSocket binary message. Data payloads share `buf`.
    pub fn decode(buf: Bytes) -> Result<Frame, ProtoError> {
        let header = Frame::check(&buf)?;
        let payload = buf.slice(HEADER_LEN..);
        match header.kind {
            FrameKind::Data => {
                if payload.is_empty() {
                    return Err(ProtoError::BadControl(
                        "data frame with empty payload (use an eof message)".into(),
                    ));
                }
                Ok(Frame::Data {
                    stream: header.stream,
                    channel: header.channel,
                    payload,
                })
            }
            FrameKind::Window => {
                let bytes: [u8; 4] = payload[..]
                    .try_into()
                    .map_err(|_| ProtoError::BadWindow("payload must be exactly 4 bytes"))?;
                let credit = u32::from_be_bytes(bytes);
                if credit == 0 {
                    return Err(ProtoError::BadWindow("credit must be at least 1"));
                }
                Ok(Frame::Window {
                    stream: header.stream,
                    credit,
                })
            }
            FrameKind::Control => serde_json::from_slice(&payload)
                .map(Frame::Control)
                .map_err(|e| ProtoError::BadControl(e.to_string())),
        }
    }

    /// Encodes the frame into one WebSocket binary message.
    pub fn encode(&self) -> Bytes {
        match self {
            Frame::Data {
                stream,
                channel,
                payload,
            } => encode_data(*stream, *channel, payload),
            Frame::Window { stream, credit } => encode_window(*stream, *credit),
            Frame::Control(msg) => encode_control(msg),
        }
    }
}

fn header(buf: &mut BytesMut, kind: FrameKind, stream: StreamId, channel: Channel) {
    buf.put_u8((FRAME_VERSION << 4) | kind as u8);
    buf.put_u32(stream.0);
    buf.put_u8(channel as u8);
}

/// Encodes a data frame. The hot path: one allocation, one copy of the payload.
pub fn encode_data(stream: StreamId, channel: Channel, payload: &[u8]) -> Bytes {
    let mut buf = BytesMut::with_capacity(HEADER_LEN + payload.len());
    header(&mut buf, FrameKind::Data, stream, channel);
    buf.put_slice(payload);
    buf.freeze()
}

/// A data frame's header alone, for a sender that sends the payload's pieces beside it
/// without copying them (a writer that gathers, `writev`).
pub fn data_header(stream: StreamId, channel: Channel) -> Bytes {
    let mut buf = BytesMut::with_capacity(HEADER_LEN);
    header(&mut buf, FrameKind::Data, stream, channel);
    buf.freeze()
}

/// A buffer for one data frame of up to `payload` bytes: the header's room, zeroed, and
/// capacity for the payload after it. Read the payload into it (append), then seal it with
/// [`finish_data_in_place`]: the bytes are never copied on their way to the socket.
pub fn data_buffer(payload: usize) -> BytesMut {
    let mut buf = BytesMut::with_capacity(HEADER_LEN + payload);
    buf.put_bytes(0, HEADER_LEN);
    buf
}

/// Encodes a data frame whose payload was read into `buf[HEADER_LEN..]` in place,
/// so a sender can read from a file descriptor straight into the frame it sends.
pub fn finish_data_in_place(mut buf: BytesMut, stream: StreamId, channel: Channel) -> Bytes {
    debug_assert!(buf.len() > HEADER_LEN);
    buf[0] = (FRAME_VERSION << 4) | FrameKind::Data as u8;
    buf[1..5].copy_from_slice(&stream.0.to_be_bytes());
    buf[5] = channel as u8;
    buf.freeze()
}

/// Encodes a window frame granting `credit` bytes on `stream`.
pub fn encode_window(stream: StreamId, credit: u32) -> Bytes {
    let mut buf = BytesMut::with_capacity(HEADER_LEN + 4);
    header(&mut buf, FrameKind::Window, stream, Channel::In);
    buf.put_u32(credit);
    buf.freeze()
}

/// Encodes a control frame.
pub fn encode_control(msg: &Control) -> Bytes {
    let mut buf = BytesMut::with_capacity(HEADER_LEN + 128);
    header(
        &mut buf,
        FrameKind::Control,
        StreamId::CONNECTION,
        Channel::In,
    );
    let mut w = buf.writer();
    // Serialising a Control cannot fail: every field is a plain serde type with string keys.
    serde_json::to_writer(&mut w, msg).expect("control messages always serialise");
    w.into_inner().freeze()
}
