// Frame encoding against PROTOCOL.md's exact `hex` examples, and the decoder's refusals in
// the document's order. No relay needed.

import { test } from "node:test";
import assert from "node:assert/strict";
import { decodeFrame, encodeControl, encodeData, encodeWindow } from "../src/protocol/frames.js";
import { ProtocolError } from "../src/errors.js";

const hex = (s: string): Uint8Array => Uint8Array.from(s.trim().split(/\s+/).map((b) => parseInt(b, 16)));

test("data, window and control frames match PROTOCOL.md's examples byte for byte", () => {
  assert.deepEqual(encodeData(1, "out", new TextEncoder().encode("hello\n")), hex("11 00 00 00 01 01 68 65 6c 6c 6f 0a"));
  assert.deepEqual(encodeData(1, "in", new TextEncoder().encode("ls\n")), hex("11 00 00 00 01 00 6c 73 0a"));
  assert.deepEqual(encodeWindow(1, 65536), hex("12 00 00 00 01 00 00 01 00 00"));
  assert.deepEqual(encodeWindow(2, 2097152), hex("12 00 00 00 02 00 00 20 00 00"));
  assert.deepEqual(
    encodeControl({ type: "closed", stream: 1 }),
    hex("13 00 00 00 00 00 7b 22 74 79 70 65 22 3a 22 63 6c 6f 73 65 64 22 2c 22 73 74 72 65 61 6d 22 3a 31 7d"),
  );
  const hello = encodeControl({ type: "hello", protocol: 1, client: "tether-cli/0.1.0" });
  assert.equal(hello.length, 63);
});

test("decoding gives back what was encoded", () => {
  const d = decodeFrame(hex("11 00 00 00 01 01 68 65 6c 6c 6f 0a"));
  assert.equal(d.kind, "data");
  if (d.kind === "data") {
    assert.equal(d.stream, 1);
    assert.equal(d.channel, "out");
    assert.equal(new TextDecoder().decode(d.payload), "hello\n");
  }
  assert.deepEqual(decodeFrame(encodeWindow(7, 123)), { kind: "window", stream: 7, credit: 123 });
  const c = decodeFrame(encodeControl({ type: "exit", stream: 3, status: { code: 0 } }));
  assert.deepEqual(c, { kind: "control", message: { type: "exit", stream: 3, status: { code: 0 } } });
});

test("malformed frames are refused with the reason, in the document's order", () => {
  const cases: [string, RegExp][] = [
    ["11 00 00 00", /truncated/],
    ["21 00 00 00 01 01 61", /frame version 2/],
    ["14 00 00 00 01 01 61", /unknown frame kind 4/],
    ["11 00 00 00 01 03 61", /unknown channel 3/],
    ["11 00 00 00 00 01 61", /stream 0/],
    ["11 00 00 00 01 01", /empty data frame/],
    ["12 00 00 00 01 00 00 00 01", /window payload of 3 bytes/],
    ["12 00 00 00 01 00 00 00 00 00", /window of 0/],
    ["13 00 00 00 00 00 5b 5d", /not a JSON object/],
    ["13 00 00 00 00 00 ff", /not UTF-8 JSON/],
    ["13 00 00 00 00 00 7b 7d", /without a string `type`/],
  ];
  for (const [bytes, reason] of cases) {
    assert.throws(() => decodeFrame(hex(bytes)), (e: unknown) => e instanceof ProtocolError && reason.test(e.message), bytes);
  }
  const big = new Uint8Array(6 + (1 << 20) + 1);
  big[0] = 0x11;
  big[4] = 1;
  big[5] = 1;
  assert.throws(() => decodeFrame(big), /too large/);
});
