// The package as users install it from this repository: a copy of this folder as a fresh clone
// has it (no node_modules, no dist) installed into fresh npm projects, both as a link (`npm
// install DIR`) and as a copy (`npm install --install-links DIR`). Each project imports it,
// turns the toolkit's schemas into JSON Schema with its own `ai`, and type-checks the README's
// AI SDK example with `tsc --strict`, against zod 4 and against zod 3, and with the `ai` 6 +
// zod 4 pair that failed with TS2589 while the package pinned zod 3.
//
// npm runs with --prefer-offline, so a warm npm cache needs no network.

import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, relative, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const SDK = resolve(dirname(fileURLToPath(import.meta.url)), "../..");
/** One npm install or tsc run, in milliseconds; a slow registry or a hung step fails the test. */
const STEP_TIMEOUT_MS = 300_000;
/** The whole file, in milliseconds: three projects on a loaded 2-core machine. */
const SUITE_TIMEOUT_MS = 900_000;
/** What a fresh project compiles with (the SDK's own major). */
const TYPESCRIPT = "typescript@5";

let work: string;
let clone: string;

function run(cwd: string, command: string, args: string[]): Promise<string> {
  return new Promise((resolveRun, reject) => {
    execFile(command, args, { cwd, timeout: STEP_TIMEOUT_MS, maxBuffer: 64 << 20 }, (error, stdout, stderr) => {
      if (error) reject(new Error(`\`${command} ${args.join(" ")}\` in ${cwd} failed: ${error.message}\n${stdout}\n${stderr}`));
      else resolveRun(stdout);
    });
  });
}

/** The README's first `ts` block that imports from "ai", as written. */
function readmeAiSdkExample(): string {
  const readme = readFileSync(join(SDK, "README.md"), "utf8");
  const blocks = [...readme.matchAll(/```ts\n([\s\S]*?)```/g)].map((m) => m[1]!);
  const example = blocks.find((b) => /from "ai"/.test(b));
  assert.ok(example, "the README has an AI SDK example");
  return example;
}

/** A fresh ESM project with `packages` and the SDK installed (`linked`: as `npm install DIR`). */
async function project(name: string, packages: string[], linked: boolean): Promise<string> {
  const dir = join(work, name);
  mkdirSync(join(dir, "src"), { recursive: true });
  writeFileSync(join(dir, "package.json"), JSON.stringify({ name, version: "0.0.0", private: true, type: "module" }));
  const sdk = relative(dir, clone);
  await run(dir, "npm", ["install", "--prefer-offline", "--no-audit", "--no-fund", "--loglevel=error", ...(linked ? [] : ["--install-links"]), ...packages, TYPESCRIPT, "@types/node@20", sdk]);
  writeFileSync(join(dir, "src", "example.ts"), readmeAiSdkExample());
  // The example is examples/typescript/toolkit_primes.ts, whose model comes from the examples'
  // helper (a real model or the AI SDK's mock): declared here as the helper exports it.
  writeFileSync(join(dir, "src", "_scripted.ts"), 'export declare function model(script: Array<[string, Record<string, unknown>]>): Promise<import("ai").LanguageModel>;\n');
  writeFileSync(
    join(dir, "tsconfig.json"),
    JSON.stringify({ compilerOptions: { target: "ES2022", module: "NodeNext", moduleResolution: "NodeNext", strict: true, noEmit: true, skipLibCheck: true, types: ["node"] }, include: ["src"] }),
  );
  return dir;
}

/** Imports the installed package in `dir` and has `ai` read the toolkit's schemas. */
async function importAndConvert(dir: string): Promise<void> {
  const script = `
    import { Sandbox, TetherSandboxToolkit } from "tether-sandbox";
    import { TetherBackend } from "tether-sandbox/deepagents";
    import { asSchema } from "ai";
    const toolkit = new TetherSandboxToolkit({ relay: "http://127.0.0.1:9", token: "t" });
    const tools = toolkit.getAiSdkTools();
    const schema = await asSchema(tools.sandbox_tether_run.inputSchema).jsonSchema;
    const refused = await tools.sandbox_tether_shell.execute({ command: 7 }).then(() => "accepted", (e) => e.message);
    console.log(JSON.stringify({ sandbox: typeof Sandbox, backend: typeof TetherBackend, schema, refused }));
  `;
  const out = JSON.parse(await run(dir, process.execPath, ["--input-type=module", "-e", script])) as {
    sandbox: string;
    backend: string;
    schema: { properties?: Record<string, unknown>; required?: string[] };
    refused: string;
  };
  assert.equal(out.sandbox, "function");
  assert.equal(out.backend, "function");
  assert.deepEqual(Object.keys(out.schema.properties ?? {}).sort(), ["code", "language", "timeoutSeconds"]);
  assert.deepEqual(out.schema.required, ["code"]);
  assert.match(out.refused, /invalid arguments for sandbox_tether_shell/);
}

async function typecheck(dir: string): Promise<void> {
  await run(dir, process.execPath, [join(dir, "node_modules", "typescript", "bin", "tsc"), "-p", "."]);
}

before(() => {
  work = mkdtempSync(join(tmpdir(), "tether-ts-install-"));
  clone = join(work, "tether-sandbox");
  const skip = new Set(["node_modules", "dist", "dist-test"].map((d) => join(SDK, d)));
  cpSync(SDK, clone, { recursive: true, filter: (src) => !skip.has(src) });
});

after(() => {
  if (work !== undefined) rmSync(work, { recursive: true, force: true });
});

describe("installing from this repository", { timeout: SUITE_TIMEOUT_MS }, () => {
  test("npm install DIR (a link) builds dist on install, imports, and the README example type-checks with zod 4", async () => {
    const dir = await project("linked-zod4", ["ai@latest", "zod@4"], true);
    await importAndConvert(dir);
    await typecheck(dir);
  });

  test("npm install --install-links DIR with zod 3: imports, and the README example type-checks", async () => {
    const dir = await project("copy-zod3", ["ai@latest", "zod@^3.25"], false);
    assert.ok(!existsSync(join(dir, "node_modules", "tether-sandbox", "node_modules")), "the copy uses the project's zod, not its own");
    await importAndConvert(dir);
    await typecheck(dir);
  });

  test("ai 6 with zod 4 (TS2589 while the package pinned zod 3) type-checks the README example", async () => {
    const dir = await project("copy-ai6-zod4", ["ai@6", "zod@4"], false);
    await importAndConvert(dir);
    await typecheck(dir);
  });
});

