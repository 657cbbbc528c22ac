//! A running process as the client sees it: its output in order with byte offsets, its exit
//! status, and, for a background process, re-attaching from the offsets reached when the
//! connection drops (PROTOCOL.md `attach`), so a reader loses no byte.

import { DEFAULT_OUTPUT_LIMIT, INITIAL_WINDOW, REATTACH_ATTEMPTS } from "./constants.js";
import { ConnectionLostError, ProtocolError, TetherError } from "./errors.js";
import type { Stream } from "./protocol/connection.js";
import { flag, int, streamError, uint } from "./protocol/fields.js";
import type { Sandbox } from "./sandbox.js";
import type { CommandResult, ExitStatus, OutputChunk } from "./types.js";

/** @internal reads an `exit` status object. */
export function exitStatus(value: unknown): ExitStatus {
  if (typeof value !== "object" || value === null) throw new ProtocolError("the agent's `exit` has no status object");
  const s = value as Record<string, unknown>;
  const code = s["code"] === undefined || s["code"] === null ? undefined : int(s, "code");
  const signal = s["signal"] === undefined || s["signal"] === null ? undefined : int(s, "signal");
  return { code, signal, timedOut: flag(s, "timed_out"), truncated: flag(s, "truncated") };
}

/** One shell exit code for a status (PROTOCOL.md `exit`): 124 on timeout, else the code, else
 * 128 + the signal. */
export function shellExitCode(status: ExitStatus): number {
  if (status.timedOut) return 124;
  if (status.code !== undefined) return status.code;
  if (status.signal !== undefined) return 128 + status.signal;
  return 255;
}

const utf8 = new TextDecoder("utf-8");

function concat(chunks: Uint8Array[], total: number): Uint8Array {
  const out = new Uint8Array(total);
  let at = 0;
  for (const c of chunks) {
    out.set(c, at);
    at += c.length;
  }
  return out;
}

/** A gap in replayed output: bytes `from` to `to` (exclusive) of `channel` were overwritten
 * in the process's ring before they could be read. */
export interface DroppedRange {
  channel: "out" | "err";
  from: number;
  to: number;
}

/**
 * A running process: iterate it for its output (`for await (const chunk of handle)`), or
 * `wait()` for the whole result. A background process's handle re-attaches from the offsets
 * it reached when its connection drops, so no byte is lost.
 */
export class CommandHandle implements AsyncIterable<OutputChunk> {
  /** The agent's id of the process (for `attach`, `wait`, `kill`). */
  readonly processId: number;
  /** Its pid inside the sandbox. */
  readonly pid: number;
  /** Gaps reported by the agent while replaying (a ring overwrote them). */
  readonly dropped: DroppedRange[] = [];
  /** @internal */
  protected stream: Stream;
  private readonly sandbox: Sandbox;
  private readonly background: boolean;
  /** This handle forwards stdin; a re-attach takes it over again. */
  private stdin = false;
  private reattaching: Promise<void> | undefined;
  private readonly window: number;
  private position: [number, number];
  private status: ExitStatus | undefined;
  private done = false;

  /** @internal */
  constructor(sandbox: Sandbox, stream: Stream, started: Record<string, unknown>, background: boolean, window: number) {
    this.sandbox = sandbox;
    this.stream = stream;
    this.background = background;
    this.window = window;
    this.processId = uint(started, "process");
    this.pid = uint(started, "pid");
    this.position = startedOffsets(started);
  }

  /** @internal opens a process stream and waits for `started`. */
  static async open<T extends CommandHandle>(
    this: new (sandbox: Sandbox, stream: Stream, started: Record<string, unknown>, background: boolean, window: number) => T,
    sandbox: Sandbox,
    op: string,
    fields: Record<string, unknown>,
    background: boolean,
    window = INITIAL_WINDOW,
  ): Promise<T> {
    const stream = await (await sandbox.connection()).openStream(op, fields, window);
    const handle = new this(sandbox, stream, await awaitStarted(stream), background, window);
    handle.stdin = fields["stdin"] === true;
    return handle;
  }

