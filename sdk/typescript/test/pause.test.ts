// Pause and resume through the SDK, on real local sandboxes: a paused sandbox's processes stop
// and keep their state, a stream attached before the pause goes on after it with no gap, the
// next call through the object that paused it resumes it (unless it was created with
// `autoResume: false`: then `SandboxPausedError` until `resume()`), the idle timeout can pause,
// and another tenant can neither see nor pause it.

import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { TestRelay } from "./relay.js";
import {
  type CommandHandle,
  ConflictError,
  errorFromCode,
  NotFoundError,
  RelayClient,
  RelayConfig,
  Sandbox,
  SandboxPausedError,
  UnavailableError,
  UnsupportedError,
} from "../src/index.js";

/** A counter that prints 1, 2, 3... every 20 ms and keeps its last value in a file. */
const COUNTER = "i=0; while :; do i=$((i+1)); echo $i; echo $i > /workspace/n; sleep 0.02; done";
/** How long a frozen counter is watched for a change: it would have counted 15 in that time. */
const FROZEN_FOR_MS = 300;
/** How many round trips the relay's reaper may take to act on an idle timeout (it ticks every
 * second). */
const SETTLE_TRIES = 2000;
/** How long a running counter may take to print what a test waits for. */
const REACH_MS = 20_000;

let relay: TestRelay;

before(async () => {
  relay = await TestRelay.start();
});

after(async () => {
  await relay?.stop();
});

const numbers = (out: string): number[] =>
  out
    .split("\n")
    .filter((l) => /^\d+$/.test(l))
    .map(Number);

/** Reads `handle`'s output in the background (a read is never cut short) and wakes whoever
 * waits for a number. */
class Tally {
  out = "";
  private waiters: (() => void)[] = [];
  readonly done: Promise<void>;

  constructor(handle: CommandHandle) {
    this.done = (async () => {
      for await (const chunk of handle) {
        this.out += new TextDecoder().decode(chunk.bytes);
        for (const w of this.waiters.splice(0)) w();
      }
    })().catch(() => undefined);
  }

  get seen(): number[] {
    return numbers(this.out);
  }

  async reach(last: number): Promise<void> {
    const deadline = Date.now() + REACH_MS;
    while ((this.seen.at(-1) ?? 0) < last) {
      const left = deadline - Date.now();
      if (left <= 0) throw new Error(`the counter did not reach ${last}: ${this.out.slice(-200)}`);
      await new Promise<void>((r) => {
        const timer = setTimeout(r, left);
        this.waiters.push(() => {
          clearTimeout(timer);
          r();
        });
      });
    }
  }
}

async function fresh(options: { autoResume?: boolean; idleTimeout?: number; onIdle?: "delete" | "pause" } = {}): Promise<Sandbox> {
  return Sandbox.create({ ...relay.options, labels: { suite: "pause" }, ttl: 600, ...options });
}

