// The SDK against a real relay and local sandboxes: exec, timeouts, output caps, 10 MB of
// binary output byte-exact, background processes re-attached after a dropped connection,
// replay gaps, PTY, files (batch, tar, glob, grep, edit, watch), preview URLs, errors.

import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { TestRelay } from "./relay.js";
import {
  AlreadyExistsError,
  ConfigurationError,
  InvalidArgumentError,
  NotFoundError,
  PathKindError,
  PermissionDeniedError,
  Sandbox,
  type OutputChunk,
} from "../src/index.js";

let relay: TestRelay;
let sandbox: Sandbox;

before(async () => {
  relay = await TestRelay.start();
  sandbox = await Sandbox.create({ ...relay.options, labels: { suite: "sandbox" } });
});

after(async () => {
  await sandbox?.delete();
  await relay?.stop();
});

const text = (b: Uint8Array): string => new TextDecoder().decode(b);
const sha256 = (b: Uint8Array): string => createHash("sha256").update(b).digest("hex");

/** Waits for `check` to hold, asking at most `tries` times (each try is a round trip). */
async function until<T>(what: string, tries: number, check: () => Promise<T | undefined>): Promise<T> {
  for (let i = 0; i < tries; i++) {
    const v = await check();
    if (v !== undefined) return v;
    await new Promise((r) => setImmediate(r));
  }
  throw new Error(`${what} did not happen in ${tries} tries`);
}

describe("lifecycle", () => {
  test("get-or-create by labels returns the same sandbox; list filters by labels", async () => {
    const labels = { thread: `t-${Date.now()}` };
    const a = await Sandbox.getOrCreate({ ...relay.options, labels });
    const b = await Sandbox.getOrCreate({ ...relay.options, labels });
    assert.equal(a.info.created, true);
    assert.equal(b.info.created, false);
    assert.equal(a.id, b.id);
    const listed = await Sandbox.list(labels, relay.options);
    assert.deepEqual(listed.map((s) => s.id), [a.id]);
    const c = await Sandbox.connect(a.id, relay.options);
    assert.equal((await c.commands.run("echo same")).stdoutText, "same\n");
    const d = await Sandbox.connect(a.id, relay.options);
    await a.delete();
    assert.deepEqual(await Sandbox.list(labels, relay.options), []);
    // A session to a deleted sandbox is refused at the upgrade, with the relay's reason.
    await assert.rejects(d.commands.run("true"), (e: unknown) => e instanceof NotFoundError || (e as { code?: string }).code === "gone");
    await assert.rejects(Sandbox.connect(a.id, relay.options), (e: unknown) => e instanceof NotFoundError || (e as { code?: string }).code === "gone");
  });

  test("bad tokens, unknown sandboxes and missing configuration are typed errors", async () => {
    await assert.rejects(Sandbox.connect(sandbox.id, { relay: relay.url, token: "wrong" }), (e: unknown) => e instanceof PermissionDeniedError && e.code === "unauthorized");
    await assert.rejects(Sandbox.connect("sb-doesnotexist", relay.options), NotFoundError);
    const saved = process.env["TETHER_TOKEN"];
    delete process.env["TETHER_TOKEN"];
    try {
      await assert.rejects(Sandbox.create({ relay: relay.url }), (e: unknown) => e instanceof ConfigurationError && /TETHER_TOKEN/.test(e.message));
    } finally {
      if (saved !== undefined) process.env["TETHER_TOKEN"] = saved;
    }
    await assert.rejects(Sandbox.create({ ...relay.options, memoryBytes: 1 }), (e: unknown) => e instanceof InvalidArgumentError && /memory/.test(e.message));
  });

  test("renew extends the TTL; agentInfo describes the sandbox", async () => {
    const info = await sandbox.renew(3600);
    assert.ok(info.expiresMs !== undefined && info.expiresMs > Date.now() + 3_500_000);
    const agent = await sandbox.agentInfo();
    assert.equal(agent.cwd, "/workspace");
    assert.ok(agent.cpus >= 1);
  });
});

