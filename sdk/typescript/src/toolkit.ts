//! `TetherSandboxToolkit`: the cloud-sandbox toolkit contract (four tools, one sandbox per
//! toolkit created on first use, `getSandbox()`, `close()`), backed by a Tether relay, with
//! the tool definitions in the shapes of the Vercel AI SDK and LangChain.js.

// "zod/v4" is the same API in zod 4 and in zod 3.25+, so either major satisfies the peer
// dependency and the schemas are of the kind the user's `ai` and LangChain expect.
import { z } from "zod/v4";
import { NotFoundError } from "./errors.js";
import { RelayConfig } from "./relay.js";
import { Sandbox, type CreateOptions } from "./sandbox.js";

/** How the toolkit's sandbox is made, and the tools' defaults. */
export interface TetherSandboxToolkitOptions extends CreateOptions {
  /** The relay's URL; `TETHER_RELAY` when absent. Required (here or there). */
  relay?: string;
  /** An API token; `TETHER_TOKEN` when absent. Required (here or there). */
  token?: string;
  /** The timeout of `run` and `shell` when the model gives none, in seconds (default 60). */
  defaultTimeoutSeconds?: number;
  /** The most a model may ask for, in seconds (default 600). */
  maxTimeoutSeconds?: number;
  /** Output kept per call, in bytes (default 100,000): more is cut and flagged `truncated`. */
  outputLimit?: number;
  /** The most bytes `read_file` returns (default 10 MiB). */
  maxReadBytes?: number;
  /** Seconds with no client connected after which the relay deletes the sandbox (default
   * 600, like the cloud sandboxes' idle timeouts); `close()` deletes it at once. */
  idleTimeout?: number;
  /** Where `run` writes code before running it (default `/tmp`). */
  scratchDir?: string;
}

/** The toolkit's sandbox is deleted after this long with no client connected, in seconds. */
const DEFAULT_IDLE_TIMEOUT_SECS = 600;

/** A tool: a name, a description for the model, a zod schema of its input, and `execute`. */
export interface TetherTool<Input = Record<string, unknown>> {
  name: string;
  description: string;
  schema: z.ZodType<Input>;
  execute(input: Input): Promise<string>;
}

/** Erases a tool's input type; `execute` validates its input against the schema first, so a
 * model's malformed arguments get a clear error rather than reaching the sandbox. */
function defineTool<I>(t: TetherTool<I>): TetherTool {
  return {
    name: t.name,
    description: t.description,
    schema: t.schema as unknown as z.ZodType<Record<string, unknown>>,
    execute: async (input) => {
      const parsed = t.schema.safeParse(input);
      if (!parsed.success) throw new Error(`invalid arguments for ${t.name}: ${parsed.error.message}`);
      return t.execute(parsed.data);
    },
  };
}

/** Languages `run` knows, and how each runs a file. */
const LANGUAGES: Record<string, { ext: string; argv: (file: string) => string[]; env?: Record<string, string> }> = {
  // Unbuffered, so stdout and stderr interleave in the order the program wrote them.
  python: { ext: "py", argv: (f) => ["python3", f], env: { PYTHONUNBUFFERED: "1" } },
  javascript: { ext: "mjs", argv: (f) => ["node", f] },
  bash: { ext: "sh", argv: (f) => ["bash", f] },
  sh: { ext: "sh", argv: (f) => ["sh", f] },
};
const LANGUAGE_ALIASES: Record<string, string> = { py: "python", python3: "python", js: "javascript", node: "javascript", shell: "bash" };

const runSchema = z.object({
  code: z.string().describe("The source code to run."),
  language: z.string().optional().describe("python (default), javascript (node), bash or sh."),
  timeoutSeconds: z.number().positive().optional().describe("Kill the program after this many seconds."),
});
const shellSchema = z.object({
  command: z.string().describe("A shell command line, run with /bin/sh -c."),
  timeoutSeconds: z.number().positive().optional().describe("Kill the command after this many seconds."),
});
const writeSchema = z.object({
  path: z.string().describe("The file's path in the sandbox; parent directories are created."),
  contents: z.string().describe("The file's contents."),
  encoding: z.enum(["utf8", "utf-8", "base64"]).optional().describe("How `contents` is encoded: utf8 (default) or base64."),
});
const readSchema = z.object({
  path: z.string().describe("The file's path in the sandbox."),
  encoding: z.enum(["utf8", "utf-8", "base64"]).optional().describe("How to return the contents: utf8 (default) or base64 for binary files."),
});