  /** The offsets of the next `out` and `err` bytes this handle will deliver. */
  get offsets(): [number, number] {
    return [this.position[0], this.position[1]];
  }

  /** The exit status, once the process ended and its output was read. */
  get exitStatus(): ExitStatus | undefined {
    return this.status;
  }

  async *[Symbol.asyncIterator](): AsyncIterator<OutputChunk> {
    for (;;) {
      const chunk = await this.next();
      if (chunk === null) return;
      yield chunk;
    }
  }

  /** The next piece of output, or `null` once the process ended (or was detached). */
  async next(): Promise<OutputChunk | null> {
    for (;;) {
      if (this.done) return null;
      if (this.reattaching !== undefined) {
        await this.reattaching;
        continue;
      }
      const stream = this.stream;
      let item;
      try {
        item = await stream.next();
      } catch (e) {
        if (e instanceof ConnectionLostError && this.status !== undefined) {
          // The exit arrived (and collected the process) before the drop: nothing is missing.
          this.done = true;
          return null;
        }
        if (e instanceof ConnectionLostError && this.background) {
          await this.ensureAttached(stream, e);
          continue;
        }
        throw e;
      }
      // A writer re-attached meanwhile, from the offsets reached before this item: the new
      // stream delivers it again, so the old stream's copy is dropped.
      if (stream !== this.stream || this.reattaching !== undefined) continue;
      if (item === null) {
        this.done = true;
        return null;
      }
      if (item.kind === "data") {
        const channel = item.channel === "err" ? "err" : "out";
        const index = channel === "out" ? 0 : 1;
        const chunk = { channel, offset: this.position[index], bytes: item.bytes } as const;
        this.position[index] += item.bytes.length;
        return chunk;
      }
      const m = item.message;
      switch (m.type) {
        case "dropped": {
          const channel = m["channel"] === "err" ? "err" : "out";
          const from = uint(m, "from");
          const to = uint(m, "to");
          this.dropped.push({ channel, from, to });
          this.position[channel === "out" ? 0 : 1] = to;
          break;
        }
        case "exit":
          this.status = exitStatus(m["status"]);
          break;
        case "error":
          this.done = true;
          throw streamError(m);
        default:
          break; // eof, and anything a later version adds
      }
    }
  }

  /** Re-attaches unless someone already replaced the `dead` stream; one re-attach at a time. */
  private async ensureAttached(dead: Stream, cause: TetherError): Promise<void> {
    if (this.stream !== dead) return;
    this.reattaching ??= this.reattach(cause).finally(() => {
      this.reattaching = undefined;
    });
    await this.reattaching;
  }

  /** Re-attaches to the background process from the offsets reached, on a fresh connection. */
  private async reattach(cause: TetherError): Promise<void> {
    let last: unknown = cause;
    for (let attempt = 0; attempt < REATTACH_ATTEMPTS; attempt++) {
      try {
        const conn = await this.sandbox.connection();
        const stream = await conn.openStream(
          "attach",
          { process: this.processId, out_offset: this.position[0], err_offset: this.position[1], ...(this.stdin ? { stdin: true } : {}) },
          this.window,
        );
        const started = await awaitStarted(stream);
        this.stream = stream;
        // Delivery resumes where `started` says (PROTOCOL.md `attach`); a gap also comes as
        // `dropped`, which the reader records.
        this.position = startedOffsets(started);
        return;
      } catch (e) {
        last = e;
        if (!(e instanceof ConnectionLostError) && !(e instanceof TetherError && e.code === "unavailable")) throw e;
      }
    }
    throw last instanceof Error ? last : new ConnectionLostError(String(last));
  }

