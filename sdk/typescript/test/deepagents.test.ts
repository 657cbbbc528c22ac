// A deepagentsjs agent, driven by LangChain's fake chat model with a scripted series of tool
// calls, works in a local Tether sandbox through TetherBackend; and the backend's own
// operations keep deepagents' contract (results, not exceptions), answering `ls` and `glob` as
// deepagents' own generic sandbox (BaseSandbox, which passes its standard suite) does over the
// same Tether sandbox.

import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { BaseSandbox, createDeepAgent, type FileInfo as DeepFileInfo } from "deepagents";
import { AIMessage, type BaseMessage, ToolMessage } from "@langchain/core/messages";
import { FakeListChatModel } from "@langchain/core/utils/testing";
import type { ChatResult } from "@langchain/core/outputs";
import { TestRelay } from "./relay.js";
import { TetherBackend } from "../src/deepagents.js";

/** LangChain's fake chat model, answering with the next scripted message (tool calls
 * included) on each call. Binding tools keeps the same script. */
class ScriptedChatModel extends FakeListChatModel {
  private readonly script: AIMessage[];
  private step = 0;
  readonly seen: BaseMessage[][] = [];

  constructor(script: AIMessage[]) {
    super({ responses: script.map((m) => String(m.content)) });
    this.script = script;
  }

  override async _generate(messages: BaseMessage[]): Promise<ChatResult> {
    this.seen.push(messages);
    const message = this.script[Math.min(this.step, this.script.length - 1)]!;
    this.step += 1;
    return { generations: [{ message, text: String(message.content) }] };
  }

  // The agent binds its tools; the script already knows which to call.
  override bindTools(): this {
    return this;
  }
}

/** deepagents' generic sandbox: every file operation a shell script run through `execute`,
 * here over the same Tether sandbox; the reference the backend's answers are compared to. */
class GenericSandbox extends BaseSandbox {
  readonly id: string;
  private readonly inner: TetherBackend;

  constructor(inner: TetherBackend) {
    super();
    this.inner = inner;
    this.id = inner.id;
  }

  execute(command: string) {
    return this.inner.execute(command);
  }

  uploadFiles(files: Array<[string, Uint8Array]>) {
    return this.inner.uploadFiles(files);
  }

  downloadFiles(paths: string[]) {
    return this.inner.downloadFiles(paths);
  }
}

/** What two backends must agree on: each entry's path (a directory's trailing `/` aside) and
 * whether it is a directory, in path order. */
function shape(files: DeepFileInfo[] | undefined): Array<[string, boolean]> {
  return (files ?? []).map((f): [string, boolean] => [f.path.replace(/\/$/, ""), f.is_dir === true]).sort((a, b) => a[0].localeCompare(b[0]));
}

function call(id: string, name: string, args: Record<string, unknown>): AIMessage {
  return new AIMessage({ content: "", tool_calls: [{ id, name, args, type: "tool_call" }] });
}

let relay: TestRelay;
let backend: TetherBackend;

before(async () => {
  relay = await TestRelay.start();
  backend = await TetherBackend.create({ ...relay.options, labels: { suite: "deepagents" } });
});

after(async () => {
  await backend?.deleteSandbox();
  await relay?.stop();
});