/** The answer of `run` and `shell`, as the tools return it (JSON). */
export interface RunOutput {
  output: string;
  exitCode: number;
  timedOut?: true;
  truncated?: true;
}

/**
 * Four tools over one Tether sandbox: `sandbox_tether_run`, `sandbox_tether_shell`,
 * `sandbox_tether_write_file`, `sandbox_tether_read_file`. The sandbox is created on the
 * first tool call and lives until `close()` (or its TTL). One toolkit per session: do not
 * share one between users.
 */
export class TetherSandboxToolkit {
  private readonly options: TetherSandboxToolkitOptions;
  private readonly config: RelayConfig;
  private sandbox: Promise<Sandbox> | undefined;
  private closed = false;

  /** Throws a `ConfigurationError` at once if the relay URL or the token is missing. */
  constructor(options: TetherSandboxToolkitOptions = {}) {
    this.config = RelayConfig.resolve(options, null);
    this.options = options;
  }

  /** The toolkit's sandbox, created on first use. */
  async getSandbox(): Promise<Sandbox> {
    if (this.closed) throw new Error("this toolkit was closed; make a new one for a new session");
    // An idle timeout (the relay never counts a sandbox idle while a connection is open)
    // frees the sandbox of a session that ended without close().
    const options = { idleTimeout: DEFAULT_IDLE_TIMEOUT_SECS, ...this.options, relay: this.config.url, token: this.config.token };
    this.sandbox ??= Sandbox.create(options).catch((e: unknown) => {
      this.sandbox = undefined; // let the next call try again
      throw e;
    });
    return this.sandbox;
  }

  /** Deletes the sandbox, if one was created. */
  async close(): Promise<void> {
    this.closed = true;
    const pending = this.sandbox;
    this.sandbox = undefined;
    if (pending === undefined) return;
    const sandbox = await pending.catch(() => undefined);
    await sandbox?.delete();
  }

  private timeoutMs(seconds: number | undefined): number {
    const max = this.options.maxTimeoutSeconds ?? 600;
    const s = Math.min(seconds ?? this.options.defaultTimeoutSeconds ?? 60, max);
    return Math.max(1, Math.round(s * 1000));
  }

  private async exec(argv: string[] | string, timeoutSeconds: number | undefined, env?: Record<string, string>): Promise<string> {
    const sandbox = await this.getSandbox();
    const result = await sandbox.commands.run(argv, {
      ...(env === undefined ? {} : { env }),
      mergeStderr: true,
      timeoutMs: this.timeoutMs(timeoutSeconds),
      outputLimit: this.options.outputLimit ?? 100_000,
    });
    const answer: RunOutput = { output: result.stdoutText, exitCode: result.exitCode };
    if (result.timedOut) answer.timedOut = true;
    if (result.truncated) answer.truncated = true;
    return JSON.stringify(answer);
  }

  /** Runs code: `{code, language?, timeoutSeconds?}` → JSON `{output, exitCode}`. */
  async run(input: { code: string; language?: string | undefined; timeoutSeconds?: number | undefined }): Promise<string> {
    const requested = (input.language ?? "python").toLowerCase();
    const name = LANGUAGE_ALIASES[requested] ?? requested;
    const language = LANGUAGES[name];
    if (language === undefined) {
      throw new Error(`unknown language ${JSON.stringify(input.language)}: use one of ${Object.keys(LANGUAGES).join(", ")}`);
    }
    const sandbox = await this.getSandbox();
    const file = `${this.options.scratchDir ?? "/tmp"}/tether-run-${crypto.randomUUID()}.${language.ext}`;
    await sandbox.files.write(file, input.code);
    try {
      return await this.exec(language.argv(file), input.timeoutSeconds, language.env);
    } finally {
      await sandbox.files.remove(file).catch(() => undefined);
    }
  }

