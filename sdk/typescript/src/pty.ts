//! Terminals: a process under a pseudo-terminal, its output on one channel, keystrokes in,
//! resizes. Background terminals re-attach like any background process.

import { execFields, type Command, type ExecOptions } from "./commands.js";
import { CommandHandle } from "./process.js";
import type { Sandbox } from "./sandbox.js";

/** A process under a terminal. */
export class PtyHandle extends CommandHandle {
  /** Sends keystrokes (`"\x03"` is Ctrl-C). */
  async write(data: string | Uint8Array): Promise<void> {
    await this.sendStdin(data);
  }

  /** Changes the terminal's size; the process gets SIGWINCH. */
  async resize(cols: number, rows: number): Promise<void> {
    await this.stream.resize(cols, rows);
  }
}

/** Options of `pty.start`. */
export interface PtyOptions extends Omit<ExecOptions, "mergeStderr"> {
  cols: number;
  rows: number;
  /** The `TERM` variable; `xterm-256color` when absent. */
  term?: string;
  /** What to run; a login shell (bash, else sh) when absent. */
  command?: Command;
  /** The terminal outlives this connection. */
  background?: boolean;
}

/** Terminals: `sandbox.pty`. */
export class Pty {
  private readonly sandbox: Sandbox;

  /** @internal */
  constructor(sandbox: Sandbox) {
    this.sandbox = sandbox;
  }

  /** Starts a process under a terminal of `cols` × `rows`. */
  async start(options: PtyOptions): Promise<PtyHandle> {
    const command = options.command ?? "if command -v bash >/dev/null; then exec bash -l; else exec sh -l; fi";
    const fields = execFields(command, options);
    fields["stdin"] = true;
    fields["pty"] = { cols: options.cols, rows: options.rows, ...(options.term === undefined ? {} : { term: options.term }) };
    if (options.background === true) fields["background"] = true;
    return PtyHandle.open(this.sandbox, "exec", fields, options.background === true);
  }
}
