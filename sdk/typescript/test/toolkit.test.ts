// TetherSandboxToolkit's contract against a real relay: construction errors, the lazy single
// sandbox, each tool's parameters and results (timeouts, missing files, binary files),
// getSandbox(), close(), and the tools driven by the Vercel AI SDK and LangChain.js.

import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { generateText, stepCountIs, tool } from "ai";
import { MockLanguageModelV3 } from "ai/test";
import { TestRelay } from "./relay.js";
import { ConfigurationError, Sandbox, TetherSandboxToolkit } from "../src/index.js";

let relay: TestRelay;
let toolkit: TetherSandboxToolkit;

before(async () => {
  relay = await TestRelay.start();
  toolkit = new TetherSandboxToolkit({ ...relay.options, labels: { suite: "toolkit" } });
});

after(async () => {
  await toolkit?.close();
  await relay?.stop();
});

function byName(t: TetherSandboxToolkit, name: string) {
  const found = t.getTools().find((x) => x.name === name);
  assert.ok(found, `tool ${name}`);
  return found;
}

/** Runs a tool by name with `input` and parses its JSON answer. */
async function call(name: string, input: Record<string, unknown>): Promise<Record<string, unknown>> {
  return JSON.parse(await byName(toolkit, name).execute(input)) as Record<string, unknown>;
}

describe("construction", () => {
  test("a missing relay or token throws a clear error at construction", () => {
    const saved = { relay: process.env["TETHER_RELAY"], token: process.env["TETHER_TOKEN"] };
    delete process.env["TETHER_RELAY"];
    delete process.env["TETHER_TOKEN"];
    try {
      assert.throws(() => new TetherSandboxToolkit({ token: "t" }), (e: unknown) => e instanceof ConfigurationError && e.code === "configuration" && /missing relay URL.*TETHER_RELAY/.test(e.message));
      assert.throws(() => new TetherSandboxToolkit({ relay: relay.url }), (e: unknown) => e instanceof ConfigurationError && /missing API token.*TETHER_TOKEN/.test(e.message));
      assert.throws(() => new TetherSandboxToolkit({ relay: "not a url", token: "t" }), ConfigurationError);
      process.env["TETHER_RELAY"] = relay.url;
      process.env["TETHER_TOKEN"] = relay.adminToken;
      assert.doesNotThrow(() => new TetherSandboxToolkit()); // both from the environment
    } finally {
      for (const [k, v] of [["TETHER_RELAY", saved.relay], ["TETHER_TOKEN", saved.token]] as const) {
        if (v === undefined) delete process.env[k];
        else process.env[k] = v;
      }
    }
  });

  test("getTools returns the four tools with their parameters", () => {
    const tools = toolkit.getTools();
    assert.deepEqual(tools.map((t) => t.name), ["sandbox_tether_run", "sandbox_tether_shell", "sandbox_tether_write_file", "sandbox_tether_read_file"]);
    const keys = (name: string): string[] => Object.keys((byName(toolkit, name).schema as unknown as { shape: Record<string, unknown> }).shape);
    assert.deepEqual(keys("sandbox_tether_run"), ["code", "language", "timeoutSeconds"]);
    assert.deepEqual(keys("sandbox_tether_shell"), ["command", "timeoutSeconds"]);
    assert.deepEqual(keys("sandbox_tether_write_file"), ["path", "contents", "encoding"]);
    assert.deepEqual(keys("sandbox_tether_read_file"), ["path", "encoding"]);
  });
});