  /** Runs a shell command: `{command, timeoutSeconds?}` → JSON `{output, exitCode}`. */
  async shell(input: { command: string; timeoutSeconds?: number | undefined }): Promise<string> {
    return this.exec(input.command, input.timeoutSeconds);
  }

  /** Writes a file: `{path, contents, encoding?}` → `"ok"`. */
  async writeFile(input: { path: string; contents: string; encoding?: string | undefined }): Promise<string> {
    const sandbox = await this.getSandbox();
    const data = input.encoding === "base64" ? Uint8Array.from(Buffer.from(input.contents, "base64")) : input.contents;
    await sandbox.files.write(input.path, data);
    return "ok";
  }

  /** Reads a file: `{path, encoding?}` → its contents, or `"[file not found]"`. */
  async readFile(input: { path: string; encoding?: string | undefined }): Promise<string> {
    const sandbox = await this.getSandbox();
    try {
      const bytes = await sandbox.files.read(input.path, { maxBytes: this.options.maxReadBytes ?? 10 << 20 });
      return input.encoding === "base64" ? Buffer.from(bytes).toString("base64") : new TextDecoder().decode(bytes);
    } catch (e) {
      if (e instanceof NotFoundError) return "[file not found]";
      throw e;
    }
  }

  /** The four tools, framework-neutral: name, description, zod schema, `execute`. */
  getTools(): TetherTool[] {
    const tools: TetherTool[] = [
      defineTool({
        name: "sandbox_tether_run",
        description:
          'Run a program in an isolated Linux sandbox and return JSON {"output", "exitCode"} (stdout and stderr together). language: python (default), javascript, bash or sh. A program that runs past timeoutSeconds is killed and the answer has "timedOut": true and exitCode 124. Files persist between calls.',
        schema: runSchema,
        execute: (input: z.infer<typeof runSchema>) => this.run(input),
      }),
      defineTool({
        name: "sandbox_tether_shell",
        description:
          'Run a shell command line in an isolated Linux sandbox and return JSON {"output", "exitCode"}. A command that runs past timeoutSeconds is killed ("timedOut": true, exitCode 124).',
        schema: shellSchema,
        execute: (input: z.infer<typeof shellSchema>) => this.shell(input),
      }),
      defineTool({
        name: "sandbox_tether_write_file",
        description: 'Write a file in the sandbox (parents created, replaced atomically). Returns "ok".',
        schema: writeSchema,
        execute: (input: z.infer<typeof writeSchema>) => this.writeFile(input),
      }),
      defineTool({
        name: "sandbox_tether_read_file",
        description: 'Read a file from the sandbox. Returns its contents, or "[file not found]".',
        schema: readSchema,
        execute: (input: z.infer<typeof readSchema>) => this.readFile(input),
      }),
    ];
    return tools;
  }

  /** The tools for the Vercel AI SDK: pass to `generateText({ tools })`. Each is what the
   * `ai` package's `tool()` makes: `{description, inputSchema, execute}`. */
  getAiSdkTools(): Record<string, { description: string; inputSchema: z.ZodType<Record<string, unknown>>; execute: (input: Record<string, unknown>) => Promise<string> }> {
    const out: Record<string, { description: string; inputSchema: z.ZodType<Record<string, unknown>>; execute: (input: Record<string, unknown>) => Promise<string> }> = {};
    for (const t of this.getTools()) {
      out[t.name] = { description: t.description, inputSchema: t.schema, execute: (input) => t.execute(input) };
    }
    return out;
  }

  /** The tools as LangChain.js structured tools (needs `@langchain/core`), for LangGraph,
   * `createAgent` or `bindTools`. */
  async getLangChainTools(): Promise<unknown[]> {
    let lc: { tool: (fn: (input: Record<string, unknown>) => Promise<string>, fields: { name: string; description: string; schema: unknown }) => unknown };
    try {
      lc = (await import("@langchain/core/tools" as string)) as typeof lc;
    } catch {
      throw new Error("getLangChainTools needs @langchain/core: npm install @langchain/core");
    }
    return this.getTools().map((t) => lc.tool((input) => t.execute(input), { name: t.name, description: t.description, schema: t.schema }));
  }
}
