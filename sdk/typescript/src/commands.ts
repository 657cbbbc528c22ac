//! `sandbox.commands`: run a command to completion, start one to stream its output (in the
//! foreground or the background), attach to a background process from byte offsets, wait,
//! kill, list. The handle of a running process is `process.ts`.

import { DEFAULT_OUTPUT_LIMIT } from "./constants.js";
import { InvalidArgumentError, ProtocolError } from "./errors.js";
import { expectReply, flag, objects, optStr, streamError, uint } from "./protocol/fields.js";
import { CommandHandle, exitStatus, startedOffsets } from "./process.js";
import type { Sandbox } from "./sandbox.js";
import type { CommandResult, ExitStatus, ProcessInfo } from "./types.js";

/** A command: a shell script (`/bin/sh -c`) or an argv (no shell). */
export type Command = string | readonly string[];

/** Options shared by `run` and `start`. */
export interface ExecOptions {
  env?: Record<string, string>;
  cwd?: string;
  /** Run as this user (name or uid); the agent must be root. */
  user?: string;
  /** Kill the process group after this many milliseconds: `timedOut`, exit code 124. */
  timeoutMs?: number;
  /** Deliver at most this many output bytes (both channels); then `truncated`. */
  outputLimit?: number;
  /** stderr into stdout, in order. */
  mergeStderr?: boolean;
}

/** Options of `run`. */
export interface RunOptions extends ExecOptions {
  /** Bytes fed to stdin, which then reaches end-of-file. */
  stdin?: string | Uint8Array;
  /** Called with each piece of stdout as it arrives. */
  onStdout?: (bytes: Uint8Array) => void;
  onStderr?: (bytes: Uint8Array) => void;
}

/** Options of `start`. */
export interface StartOptions extends ExecOptions {
  /** The process outlives this handle and this connection; re-attach with `attach`. */
  background?: boolean;
  /** Keep stdin open for `sendStdin`. */
  stdin?: boolean;
  /** A label shown by `list`. */
  tag?: string;
  /** Capacity of each replay ring (background only), in bytes. */
  ringBytes?: number;
}

/** @internal the `exec` fields for a command. */
export function execFields(command: Command, options: ExecOptions): Record<string, unknown> {
  const fields: Record<string, unknown> = {
    command: typeof command === "string" ? { shell: command } : { argv: [...command] },
  };
  if (typeof command !== "string" && command.length === 0) throw new InvalidArgumentError("invalid_argument", "an argv needs at least the program");
  if (options.env !== undefined) fields["env"] = options.env;
  if (options.cwd !== undefined) fields["cwd"] = options.cwd;
  if (options.user !== undefined) fields["user"] = options.user;
  if (options.timeoutMs !== undefined) {
    if (!(options.timeoutMs >= 1)) throw new InvalidArgumentError("invalid_argument", `timeoutMs must be at least 1, not ${options.timeoutMs}`);
    fields["timeout_ms"] = Math.ceil(options.timeoutMs);
  }
  if (options.outputLimit !== undefined) fields["output_limit"] = Math.max(0, Math.floor(options.outputLimit));
  if (options.mergeStderr === true) fields["merge_stderr"] = true;
  return fields;
}

/** The processes of a sandbox: `sandbox.commands`. */
export class Commands {
  private readonly sandbox: Sandbox;

  /** @internal */
  constructor(sandbox: Sandbox) {
    this.sandbox = sandbox;
  }

  /**
   * Runs a command to completion. A shell script as a string, or an argv. Output beyond
   * `outputLimit` (default 64 MiB) is cut and the result says `truncated`; a `timeoutMs`
   * kills it and the result says `timedOut` with exit code 124.
   */
  async run(command: Command, options: RunOptions = {}): Promise<CommandResult> {
    const limit = options.outputLimit ?? DEFAULT_OUTPUT_LIMIT;
    const fields = execFields(command, { ...options, outputLimit: limit });
    if (options.stdin !== undefined) fields["stdin"] = true;
    const handle = await CommandHandle.open(this.sandbox, "exec", fields, false);
    const feeding =
      options.stdin === undefined
        ? Promise.resolve()
        : (async () => {
            await handle.sendStdin(options.stdin!);
            await handle.closeStdin();
          })().catch(() => undefined); // the process may exit without reading; its status says what happened
    const result = await handle.wait({
      outputLimit: limit,
      onChunk: (chunk) => (chunk.channel === "out" ? options.onStdout : options.onStderr)?.(chunk.bytes),
    });
    await feeding;
    return result;
  }

  /** Starts a command and returns its handle at once, to stream its output. */
  async start(command: Command, options: StartOptions = {}): Promise<CommandHandle> {
    const fields = execFields(command, options);
    if (options.background === true) fields["background"] = true;
    if (options.stdin === true) fields["stdin"] = true;
    if (options.tag !== undefined) fields["tag"] = options.tag;
    if (options.ringBytes !== undefined) fields["ring_bytes"] = options.ringBytes;
    return CommandHandle.open(this.sandbox, "exec", fields, options.background === true);
  }

  /** Attaches to a background process from byte offsets: replayed output, then live. */
  async attach(processId: number, options: { outOffset?: number; errOffset?: number; stdin?: boolean } = {}): Promise<CommandHandle> {
    const fields: Record<string, unknown> = { process: processId, out_offset: options.outOffset ?? 0, err_offset: options.errOffset ?? 0 };
    if (options.stdin === true) fields["stdin"] = true;
    return CommandHandle.open(this.sandbox, "attach", fields, true);
  }

  /** The agent's running processes and uncollected background ones. */
  async list(): Promise<ProcessInfo[]> {
    const stream = await (await this.sandbox.connection()).openStream("processes");
    const m = await expectReply(stream, "processes");
    return objects(m, "processes").map((p) => {
      const o: Record<string, unknown> = { type: "processes", ...p };
      return {
        process: uint(o, "process"),
        pid: uint(o, "pid"),
        tag: optStr(o, "tag"),
        command: typeof o["command"] === "string" ? o["command"] : "",
        pty: flag(o, "pty"),
        exit: o["exit"] === undefined || o["exit"] === null ? undefined : exitStatus(o["exit"]),
        offsets: startedOffsets(o),
        startedMs: typeof o["started_ms"] === "number" ? o["started_ms"] : 0,
      };
    });
  }

  /** Waits for a process to end and collects its status. */
  async wait(processId: number): Promise<ExitStatus> {
    const stream = await (await this.sandbox.connection()).openStream("wait", { process: processId });
    for (;;) {
      const item = await stream.next();
      if (item === null) throw new ProtocolError("`wait` closed without an exit status");
      if (item.kind !== "message") continue;
      if (item.message.type === "exit") return exitStatus(item.message["status"]);
      if (item.message.type === "error") throw streamError(item.message);
    }
  }

  /** Signals a process (default `KILL`), or its group. */
  async kill(processId: number, options: { signal?: string | number; group?: boolean } = {}): Promise<void> {
    const stream = await (await this.sandbox.connection()).openStream("kill", {
      process: processId,
      signal: String(options.signal ?? "KILL"),
      group: options.group ?? true,
    });
    await expectReply(stream, "ok");
  }
}