  /** Reads the rest of the output and the exit status. Keeps at most `outputLimit` bytes
   * (default 64 MiB); beyond that the result says `truncated`. `onChunk` sees every piece as
   * it arrives. */
  async wait(options: { outputLimit?: number; onChunk?: (chunk: OutputChunk) => void } = {}): Promise<CommandResult> {
    const limit = options.outputLimit ?? DEFAULT_OUTPUT_LIMIT;
    const out: Uint8Array[] = [];
    const err: Uint8Array[] = [];
    let kept = 0;
    let cut = false;
    let outLen = 0;
    let errLen = 0;
    for (;;) {
      const chunk = await this.next();
      if (chunk === null) break;
      options.onChunk?.(chunk);
      let bytes = chunk.bytes;
      if (kept + bytes.length > limit) {
        bytes = bytes.subarray(0, limit - kept);
        cut = true;
      }
      kept += bytes.length;
      if (bytes.length === 0) continue;
      if (chunk.channel === "out") {
        out.push(bytes);
        outLen += bytes.length;
      } else {
        err.push(bytes);
        errLen += bytes.length;
      }
    }
    return commandResult(this.status, concat(out, outLen), concat(err, errLen), cut, this.processId);
  }

  /** Sends bytes to stdin (the process must have been started with `stdin: true`). */
  async sendStdin(data: string | Uint8Array): Promise<void> {
    const bytes = typeof data === "string" ? new TextEncoder().encode(data) : data;
    if (this.reattaching !== undefined) await this.reattaching;
    const stream = this.stream;
    let sent = 0;
    try {
      await stream.write(bytes, (n) => (sent = n));
    } catch (e) {
      // A background process outlives the connection: re-attach (taking stdin over) and send
      // what had not gone out yet. Bytes already handed to the dropped socket are not sent
      // twice; the drop may have lost them.
      if (!(e instanceof ConnectionLostError) || !this.background || !this.stdin || this.done) throw e;
      await this.ensureAttached(stream, e);
      await this.stream.write(bytes.subarray(sent));
    }
  }

  /** Closes stdin: the process reads end-of-file. */
  async closeStdin(): Promise<void> {
    await this.stream.eof();
  }

  /** Sends a signal (`"INT"`, `"TERM"`, `9`...) to the process, or its whole group. */
  async signal(signal: string | number, group = false): Promise<void> {
    await this.stream.signal(String(signal), group);
  }

  /** Kills the process group. */
  async kill(): Promise<void> {
    await this.sandbox.commands.kill(this.processId, { signal: "KILL", group: true });
  }

  /** Stops reading: a background process keeps running (re-attach with `attach`); a
   * foreground one is killed. Resolves once the agent closed the stream; if the process had
   * already ended, its `exit` crossed the cancel and collected it: `exitStatus` then has it
   * (PROTOCOL.md, `exec`, detaching). */
  async detach(): Promise<void> {
    if (this.done) return;
    this.done = true;
    this.stream.cancel();
    try {
      for (;;) {
        const item = await this.stream.next();
        if (item === null) return;
        if (item.kind === "message" && item.message.type === "exit") this.status = exitStatus(item.message["status"]);
      }
    } catch {
      // The connection went: nothing more can arrive on this stream.
    }
  }
}

/** @internal */
export function startedOffsets(started: Record<string, unknown>): [number, number] {
  const offsets = started["offsets"];
  if (!Array.isArray(offsets) || offsets.length !== 2) return [0, 0];
  const o: Record<string, unknown> = { type: "started", a: offsets[0], b: offsets[1] };
  return [uint(o, "a"), uint(o, "b")];
}

async function awaitStarted(stream: Stream): Promise<Record<string, unknown>> {
  for (;;) {
    const item = await stream.next();
    if (item === null) throw new ProtocolError("the process stream closed before `started`");
    if (item.kind === "data") throw new ProtocolError("data before `started`");
    const m = item.message;
    if (m.type === "started") return m;
    if (m.type === "error") throw streamError(m);
  }
}

function commandResult(status: ExitStatus | undefined, stdout: Uint8Array, stderr: Uint8Array, cut: boolean, process: number): CommandResult {
  if (status === undefined) throw new ConnectionLostError(`process ${process}'s stream ended without its exit status`);
  const truncated = status.truncated || cut;
  return {
    exitCode: shellExitCode(status),
    stdout,
    stderr,
    stdoutText: utf8.decode(stdout),
    stderrText: utf8.decode(stderr),
    timedOut: status.timedOut,
    truncated,
    status: { ...status, truncated },
  };
}