describe("commands", () => {
  test("run: stdout and stderr apart, exit code, stdin, env and cwd", async () => {
    const r = await sandbox.commands.run("printf out; printf err >&2; exit 3");
    assert.equal(r.stdoutText, "out");
    assert.equal(r.stderrText, "err");
    assert.equal(r.exitCode, 3);
    assert.equal(r.timedOut, false);
    const piped = await sandbox.commands.run(["wc", "-c"], { stdin: "x".repeat(100_000) });
    assert.equal(piped.stdoutText.trim(), "100000");
    const env = await sandbox.commands.run('echo "$GREETING from $(pwd)"', { env: { GREETING: "hi" }, cwd: "/tmp" });
    assert.equal(env.stdoutText, "hi from /tmp\n");
    const killed = await sandbox.commands.run("kill -TERM $$");
    assert.equal(killed.exitCode, 128 + 15);
    await assert.rejects(sandbox.commands.run(["/no/such/program"]), NotFoundError);
  });

  test("a timeout kills the process group: timedOut and exit code 124, output so far kept", async () => {
    const started = Date.now();
    const r = await sandbox.commands.run("echo before; sleep 30 & wait", { timeoutMs: 300 });
    assert.equal(r.timedOut, true);
    assert.equal(r.exitCode, 124);
    assert.equal(r.stdoutText, "before\n");
    assert.ok(Date.now() - started < 10_000);
  });

  test("output beyond the limit is cut and flagged truncated", async () => {
    const r = await sandbox.commands.run("head -c 1000000 /dev/zero", { outputLimit: 1000 });
    assert.equal(r.stdout.length, 1000);
    assert.equal(r.truncated, true);
    assert.equal(r.exitCode, 0);
  });

  test("10 MB of binary output arrives byte-exact", async () => {
    await sandbox.commands.run("head -c 10485760 /dev/urandom > /tmp/random.bin");
    const started = Date.now();
    const r = await sandbox.commands.run(["cat", "/tmp/random.bin"]);
    const elapsed = Date.now() - started;
    assert.equal(r.exitCode, 0);
    assert.equal(r.stdout.length, 10 * 1024 * 1024);
    const remote = (await sandbox.commands.run(["sha256sum", "/tmp/random.bin"])).stdoutText.split(" ")[0];
    assert.equal(sha256(r.stdout), remote);
    const file = await sandbox.files.read("/tmp/random.bin");
    assert.equal(sha256(file), remote);
    console.log(`# 10 MiB exec output in ${elapsed} ms (${((10 / elapsed) * 1000).toFixed(1)} MiB/s)`);
  });

  test("streaming: chunks arrive in order with their offsets, stdin on demand", async () => {
    const h = await sandbox.commands.start(["sh", "-c", "while read line; do echo \"got $line\"; done"], { stdin: true });
    await h.sendStdin("a\n");
    const first = await h.next();
    assert.equal(text(first!.bytes), "got a\n");
    assert.equal(first!.offset, 0);
    await h.sendStdin("b\n");
    await h.closeStdin();
    const rest = await h.wait();
    assert.equal(rest.stdoutText, "got b\n");
    assert.equal(rest.exitCode, 0);
  });

  test("a background process's reader re-attaches after a dropped connection and loses nothing", async () => {
    // 600,000 numbered lines (4.2 MB) on stdout and a line per 1,000 on stderr; the rings
    // are big enough to hold everything produced while no reader is attached.
    const script =
      "import sys\nfor i in range(600000):\n    sys.stdout.write('%07d\\n' % i)\n    if i % 1000 == 0: sys.stderr.write('e%07d\\n' % i)\n";
    await sandbox.files.write("/tmp/count.py", script);
    const h = await sandbox.commands.start(["python3", "/tmp/count.py"], { background: true, ringBytes: 16 << 20 });
    const out: Uint8Array[] = [];
    const err: Uint8Array[] = [];
    let got = 0;
    let drops = 0;
    for (;;) {
      const chunk: OutputChunk | null = await h.next();
      if (chunk === null) break;
      (chunk.channel === "out" ? out : err).push(chunk.bytes);
      got += chunk.bytes.length;
      // Drop the connection twice mid-stream, as a network failure would.
      if ((drops === 0 && got > 100_000) || (drops === 1 && got > 2_000_000)) {
        drops += 1;
        sandbox.disconnect();
      }
    }
    assert.equal(drops, 2);
    assert.deepEqual(h.dropped, []);
    assert.equal(h.exitStatus?.code, 0);
    const expectedOut = Array.from({ length: 600000 }, (_, i) => `${String(i).padStart(7, "0")}\n`).join("");
    const expectedErr = Array.from({ length: 600 }, (_, i) => `e${String(i * 1000).padStart(7, "0")}\n`).join("");
    assert.equal(text(Buffer.concat(out)), expectedOut);
    assert.equal(text(Buffer.concat(err)), expectedErr);
    assert.deepEqual(h.offsets, [expectedOut.length, expectedErr.length]);
  });

  test("attach from an offset replays the rest; an overwritten ring reports what was dropped", async () => {
    // The process waits for a line on stdin, so it is still running when we detach (an exit
    // delivered on the exec stream would collect it).
    const h = await sandbox.commands.start("printf 'hello world'; read line; echo \"$line\"", { background: true, stdin: true });
    // Attaching past what the process has written so far is refused: detach only once all of
    // "hello world" exists (a loaded machine may not have run printf yet).
    let seen = 0;
    while (seen < "hello world".length) {
      const chunk = await h.next();
      assert.ok(chunk, "the process ended before printing");
      seen += chunk.bytes.length;
    }
    await h.detach();
    const again = await sandbox.commands.attach(h.processId, { outOffset: 6, stdin: true });
    const first = await again.next();
    assert.equal(text(first!.bytes), "world");
    assert.equal(first!.offset, 6);
    await again.sendStdin("bye\n");
    const r = await again.wait();
    assert.equal(r.stdoutText, "bye\n");
    assert.equal(r.exitCode, 0);
    assert.deepEqual(again.offsets, [15, 0]);

    // 100,000 bytes into a 4,096-byte ring while nobody reads: the replay says what is gone.
    const small = await sandbox.commands.start("while [ ! -e /tmp/go ]; do sleep 0.01; done; head -c 100000 /dev/zero | tr '\\0' x", {
      background: true,
      ringBytes: 4096,
    });
    await small.detach();
    await sandbox.files.write("/tmp/go", "");
    await until("the process ends", 10_000, async () => (await sandbox.commands.list()).find((p) => p.process === small.processId && p.exit !== undefined));
    const replay = await sandbox.commands.attach(small.processId);
    const rr = await replay.wait();
    assert.deepEqual(replay.dropped, [{ channel: "out", from: 0, to: 100000 - 4096 }]);
    assert.equal(rr.stdoutText, "x".repeat(4096));
    await assert.rejects(sandbox.commands.attach(small.processId), NotFoundError); // collected
  });

  test("detaching races the exit, and the status is never lost", async () => {
    for (let i = 0; i < 5; i++) {
      const h = await sandbox.commands.start("exit 7", { background: true });
      await h.detach();
      if (h.exitStatus !== undefined) {
        // The exit crossed the cancel and collected the process: the handle kept it.
        assert.equal(h.exitStatus.code, 7);
        await assert.rejects(sandbox.commands.attach(h.processId), NotFoundError);
      } else {
        assert.equal((await sandbox.commands.wait(h.processId)).code, 7);
      }
    }
  });

  test("kill, wait and list manage background processes", async () => {
    const h = await sandbox.commands.start("sleep 60", { background: true, tag: "sleeper" });
    await h.detach();
    const listed = await sandbox.commands.list();
    const mine = listed.find((p) => p.process === h.processId);
    assert.equal(mine?.tag, "sleeper");
    assert.equal(mine?.exit, undefined);
    await sandbox.commands.kill(h.processId, { signal: "TERM" });
    const status = await sandbox.commands.wait(h.processId);
    assert.equal(status.signal, 15);
  });
});

