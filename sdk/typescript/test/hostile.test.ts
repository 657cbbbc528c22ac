// The protocol module against a fake agent that misbehaves: it must never trust what comes
// back. Data beyond the credit granted, data for streams never opened, text messages,
// malformed frames and refused handshakes each end in a clear error (or are dropped), never
// in unbounded buffering or a hang.

import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import type { AddressInfo } from "node:net";
import { WebSocketServer, type WebSocket } from "ws";
import { Connection, PermissionDeniedError, ProtocolError, ConnectionLostError } from "../src/index.js";
import { decodeFrame, encodeControl, encodeData, type Message } from "../src/protocol/frames.js";

type Behaviour = (ws: WebSocket, open: Message) => void;
let server: WebSocketServer;
let url: string;
let behaviour: Behaviour = () => undefined;
let handshake: (ws: WebSocket) => void;

const welcome = (ws: WebSocket): void =>
  ws.send(encodeControl({ type: "welcome", protocol: 1, agent_version: "fake", capabilities: ["exec", "files"] }));

before(async () => {
  server = new WebSocketServer({ host: "127.0.0.1", port: 0 });
  server.on("connection", (ws) => {
    ws.on("message", (raw: Buffer) => {
      const frame = decodeFrame(new Uint8Array(raw));
      if (frame.kind !== "control") return;
      if (frame.message.type === "hello") handshake(ws);
      else if (frame.message.type === "open") behaviour(ws, frame.message);
    });
  });
  await new Promise<void>((r) => server.once("listening", () => r()));
  url = `ws://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

after(
  () =>
    new Promise<void>((r) => {
      for (const client of server.clients) client.terminate();
      server.close(() => r());
    }),
);

test("a refused handshake is a typed error", async () => {
  handshake = (ws) => ws.send(encodeControl({ type: "error", code: "unauthorized", message: "wrong token" }));
  await assert.rejects(Connection.open({ url, token: "x" }), (e: unknown) => e instanceof PermissionDeniedError && /wrong token/.test(e.message));
});

test("data beyond the granted credit fails the stream; junk around it is ignored", async () => {
  handshake = welcome;
  behaviour = (ws, open) => {
    const stream = open["stream"] as number;
    ws.send("a text message is not part of the protocol");
    ws.send(new Uint8Array([0x11, 0, 0])); // truncated frame
    ws.send(encodeData(999, "out", new Uint8Array([1]))); // a stream never opened
    ws.send(encodeControl({ type: "started", stream, process: 1, pid: 2, offsets: [0, 0] }));
    ws.send(encodeData(stream, "out", new Uint8Array(600))); // the window is 1,024
    ws.send(encodeData(stream, "out", new Uint8Array(600)));
  };
  const conn = await Connection.open({ url });
  assert.deepEqual([...conn.capabilities], ["exec", "files"]);
  const stream = await conn.openStream("exec", { command: { argv: ["x"] } }, 1024);
  const started = await stream.next();
  assert.equal(started?.kind === "message" && started.message.type, "started");
  const first = await stream.next();
  assert.equal(first?.kind === "data" && first.bytes.length, 600);
  await assert.rejects(stream.next(), (e: unknown) => e instanceof ProtocolError && /600 bytes on stream 1 with 424 bytes of credit/.test(e.message));
  conn.close();
});

test("data on `in` from the agent fails the stream", async () => {
  handshake = welcome;
  behaviour = (ws, open) => ws.send(encodeData(open["stream"] as number, "in", new Uint8Array([1])));
  const conn = await Connection.open({ url });
  const stream = await conn.openStream("read", { path: "x" });
  await assert.rejects(stream.next(), (e: unknown) => e instanceof ProtocolError && /on `in`/.test(e.message));
  conn.close();
});

test("an agent that goes away ends every open stream with ConnectionLostError", async () => {
  handshake = welcome;
  behaviour = (ws) => ws.terminate();
  const conn = await Connection.open({ url });
  const stream = await conn.openStream("read", { path: "x" });
  await assert.rejects(stream.next(), ConnectionLostError);
  assert.equal(conn.isClosed, true);
  await assert.rejects(conn.openStream("read", { path: "y" }), ConnectionLostError);
});

test("credit is returned as the consumer reads, half a window at a time", async () => {
  handshake = welcome;
  const grants: number[] = [];
  behaviour = (ws, open) => {
    const stream = open["stream"] as number;
    // A well-behaved agent: a window's worth, then more only as credit comes back.
    let credit = 1024;
    let sent = 0;
    const pump = (): void => {
      while (credit >= 256 && sent < 4096) {
        ws.send(encodeData(stream, "out", new Uint8Array(256)));
        credit -= 256;
        sent += 256;
      }
      if (sent === 4096) {
        ws.send(encodeControl({ type: "eof", stream, channel: "out" }));
        ws.send(encodeControl({ type: "closed", stream }));
      }
    };
    ws.on("message", (raw: Buffer) => {
      const f = decodeFrame(new Uint8Array(raw));
      if (f.kind === "window") {
        grants.push(f.credit);
        credit += f.credit;
        pump();
      }
    });
    pump();
  };
  const conn = await Connection.open({ url });
  const stream = await conn.openStream("read", { path: "x" }, 1024);
  let bytes = 0;
  for (;;) {
    const item = await stream.next();
    if (item === null) break;
    if (item.kind === "data") bytes += item.bytes.length;
  }
  assert.equal(bytes, 4096);
  // Each grant returns half the window, once the consumer took it.
  assert.ok(grants.length >= 6, `grants ${grants.join(",")}`);
  assert.ok(grants.every((g) => g === 512));
  conn.close();
});

test("an agent flooding unread messages (not flow-controlled) fails that stream, not our memory", async () => {
  handshake = welcome;
  behaviour = (ws, open) => {
    const stream = open["stream"] as number;
    if (open["op"] === "watch") {
      ws.send(encodeControl({ type: "reply", stream, reply: "ok" }));
      const path = "x".repeat(1_000_000);
      for (let i = 0; i < 40; i++) ws.send(encodeControl({ type: "event", stream, kind: "modify", path }));
    } else {
      ws.send(encodeControl({ type: "reply", stream, reply: "ok" }));
      ws.send(encodeControl({ type: "closed", stream }));
    }
  };
  const conn = await Connection.open({ url });
  const watch = await conn.openStream("watch", { path: "." });
  // One WebSocket keeps order: once this later stream is answered, the flood has arrived.
  const probe = await conn.openStream("ports");
  while ((await probe.next()) !== null);
  let events = 0;
  await assert.rejects(
    (async () => {
      for (;;) {
        const item = await watch.next();
        if (item === null) break;
        if (item.kind === "message" && item.message.type === "event") events += 1;
      }
    })(),
    (e: unknown) => e instanceof ProtocolError && /unread messages/.test(e.message),
  );
  assert.ok(events > 0 && events < 20, `${events} events queued before the stream failed`);
  conn.close();
});