describe("tools", () => {
  test("the sandbox is created on the first tool call, once", async () => {
    assert.deepEqual(await Sandbox.list({ suite: "toolkit" }, relay.options), []);
    const [a, b] = await Promise.all([call("sandbox_tether_shell", { command: "echo one" }), call("sandbox_tether_shell", { command: "echo two" })]);
    assert.deepEqual(a, { output: "one\n", exitCode: 0 });
    assert.deepEqual(b, { output: "two\n", exitCode: 0 });
    const listed = await Sandbox.list({ suite: "toolkit" }, relay.options);
    assert.equal(listed.length, 1);
    assert.equal((await toolkit.getSandbox()).id, listed[0]!.id);
    assert.equal(listed[0]!.idleTimeoutSecs, 600); // freed if the session ends without close()
  });

  test("run: python (default), javascript and bash, stdout and stderr together, exit codes", async () => {
    assert.deepEqual(await call("sandbox_tether_run", { code: "import sys\nprint(6*7)\nprint('warn', file=sys.stderr)\nsys.exit(2)" }), {
      output: "42\nwarn\n",
      exitCode: 2,
    });
    assert.deepEqual(await call("sandbox_tether_run", { code: "console.log([1,2,3].map(x => x * 2).join(','))", language: "javascript" }), { output: "2,4,6\n", exitCode: 0 });
    assert.deepEqual(await call("sandbox_tether_run", { code: "echo $((40+2))", language: "bash" }), { output: "42\n", exitCode: 0 });
    await assert.rejects(byName(toolkit, "sandbox_tether_run").execute({ code: "x", language: "cobol" }), /unknown language "cobol"/);
    await assert.rejects(byName(toolkit, "sandbox_tether_run").execute({ language: "python" }), /invalid arguments for sandbox_tether_run/);
  });

  test("a timeout returns {timedOut: true, exitCode: 124, output}", async () => {
    const started = Date.now();
    const r = await call("sandbox_tether_run", { code: "import time\nprint('started', flush=True)\ntime.sleep(60)", timeoutSeconds: 1 });
    assert.deepEqual(r, { output: "started\n", exitCode: 124, timedOut: true });
    assert.ok(Date.now() - started < 15_000);
    const s = await call("sandbox_tether_shell", { command: "sleep 60", timeoutSeconds: 0.5 });
    assert.deepEqual(s, { output: "", exitCode: 124, timedOut: true });
  });

  test("output beyond the toolkit's limit is cut and flagged", async () => {
    const small = new TetherSandboxToolkit({ ...relay.options, outputLimit: 100 });
    try {
      const r = JSON.parse(await byName(small, "sandbox_tether_shell").execute({ command: "seq 1 10000" })) as { output: string; truncated?: boolean };
      assert.equal(r.output.length, 100);
      assert.equal(r.truncated, true);
    } finally {
      await small.close();
    }
  });

  test("write_file → \"ok\"; read_file → the contents, or \"[file not found]\"", async () => {
    const write = byName(toolkit, "sandbox_tether_write_file");
    const read = byName(toolkit, "sandbox_tether_read_file");
    assert.equal(await write.execute({ path: "/workspace/notes/a.txt", contents: "héllo\n" }), "ok");
    assert.equal(await read.execute({ path: "/workspace/notes/a.txt" }), "héllo\n");
    assert.equal(await read.execute({ path: "/workspace/notes/missing.txt" }), "[file not found]");
    const binary = Buffer.from([0, 1, 2, 255, 254, 10]).toString("base64");
    assert.equal(await write.execute({ path: "/workspace/b.bin", contents: binary, encoding: "base64" }), "ok");
    assert.equal(await read.execute({ path: "/workspace/b.bin", encoding: "base64" }), binary);
    const shell = await call("sandbox_tether_shell", { command: "od -An -tu1 /workspace/b.bin" });
    assert.match(String(shell["output"]), /0\s+1\s+2\s+255\s+254\s+10/);
    // Files written by one tool are seen by the others: one sandbox per toolkit.
    assert.deepEqual(await call("sandbox_tether_run", { code: "print(open('/workspace/notes/a.txt').read().strip())" }), { output: "héllo\n", exitCode: 0 });
    await assert.rejects(read.execute({ path: "/workspace/notes" }), /is_directory|directory/i);
  });

  test("getSandbox() gives the sandbox itself for direct use", async () => {
    const sb = await toolkit.getSandbox();
    await sb.files.write("/workspace/seed.csv", "a,b\n1,2\n");
    assert.deepEqual(await call("sandbox_tether_shell", { command: "wc -l < /workspace/seed.csv" }), { output: "2\n", exitCode: 0 });
  });
});

describe("frameworks", () => {
  test("the Vercel AI SDK runs the tools a model calls", async () => {
    const usage = { inputTokens: { total: 1, noCache: 1, cacheRead: 0, cacheWrite: 0 }, outputTokens: { total: 1, text: 1, reasoning: 0 } };
    const model = new MockLanguageModelV3({
      doGenerate: [
        {
          content: [{ type: "tool-call", toolCallId: "c1", toolName: "sandbox_tether_shell", input: JSON.stringify({ command: "echo from-ai-sdk" }) }],
          finishReason: { unified: "tool-calls", raw: undefined },
          usage,
          warnings: [],
        },
        { content: [{ type: "text", text: "done" }], finishReason: { unified: "stop", raw: undefined }, usage, warnings: [] },
      ],
    });
    // generateText takes them as they are, and the ai package's own `tool()` accepts each.
    const tools = toolkit.getAiSdkTools();
    assert.equal(typeof tool(tools["sandbox_tether_shell"]!).execute, "function");
    const result = await generateText({ model, tools, prompt: "run it", stopWhen: stepCountIs(3) });
    assert.equal(result.text, "done");
    const toolResults = result.steps.flatMap((s) => s.toolResults);
    assert.equal(toolResults.length, 1);
    assert.deepEqual(JSON.parse(String(toolResults[0]!.output)), { output: "from-ai-sdk\n", exitCode: 0 });
    // The model was told each tool's JSON schema.
    const offered = model.doGenerateCalls[0]!.tools ?? [];
    const shell = offered.find((t) => t.name === "sandbox_tether_shell") as { inputSchema?: { properties?: Record<string, unknown>; required?: string[] } } | undefined;
    assert.deepEqual(Object.keys(shell?.inputSchema?.properties ?? {}), ["command", "timeoutSeconds"]);
    assert.deepEqual(shell?.inputSchema?.required, ["command"]);
  });

  test("LangChain.js structured tools invoke the same tools", async () => {
    const tools = (await toolkit.getLangChainTools()) as { name: string; invoke(input: unknown): Promise<unknown> }[];
    assert.deepEqual(tools.map((t) => t.name), toolkit.getTools().map((t) => t.name));
    const run = tools.find((t) => t.name === "sandbox_tether_run")!;
    assert.deepEqual(JSON.parse(String(await run.invoke({ code: "print('from langchain')" }))), { output: "from langchain\n", exitCode: 0 });
    const read = tools.find((t) => t.name === "sandbox_tether_read_file")!;
    assert.equal(await read.invoke({ path: "/nope" }), "[file not found]");
  });
});

describe("close", () => {
  test("close() deletes the sandbox; the toolkit refuses further calls", async () => {
    const own = new TetherSandboxToolkit({ ...relay.options, labels: { suite: "close" } });
    await own.close(); // nothing created yet: nothing to delete
    const other = new TetherSandboxToolkit({ ...relay.options, labels: { suite: "close" } });
    await byName(other, "sandbox_tether_shell").execute({ command: "true" });
    assert.equal((await Sandbox.list({ suite: "close" }, relay.options)).length, 1);
    await other.close();
    assert.deepEqual(await Sandbox.list({ suite: "close" }, relay.options), []);
    await assert.rejects(byName(other, "sandbox_tether_shell").execute({ command: "true" }), /closed/);
  });
});