describe("pty", () => {
  test("a background terminal survives a dropped connection: output replayed, keystrokes still reach it", async () => {
    const t = await sandbox.pty.start({ cols: 80, rows: 24, command: ["sh"], background: true });
    await t.write("echo one-$((1+1))\n");
    let seen = "";
    while (!seen.includes("one-2")) seen += text((await t.next())!.bytes);
    sandbox.disconnect();
    // The write finds the connection gone, re-attaches (taking stdin over) and sends.
    await t.write("echo two-$((2+1)); exit 6\n");
    const rest = await t.wait();
    assert.match(rest.stdoutText, /two-3/);
    assert.equal(rest.exitCode, 6);
    assert.deepEqual(t.dropped, []);
  });

  test("a terminal runs a shell, takes keystrokes and resizes", async () => {
    const t = await sandbox.pty.start({ cols: 80, rows: 24, command: ["sh"] });
    await t.resize(100, 30);
    await t.write("stty size; echo $((6*7)); exit 5\n");
    const r = await t.wait();
    assert.match(r.stdoutText, /30 100/);
    assert.match(r.stdoutText, /42/);
    assert.equal(r.exitCode, 5);
  });
});

describe("files", () => {
  test("write, read, stat, list, rename, chmod, remove", async () => {
    assert.equal(await sandbox.files.write("/workspace/f/a.txt", "alpha\n"), 6);
    assert.equal(await sandbox.files.readText("/workspace/f/a.txt"), "alpha\n");
    assert.equal(text(await sandbox.files.read("/workspace/f/a.txt", { offset: 1, len: 3 })), "lph");
    const st = await sandbox.files.stat("/workspace/f/a.txt");
    assert.equal(st.kind, "file");
    assert.equal(st.size, 6);
    assert.equal(st.mode, 0o644);
    await sandbox.files.write("/workspace/f/a.txt", "more\n", { ifExists: "append" });
    assert.equal(await sandbox.files.readText("/workspace/f/a.txt"), "alpha\nmore\n");
    await assert.rejects(sandbox.files.write("/workspace/f/a.txt", "x", { ifExists: "fail" }), AlreadyExistsError);
    await sandbox.files.mkdir("/workspace/f/sub/deeper");
    await sandbox.files.rename("/workspace/f/a.txt", "/workspace/f/sub/b.txt");
    await sandbox.files.chmod("/workspace/f/sub/b.txt", 0o755);
    assert.equal((await sandbox.files.stat("/workspace/f/sub/b.txt")).mode, 0o755);
    const entries = await sandbox.files.list("/workspace/f", { depth: 3 });
    assert.deepEqual(entries.map((e) => `${e.path}:${e.kind}`).sort(), ["sub/b.txt:file", "sub/deeper:dir", "sub:dir"]);
    assert.equal(await sandbox.files.exists("/workspace/f/a.txt"), false);
    await assert.rejects(sandbox.files.read("/workspace/f/a.txt"), (e: unknown) => e instanceof NotFoundError && e.code === "not_found");
    await assert.rejects(sandbox.files.read("/workspace/f"), (e: unknown) => e instanceof PathKindError && e.code === "is_directory");
    await sandbox.files.remove("/workspace/f", { recursive: true });
    assert.equal(await sandbox.files.exists("/workspace/f"), false);
  });

  test("binary files round-trip byte-exact; downloads are bounded", async () => {
    const data = new Uint8Array(3 * 1024 * 1024);
    for (let i = 0; i < data.length; i++) data[i] = (i * 7919) & 0xff;
    await sandbox.files.write("/tmp/bin.dat", data);
    assert.equal(sha256(await sandbox.files.read("/tmp/bin.dat")), sha256(data));
    await assert.rejects(sandbox.files.read("/tmp/bin.dat", { maxBytes: 1000 }), (e: unknown) => (e as { code?: string }).code === "too_large");
  });

  test("glob, grep and edit", async () => {
    await sandbox.files.writeBatch([
      { path: "/workspace/g/src/lib.rs", data: "fn parse_test() {}\nfn other() {}\n" },
      { path: "/workspace/g/src/deep/mod.rs", data: "fn nested_test() {}\n" },
      { path: "/workspace/g/README.md", data: "fn not_code_test\n" },
    ]);
    const g = await sandbox.files.glob("src/**/*.rs", { root: "/workspace/g" });
    assert.deepEqual(g.paths.sort(), ["src/deep/mod.rs", "src/lib.rs"]);
    assert.equal(g.truncated, false);
    const m = await sandbox.files.grep("fn \\w+_test", { path: "/workspace/g", regex: true, glob: "**/*.rs" });
    assert.deepEqual(m.matches.map((x) => `${x.path}:${x.line}`).sort(), ["src/deep/mod.rs:1", "src/lib.rs:1"]);
    const literal = await sandbox.files.grep("OTHER", { path: "/workspace/g/src/lib.rs", ignoreCase: true });
    assert.deepEqual(literal.matches, [{ path: "lib.rs", line: 2, text: "fn other() {}" }]);
    assert.equal(await sandbox.files.edit("/workspace/g/src/lib.rs", "other", "renamed"), 1);
    assert.match(await sandbox.files.readText("/workspace/g/src/lib.rs"), /fn renamed\(\)/);
    await assert.rejects(sandbox.files.edit("/workspace/g/src/lib.rs", "fn", "x"), (e: unknown) => e instanceof InvalidArgumentError && /occurs 2 times/.test(e.message));
    assert.equal(await sandbox.files.edit("/workspace/g/src/lib.rs", "fn", "pub fn", { replaceAll: true }), 2);
    await assert.rejects(sandbox.files.edit("/workspace/g/src/lib.rs", "absent", "x"), NotFoundError);
  });

  test("batches report each file's outcome: partial success", async () => {
    await sandbox.files.write("/workspace/blocker", "a file, not a directory");
    const written = await sandbox.files.writeBatch([
      { path: "/workspace/batch/one.txt", data: "1" },
      { path: "/workspace/blocker/two.txt", data: "22" },
      { path: "/workspace/batch/run.sh", data: "#!/bin/sh\n", mode: 0o755 },
    ]);
    assert.deepEqual(written.map((r) => r.ok), [true, false, true]);
    assert.equal(written[1]!.ok ? "" : written[1]!.code, "not_a_directory");
    assert.equal((await sandbox.files.stat("/workspace/batch/run.sh")).mode, 0o755);
    const read = await sandbox.files.readBatch(["/workspace/batch/one.txt", "/workspace/missing", "/workspace/batch/run.sh"]);
    assert.equal(read.length, 3);
    assert.equal(read[0]!.ok && text(read[0]!.content!), "1");
    assert.equal(!read[1]!.ok && read[1]!.code, "not_found");
    assert.equal(read[2]!.ok && text(read[2]!.content!), "#!/bin/sh\n");
  });

  test("tar: a directory out and back in, with modes", async () => {
    await sandbox.files.writeBatch([
      { path: "/workspace/t/a.txt", data: "A" },
      { path: "/workspace/t/bin/x", data: "X", mode: 0o755 },
      { path: "/workspace/t/skip.o", data: "O" },
    ]);
    const archive = await sandbox.files.readTar("/workspace/t", { exclude: ["*.o"] });
    assert.ok(archive.length >= 1024 && archive.length % 512 === 0);
    await sandbox.files.writeTar("/workspace/t2", archive);
    assert.equal(await sandbox.files.readText("/workspace/t2/a.txt"), "A");
    assert.equal((await sandbox.files.stat("/workspace/t2/bin/x")).mode, 0o755);
    assert.equal(await sandbox.files.exists("/workspace/t2/skip.o"), false);
    await assert.rejects(sandbox.files.writeTar("/workspace/t3", new TextEncoder().encode("not a tar archive at all".repeat(40))), InvalidArgumentError);
  });

  test("watch reports changes made after it is armed", async () => {
    await sandbox.files.mkdir("/workspace/w");
    const w = await sandbox.files.watch("/workspace/w");
    await sandbox.files.write("/workspace/w/new.txt", "hi");
    const seen = new Set<string>();
    for (let i = 0; i < 20 && !seen.has("create:new.txt"); i++) {
      const e = await w.next();
      if (e === null) break;
      if (e.kind === "create" || e.kind === "modify") seen.add(`${e.kind}:${e.path}`);
      if (e.kind === "rename") seen.add(`create:${e.to}`);
    }
    assert.ok(seen.has("create:new.txt"), [...seen].join(","));
    w.close();
    let rest = 0;
    while ((await w.next()) !== null) rest += 1; // events already on the way, then the end
    assert.ok(rest < 20);
  });
});