describe("pause and resume", () => {
  test("a paused sandbox freezes, and a stream attached before the pause loses nothing", async () => {
    const sb = await fresh();
    try {
      assert.equal(sb.info.capabilities.pause, true);
      assert.equal(sb.info.autoResume, true);
      assert.equal(sb.info.onIdle, "delete");
      const handle = await sb.commands.start(COUNTER, { background: true });
      const tally = new Tally(handle);
      await tally.reach(5);

      const info = await sb.pause();
      assert.equal(info.state, "paused");
      // Reading the state over REST does not wake it.
      assert.equal((await sb.refresh()).state, "paused");
      assert.deepEqual((await Sandbox.list({ suite: "pause" }, relay.options)).find((s) => s.id === sb.id)?.state, "paused");

      // Frozen: nothing new on the attached stream (once the bytes in flight when it froze
      // have landed), for longer than it takes to count 15.
      await new Promise((r) => setTimeout(r, FROZEN_FOR_MS));
      const settled = tally.out.length;
      await new Promise((r) => setTimeout(r, FROZEN_FOR_MS));
      assert.equal(tally.out.length, settled, "a paused counter kept counting");

      await sb.resume();
      assert.equal(sb.info.state, "running");
      // The same stream goes on where it stopped: every number, in order, none missing.
      await tally.reach(tally.seen.at(-1)! + 20);
      const seen = tally.seen;
      assert.deepEqual(seen, Array.from({ length: seen.at(-1)! }, (_, i) => i + 1), "the stream lost or reordered output");
      assert.deepEqual(handle.dropped, []);
      await handle.kill();
      await tally.done;
    } finally {
      await sb.delete();
    }
  });

  test("a call after pause() resumes the sandbox", async () => {
    const sb = await fresh();
    try {
      await sb.files.write("/workspace/kept", "kept");
      await sb.pause();
      // The session this object holds stays open through the pause and would not wake the
      // sandbox; the object resumes it before the call.
      assert.equal((await sb.commands.run("cat /workspace/kept")).stdoutText, "kept");
      assert.equal(sb.info.state, "running");
      assert.equal((await sb.refresh()).state, "running");
    } finally {
      await sb.delete();
    }
  });

  test("a stopped sandbox keeps its files, and the next call starts it without its old processes", async () => {
    const sb = await fresh();
    try {
      assert.equal(sb.info.capabilities.stop, true);
      await sb.files.write("/workspace/kept", "kept");
      await sb.commands.run("sleep 1000 >/dev/null 2>&1 & echo $! > /workspace/pid");
      assert.equal((await sb.stop()).state, "stopped");
      assert.equal((await sb.refresh()).state, "stopped");
      await assert.rejects(sb.stop(), (e: unknown) => e instanceof ConflictError);
      const out = await sb.commands.run("cat /workspace/kept; kill -0 $(cat /workspace/pid) || echo ended");
      assert.equal(out.stdoutText, "keptended\n");
      assert.equal((await sb.refresh()).state, "running");
      await assert.rejects(sb.start(), (e: unknown) => e instanceof ConflictError);
      await sb.stop();
      assert.equal((await sb.start()).state, "running");
    } finally {
      await sb.delete();
    }
  });

  test("pausing twice is SandboxPausedError; resuming what runs is ConflictError", async () => {
    const sb = await fresh();
    try {
      await sb.pause();
      await assert.rejects(sb.pause(), (e: unknown) => e instanceof SandboxPausedError && e.code === "conflict");
      await sb.resume();
      await assert.rejects(sb.resume(), (e: unknown) => e instanceof ConflictError && !(e instanceof SandboxPausedError));
      assert.equal((await sb.commands.run("true")).exitCode, 0);
    } finally {
      await sb.delete();
    }
  });

  test("without autoResume a paused sandbox stays paused until resume()", async () => {
    const sb = await fresh({ autoResume: false });
    const other = await Sandbox.connect(sb.id, relay.options);
    try {
      assert.equal(sb.info.autoResume, false);
      await sb.files.write("/workspace/kept", "kept");
      await sb.pause();
      await assert.rejects(sb.commands.run("true"), (e: unknown) => e instanceof SandboxPausedError && /resume\(\)/.test(e.message));
      // Another client, on a session of its own, is refused by the relay itself.
      await assert.rejects(other.files.readText("/workspace/kept"), SandboxPausedError);
      assert.equal((await sb.refresh()).state, "paused");
      await sb.resume();
      assert.equal(await other.files.readText("/workspace/kept"), "kept");
      assert.equal((await sb.commands.run("cat /workspace/kept")).stdoutText, "kept");
    } finally {
      await other.close();
      await sb.delete();
    }
  });

  test("a sandbox resumed elsewhere is not resumed again", async () => {
    const sb = await fresh();
    try {
      await sb.pause();
      await (await Sandbox.connect(sb.id, relay.options)).resume();
      assert.equal((await sb.commands.run("echo on")).stdoutText, "on\n");
    } finally {
      await sb.delete();
    }
  });

  test("the idle timeout can pause, and the next call resumes", async () => {
    const sb = await fresh({ idleTimeout: 1, onIdle: "pause" });
    try {
      assert.equal(sb.info.onIdle, "pause");
      await sb.files.write("/workspace/kept", "kept");
      await sb.close(); // idle means no session open
      for (let i = 0; (await sb.refresh()).state !== "paused"; i++) {
        assert.ok(i < SETTLE_TRIES, "the idle sandbox was not paused");
        await Sandbox.list({}, relay.options); // paces the loop on a round trip, not a sleep
      }
      // Paused by the relay, not this object: the new session resumes it (auto-resume).
      assert.equal(await sb.files.readText("/workspace/kept"), "kept");
      assert.equal((await sb.refresh()).state, "running");
    } finally {
      await sb.delete();
    }
  });

  test("another tenant can neither pause nor resume a sandbox", async () => {
    const sb = await fresh();
    try {
      const admin = new RelayClient(new RelayConfig(relay.url, relay.adminToken));
      const intruder = new RelayClient(new RelayConfig(relay.url, await admin.createToken("intruder")));
      await assert.rejects(Sandbox.connect(sb.id, { relay: relay.url, token: intruder.config.token }), NotFoundError);
      for (const call of [() => intruder.pause(sb.id), () => intruder.resume(sb.id)]) {
        await assert.rejects(call(), (e: unknown) => e instanceof NotFoundError && !/paused/.test(e.message));
      }
      assert.equal((await sb.refresh()).state, "running");
    } finally {
      await sb.delete();
    }
  });

  test("the relay's conflict and unsupported codes map to their classes", () => {
    // The local provider pauses, so a 501 `unsupported` is mapped here from its wire form.
    assert.ok(errorFromCode("unsupported", "provider `e2b` cannot pause") instanceof UnsupportedError);
    assert.ok(errorFromCode("conflict", "x") instanceof ConflictError);
    assert.ok(errorFromCode("provider_error", "x") instanceof UnavailableError);
  });
});
