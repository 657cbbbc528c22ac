//! Frame encoding and decoding (PROTOCOL.md section 5): the 6-byte header, data, window and
//! control frames. Decoding checks in the document's order and names the first failure; it
//! copies nothing (a data payload is a view of the received message).

import { HEADER_LEN, MAX_PAYLOAD } from "../constants.js";
import { ProtocolError } from "../errors.js";

/** A channel by name, as JSON messages write it. */
export type Channel = "in" | "out" | "err";
const CHANNELS: readonly Channel[] = ["in", "out", "err"];

/** A control message: a JSON object with a `type`. Fields are checked where they are used. */
export type Message = { readonly type: string } & Readonly<Record<string, unknown>>;

/** A decoded frame. */
export type Frame =
  | { kind: "data"; stream: number; channel: Channel; payload: Uint8Array }
  | { kind: "window"; stream: number; credit: number }
  | { kind: "control"; message: Message };

/** High nibble of byte 0: frame version 1. */
const FRAME_VERSION_BYTE = 0x10;

/** Low nibble of byte 0. */
const enum Kind {
  Data = 1,
  Window = 2,
  Control = 3,
}

const encoder = new TextEncoder();
const decoder = new TextDecoder("utf-8", { fatal: true });

function header(kind: Kind, stream: number, channel: number, payloadLen: number): Uint8Array {
  const frame = new Uint8Array(HEADER_LEN + payloadLen);
  const view = new DataView(frame.buffer);
  view.setUint8(0, FRAME_VERSION_BYTE | kind);
  view.setUint32(1, stream);
  view.setUint8(5, channel);
  return frame;
}

/** A data frame carrying `payload` (1 byte to `MAX_PAYLOAD`) on a stream's channel. */
export function encodeData(stream: number, channel: Channel, payload: Uint8Array): Uint8Array {
  if (payload.length === 0 || payload.length > MAX_PAYLOAD) {
    throw new RangeError(`a data payload holds 1 to ${MAX_PAYLOAD} bytes, not ${payload.length}`);
  }
  const frame = header(Kind.Data, stream, CHANNELS.indexOf(channel), payload.length);
  frame.set(payload, HEADER_LEN);
  return frame;
}

/** A window frame granting `credit` (at least 1) more bytes on a stream. */
export function encodeWindow(stream: number, credit: number): Uint8Array {
  const frame = header(Kind.Window, stream, 0, 4);
  new DataView(frame.buffer).setUint32(HEADER_LEN, credit);
  return frame;
}

/** A control frame holding one JSON message. */
export function encodeControl(message: Record<string, unknown>): Uint8Array {
  const json = encoder.encode(JSON.stringify(message));
  if (json.length > MAX_PAYLOAD) {
    throw new RangeError(`a control message is at most ${MAX_PAYLOAD} bytes of JSON, not ${json.length}`);
  }
  const frame = header(Kind.Control, 0, 0, json.length);
  frame.set(json, HEADER_LEN);
  return frame;
}

/** Decodes one WebSocket message as a frame, or throws a `ProtocolError` naming why not. */
export function decodeFrame(buf: Uint8Array): Frame {
  if (buf.length < HEADER_LEN) throw new ProtocolError(`truncated frame of ${buf.length} bytes`);
  const payload = buf.subarray(HEADER_LEN);
  if (payload.length > MAX_PAYLOAD) {
    throw new ProtocolError(`frame too large: ${payload.length} payload bytes`);
  }
  const view = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
  const first = view.getUint8(0);
  if (first >> 4 !== FRAME_VERSION_BYTE >> 4) {
    throw new ProtocolError(`unsupported frame version ${first >> 4}`);
  }
  const kind = first & 0x0f;
  if (kind !== Kind.Data && kind !== Kind.Window && kind !== Kind.Control) {
    throw new ProtocolError(`unknown frame kind ${kind}`);
  }
  const channelByte = view.getUint8(5);
  const channel = CHANNELS[channelByte];
  if (channel === undefined) throw new ProtocolError(`unknown channel ${channelByte}`);
  const stream = view.getUint32(1);
  if (kind === Kind.Control) return { kind: "control", message: decodeControl(payload) };
  if (stream === 0) throw new ProtocolError("data or window frame on stream 0");
  if (kind === Kind.Data) {
    if (payload.length === 0) throw new ProtocolError(`empty data frame on stream ${stream}`);
    return { kind: "data", stream, channel, payload };
  }
  if (payload.length !== 4) throw new ProtocolError(`window payload of ${payload.length} bytes, not 4`);
  const credit = view.getUint32(HEADER_LEN);
  if (credit === 0) throw new ProtocolError(`window of 0 on stream ${stream}`);
  return { kind: "window", stream, credit };
}

function decodeControl(payload: Uint8Array): Message {
  let value: unknown;
  try {
    value = JSON.parse(decoder.decode(payload));
  } catch (e) {
    throw new ProtocolError(`control payload is not UTF-8 JSON: ${(e as Error).message}`);
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw new ProtocolError("control payload is not a JSON object");
  }
  const type = (value as Record<string, unknown>)["type"];
  if (typeof type !== "string") throw new ProtocolError("control message without a string `type`");
  return value as Message;
}
