// The REST client's retry policy against a loopback HTTP server that answers as a struggling
// relay would: 429 and 503 are retried (honouring Retry-After), a create without
// get-or-create is not retried after a 500, and other errors carry the relay's message.

import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { InvalidArgumentError, RelayClient, RelayConfig, UnavailableError } from "../src/index.js";

let server: Server;
let url: string;
/** What the server answers next, per path; the last entry repeats. */
const script = new Map<string, { status: number; body: unknown; headers?: Record<string, string> }[]>();
const hits = new Map<string, number>();

const sandbox = { id: "sb-1", provider: "local", provider_ref: "sb-1", state: "running", labels: {}, created_ms: 1, last_active_ms: 1, created: true };

before(async () => {
  server = createServer((req, res) => {
    const key = `${req.method} ${req.url}`;
    const n = hits.get(key) ?? 0;
    hits.set(key, n + 1);
    const answers = script.get(key) ?? [{ status: 404, body: { error: { code: "not_found", message: `no ${key}` } } }];
    const answer = answers[Math.min(n, answers.length - 1)]!;
    res.writeHead(answer.status, { "content-type": "application/json", ...answer.headers });
    res.end(JSON.stringify(answer.body));
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

after(() => new Promise<void>((r) => server.close(() => r())));

const client = (): RelayClient => new RelayClient(RelayConfig.resolve({ relay: url, token: "t" }));
const busy = { error: { code: "unavailable", message: "short of file descriptors" } };

test("429 and 503 are retried until the relay answers", async () => {
  script.set("GET /v1/sandboxes/sb-1", [
    { status: 503, body: busy, headers: { "retry-after": "0" } },
    { status: 429, body: busy, headers: { "retry-after": "0" } },
    { status: 200, body: sandbox },
  ]);
  const info = await client().get("sb-1");
  assert.equal(info.id, "sb-1");
  assert.equal(hits.get("GET /v1/sandboxes/sb-1"), 3);
});

test("a relay that stays unavailable gives up with the relay's message", async () => {
  script.set("GET /v1/sandboxes/sb-2", [{ status: 503, body: busy, headers: { "retry-after": "0" } }]);
  await assert.rejects(client().get("sb-2"), (e: unknown) => e instanceof UnavailableError && /short of file descriptors/.test(e.message));
  assert.equal(hits.get("GET /v1/sandboxes/sb-2"), 5);
});

test("a plain create is not repeated after a 500 (it may have happened); get-or-create is", async () => {
  script.set("POST /v1/sandboxes", [
    { status: 500, body: { error: { code: "internal", message: "boom" } } },
    { status: 201, body: sandbox },
  ]);
  await assert.rejects(client().create({}), /boom/);
  assert.equal(hits.get("POST /v1/sandboxes"), 1);
  hits.delete("POST /v1/sandboxes");
  const info = await client().create({ labels: { a: "b" }, get_or_create: true });
  assert.equal(info.id, "sb-1");
  assert.equal(hits.get("POST /v1/sandboxes"), 2);
});

test("a 400 is not retried and names the problem", async () => {
  script.set("POST /v1/sandboxes/sb-1/renew", [{ status: 400, body: { error: { code: "invalid_argument", message: "unknown field ttl" } } }]);
  await assert.rejects(client().renew("sb-1", 5), (e: unknown) => e instanceof InvalidArgumentError && e.message === "unknown field ttl");
  assert.equal(hits.get("POST /v1/sandboxes/sb-1/renew"), 1);
});

test("a relay that is not there is a clear error", async () => {
  const dead = new RelayClient(RelayConfig.resolve({ relay: "http://127.0.0.1:9", token: "t" }));
  await assert.rejects(dead.get("sb-1"), (e: unknown) => e instanceof UnavailableError && /cannot reach the relay.*tether serve/.test(e.message));
});
