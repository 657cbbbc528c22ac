// The SDK on a platform with a standard `WebSocket` (Node's undici, behind a flag on Node 20;
// Node 22, Deno and Bun have it by default): a child process drives a real relay with it.

import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { TestRelay } from "./relay.js";

let relay: TestRelay;
before(async () => {
  relay = await TestRelay.start();
});
after(async () => {
  await relay?.stop();
});

test("exec and files work over the platform's standard WebSocket", async () => {
  const script = fileURLToPath(new URL("./standard-client.js", import.meta.url));
  const flags = typeof (globalThis as { WebSocket?: unknown }).WebSocket === "function" ? [] : ["--experimental-websocket"];
  const { stdout } = await promisify(execFile)(process.execPath, [...flags, "--no-warnings", script, relay.url, relay.adminToken], { timeout: 60_000 });
  const seen = JSON.parse(stdout.trim().split("\n").pop()!) as Record<string, unknown>;
  assert.equal(seen["standard"], true);
  assert.equal(seen["runSha"], seen["remote"]);
  assert.equal(seen["fileSha"], seen["remote"]);
  assert.equal(seen["stderr"], "err\n");
  assert.equal(seen["exitCode"], 4);
});