describe("deepagents", () => {
  test("an agent with a scripted fake model writes, runs, edits and reads files in the sandbox", async () => {
    const model = new ScriptedChatModel([
      call("c1", "write_file", { file_path: "/workspace/app/hello.py", content: "print('hi from deepagents')\n" }),
      call("c2", "execute", { command: "cd /workspace/app && python3 hello.py && hostname" }),
      call("c3", "edit_file", { file_path: "/workspace/app/hello.py", old_string: "hi from", new_string: "edited by" }),
      call("c4", "read_file", { file_path: "/workspace/app/hello.py" }),
      call("c5", "grep", { pattern: "edited", path: "/workspace/app" }),
      call("c6", "glob", { pattern: "**/*.py", path: "/workspace" }),
      call("c7", "ls", { path: "/workspace/app" }),
      call("c8", "execute", { command: "python3 /workspace/app/hello.py; exit 3" }),
      new AIMessage("All done."),
    ]);
    const agent = createDeepAgent({ model, backend });
    const result = await agent.invoke({ messages: [{ role: "user", content: "Write and run a hello program." }] });
    const messages = result.messages as BaseMessage[];
    const tool = (id: string): string => {
      const m = messages.find((x) => ToolMessage.isInstance(x) && x.tool_call_id === id);
      assert.ok(m, `a tool result for ${id}`);
      return typeof m.content === "string" ? m.content : JSON.stringify(m.content);
    };
    const sandbox = backend.sandbox;
    assert.match(tool("c1"), /wrote|Updated|hello\.py/i);
    const hostname = (await sandbox.commands.run("hostname")).stdoutText.trim();
    assert.match(tool("c2"), /hi from deepagents/);
    assert.ok(tool("c2").includes(hostname), "execute ran inside the sandbox");
    assert.match(tool("c3"), /hello\.py/);
    assert.equal(await sandbox.files.readText("/workspace/app/hello.py"), "print('edited by deepagents')\n");
    assert.match(tool("c4"), /edited by deepagents/);
    assert.match(tool("c5"), /\/workspace\/app\/hello\.py/);
    assert.match(tool("c6"), /^app\/hello\.py$/m);
    assert.match(tool("c7"), /\/workspace\/app\/hello\.py/);
    assert.match(tool("c8"), /edited by deepagents/);
    assert.match(tool("c8"), /failed with exit code 3/);
    assert.match(tool("c2"), /succeeded with exit code 0/);
    const last = messages[messages.length - 1]!;
    assert.equal(last.content, "All done.");
    assert.equal(model.seen.length, 9);
  });

  test("the backend answers deepagents' way: results with errors, absolute paths, partial batches", async () => {
    assert.equal(backend.id, backend.sandbox.id);
    const ex = await backend.execute("echo out; echo err >&2; exit 4");
    assert.deepEqual(ex, { output: "out\nerr\n", exitCode: 4, truncated: false });
    assert.deepEqual(await backend.write("/workspace/d/a.txt", "one\ntwo\nthree\n"), { path: "/workspace/d/a.txt", filesUpdate: null });
    const page = await backend.read("/workspace/d/a.txt", 1, 1);
    assert.equal(page.content, "two");
    assert.equal(page.totalLines, 3);
    assert.equal(page.nextOffset, 2);
    assert.match((await backend.read("/workspace/d/missing.txt")).error ?? "", /not found/);
    const ls = await backend.ls("/workspace/d");
    assert.deepEqual(ls.files?.map((f) => [f.path, f.is_dir]), [["/workspace/d/a.txt", false]]);
    assert.deepEqual((await backend.grep("two", "/workspace/d")).matches, [{ path: "/workspace/d/a.txt", line: 2, text: "two" }]);
    assert.deepEqual((await backend.glob("*.txt", "/workspace/d")).files?.map((f) => [f.path, f.is_dir, f.size]), [["a.txt", false, 14]]);
    assert.match((await backend.edit("/workspace/d/a.txt", "absent", "x")).error ?? "", /String not found/);
    assert.deepEqual(await backend.edit("/workspace/d/a.txt", "two", "2"), { path: "/workspace/d/a.txt", filesUpdate: null, occurrences: 1 });
    const up = await backend.uploadFiles([
      ["/workspace/d/b.bin", new Uint8Array([0, 255])],
      ["/workspace/d/a.txt/c", new Uint8Array([1])],
    ]);
    assert.deepEqual(up.map((u) => u.error), [null, "invalid_path"]);
    const down = await backend.downloadFiles(["/workspace/d/b.bin", "/workspace/d/none"]);
    assert.deepEqual([...(down[0]!.content ?? [])], [0, 255]);
    assert.equal(down[1]!.error, "file_not_found");
    assert.deepEqual(await backend.delete("/workspace/d"), { path: "/workspace/d" });
    assert.deepEqual(await backend.ls("/workspace/d"), { files: [] });
  });

  test("ls and glob answer as deepagents' generic sandbox does over the same sandbox", async () => {
    const generic = new GenericSandbox(backend);
    const root = "/workspace/same";
    await backend.execute(`mkdir -p ${root}/dir1 ${root}/dir2/deep/er ${root}/empty`);
    for (const path of ["a.txt", "b.py", ".hidden", "dir1/c.txt", "dir2/d.txt", "dir2/deep/er/e.txt", "file with spaces.txt", "file(1).txt"]) {
      assert.deepEqual(await backend.write(`${root}/${path}`, "x\n"), { path: `${root}/${path}`, filesUpdate: null });
    }
    for (const dir of [root, `${root}/`, `${root}/dir2`, `${root}/empty`, `${root}/missing`]) {
      const ours = await backend.ls(dir);
      const theirs = await generic.ls(dir);
      assert.equal(ours.error, undefined, `ls ${dir}: ${ours.error}`);
      assert.deepEqual(shape(ours.files), shape(theirs.files), `ls ${dir}`);
    }
    assert.deepEqual(await backend.ls(`${root}/missing`), { files: [] });
    for (const [pattern, dir] of [
      ["*", root],
      ["*.txt", root],
      ["**/*.txt", root],
      ["**/deep", root],
      [".*", root],
      ["?.txt", root],
      ["dir[12]", root],
      ["*", `${root}/dir2`],
      ["*", `${root}/empty`],
      ["*", `${root}/missing`],
    ] as const) {
      const ours = await backend.glob(pattern, dir);
      const theirs = await generic.glob(pattern, dir);
      assert.equal(ours.error, undefined, `glob ${pattern} in ${dir}: ${ours.error}`);
      assert.ok(shape(theirs.files).length > 0 || dir.endsWith("empty") || dir.endsWith("missing"), `the reference finds ${pattern} in ${dir}`);
      assert.deepEqual(shape(ours.files), shape(theirs.files), `glob ${pattern} in ${dir}`);
    }
    const star = await backend.glob("*", root);
    assert.deepEqual(
      star.files?.filter((f) => f.is_dir).map((f) => f.path),
      ["dir1", "dir2", "empty"],
    );
    await backend.delete(root);
  });
});