describe("ports", () => {
  test("a server inside the sandbox is listed and reachable through its preview URL", async () => {
    await sandbox.files.write("/workspace/site/index.html", "hello from the sandbox\n");
    const server = await sandbox.commands.start(["python3", "-m", "http.server", "8123", "--bind", "127.0.0.1"], { background: true, cwd: "/workspace/site" });
    try {
      await until("the server listens", 20_000, async () => ((await sandbox.ports.list()).some((p) => p.port === 8123) ? true : undefined));
      const url = await sandbox.ports.previewHostUrl(8123);
      assert.match(url, new RegExp(`8123-${sandbox.id}`));
      const info = await sandbox.ports.previewInfo();
      assert.ok(url.includes(`tether_preview_token=${encodeURIComponent(info.token)}`));
      const pathUrl = info.pathUrl.replace("{port}", "8123");
      const res = await fetch(`${pathUrl}index.html`, { headers: { "X-Tether-Preview-Token": info.token } });
      assert.equal(res.status, 200);
      assert.equal(await res.text(), "hello from the sandbox\n");
      const refused = await fetch(`${pathUrl}index.html`, { headers: { "X-Tether-Preview-Token": "wrong" } });
      assert.notEqual(refused.status, 200);
      // The same server through a local forward, several requests at once.
      const forward = await sandbox.ports.forward(8123);
      try {
        const pages = await Promise.all([1, 2, 3].map(() => fetch(`${forward.url}/index.html`).then((r) => r.text())));
        assert.deepEqual(pages, Array(3).fill("hello from the sandbox\n"));
        const big = new Uint8Array(2 << 20).map((_, i) => i & 0xff);
        await sandbox.files.write("/workspace/site/big.bin", big);
        const got = new Uint8Array(await (await fetch(`${forward.url}/big.bin`)).arrayBuffer());
        assert.equal(sha256(got), sha256(big));
      } finally {
        await forward.close();
      }
    } finally {
      await server.kill();
    }
  });
});
