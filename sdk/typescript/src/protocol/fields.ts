//! Reading fields of the agent's messages without trusting them: every getter checks the
//! type (and, for numbers, that it is a non-negative safe integer where one is expected) and
//! throws a `ProtocolError` naming the message and field otherwise.

import { ProtocolError, errorFromCode, TetherError } from "../errors.js";
import type { Message } from "./frames.js";
import type { Stream } from "./connection.js";

function bad(message: Message, name: string, want: string): ProtocolError {
  return new ProtocolError(`the agent's \`${message.type}\` has a malformed \`${name}\` (want ${want})`);
}

/** A required non-negative integer (u32/u64 offsets, sizes, ids). */
export function uint(message: Record<string, unknown> & { type?: string }, name: string): number {
  const v = message[name];
  if (typeof v !== "number" || !Number.isSafeInteger(v) || v < 0) throw bad(message as Message, name, "an unsigned integer");
  return v;
}

/** A required integer (exit codes, signals). */
export function int(message: Record<string, unknown> & { type?: string }, name: string): number {
  const v = message[name];
  if (typeof v !== "number" || !Number.isSafeInteger(v)) throw bad(message as Message, name, "an integer");
  return v;
}

/** A required string. */
export function str(message: Record<string, unknown> & { type?: string }, name: string): string {
  const v = message[name];
  if (typeof v !== "string") throw bad(message as Message, name, "a string");
  return v;
}

/** An optional string. */
export function optStr(message: Record<string, unknown>, name: string): string | undefined {
  const v = message[name];
  return typeof v === "string" ? v : undefined;
}

/** An optional boolean, `false` when absent. */
export function flag(message: Record<string, unknown>, name: string): boolean {
  return message[name] === true;
}

/** A required array of objects. */
export function objects(message: Record<string, unknown> & { type?: string }, name: string): Record<string, unknown>[] {
  const v = message[name];
  if (!Array.isArray(v) || !v.every((x) => typeof x === "object" && x !== null && !Array.isArray(x))) {
    throw bad(message as Message, name, "an array of objects");
  }
  return v as Record<string, unknown>[];
}

/** The error an `error` message carries. */
export function streamError(message: Message): TetherError {
  const code = typeof message["code"] === "string" ? message["code"] : "internal";
  const text = typeof message["message"] === "string" ? message["message"].slice(0, 4000) : code;
  return errorFromCode(code, text);
}

/** Reads a request/response stream until its `reply` of `kind` (and `closed`); throws the
 * stream's error if it failed. */
export async function expectReply(stream: Stream, kind: string): Promise<Message> {
  let reply: Message | undefined;
  for (;;) {
    const item = await stream.next();
    if (item === null) break;
    if (item.kind === "data") throw new ProtocolError(`unexpected data on a \`${kind}\` stream`);
    const m = item.message;
    if (m.type === "error") throw streamError(m);
    if (m.type === "reply" && reply === undefined) {
      if (m["reply"] !== kind) throw new ProtocolError(`expected a \`${kind}\` reply, got \`${String(m["reply"])}\``);
      reply = m;
      // Callers need only the reply; `closed` follows and ends the stream on its own.
      return reply;
    }
  }
  throw new ProtocolError(`the stream closed without a \`${kind}\` reply`);
}
