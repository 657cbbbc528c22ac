//! `Sandbox`: one sandbox on a relay. Its lifecycle (create, get-or-create by labels, connect,
//! list, renew, pause, resume, delete) goes over REST; everything inside it goes over one
//! WebSocket, opened lazily and re-opened after a drop.
//!
//! Pause and the one WebSocket: the relay resumes a paused sandbox when a new session opens
//! (unless it was created with `autoResume: false`), but a session opened before the pause
//! stays open and is no resume trigger (its streams must live through the pause). So a sandbox
//! this object paused, or found paused, is resumed by the object itself before its next call
//! reaches the sandbox: `connection()` is the one place every call passes.

import { Commands } from "./commands.js";
import { Files } from "./files.js";
import { Ports } from "./ports.js";
import { Pty } from "./pty.js";
import { Connection } from "./protocol/connection.js";
import { expectReply, str, uint } from "./protocol/fields.js";
import { ConflictError, SandboxPausedError } from "./errors.js";
import { type CreateBody, RelayClient, RelayConfig, type RelayOptions } from "./relay.js";
import { templateImage } from "./templates.js";
import type { AgentInfo, IdleAction, NetworkMode, SandboxInfo, Secret } from "./types.js";

/** What a new sandbox looks like. Durations are seconds, sizes bytes; the relay's policy
 * fills in what is left out. */
export interface CreateOptions extends RelayOptions {
  /** Provider name (`local`, `e2b`, `daytona`, `modal`); the relay's default when absent. */
  provider?: string;
  /** The provider's image name (local: `oci:PATH`, or a directory for admin tokens). */
  image?: string;
  /** A template instead of `image` (`base`, `data-science`): on the local provider the one
   * `tether image build --template NAME` built on this machine (`TemplateNotBuiltError` says
   * how to build it when it is not), on a cloud provider the image built as `tether-NAME`.
   * Not the default: a template's user (`user`) cannot write `/workspace`, where the
   * framework adapters work. */
  template?: string;
  labels?: Record<string, string>;
  /** Environment of every process in the sandbox. */
  env?: Record<string, string>;
  /** Delete the sandbox this many seconds after creation (renewable). */
  ttl?: number;
  /** Delete it (or, with `onIdle`, pause or stop it) after this many seconds without client
   * activity. */
  idleTimeout?: number;
  /** What `idleTimeout` does: `delete` (the default), `pause` or `stop` (a provider that
   * cannot refuses it with `UnsupportedError`). */
  onIdle?: IdleAction;
  /** Whether reaching the sandbox while it is paused or stopped (a new session, a preview
   * request) wakes it; default true. With false it stays so until `resume()` or `start()`,
   * and reaching it throws `SandboxPausedError`. */
  autoResume?: boolean;
  cpus?: number;
  memoryBytes?: number;
  pids?: number;
  diskBytes?: number;
  /** `allowlist` (implied by `allowHosts`, `allowCidrs` and `secrets`): the sandbox reaches
   * only those; `info.network` says what enforces it on its provider. */
  network?: NetworkMode;
  /** Host names it may reach: `api.openai.com`, `*.pypi.org` for the names below it, or a
   * preset such as `@package-registries` (PyPI, npm, Debian and crates.io), which the relay
   * expands: `info.network.allowHosts` lists its hosts. */
  allowHosts?: string[];
  /** Networks it may reach, as CIDRs (`10.1.0.0/16`). */
  allowCidrs?: string[];
  /** Secrets by placeholder; their hosts are allowed. */
  secrets?: Secret[];
  /** Run without the system call filter (admin tokens only). */
  seccompUnconfined?: boolean;
}

function createBody(options: CreateOptions, getOrCreate: boolean): CreateBody {
  const body: CreateBody = {};
  if (options.provider !== undefined) body.provider = options.provider;
  if (options.template !== undefined && options.image !== undefined) {
    throw new TypeError("give image or template, not both");
  }
  const image = options.template !== undefined ? templateImage(options.template, options.provider) : options.image;
  if (image !== undefined) body.image = image;
  if (options.labels !== undefined) body.labels = options.labels;
  if (options.env !== undefined) body.env = options.env;
  if (options.ttl !== undefined) body.ttl = options.ttl;
  if (options.idleTimeout !== undefined) body.idle_timeout = options.idleTimeout;
  if (options.cpus !== undefined) body.cpus = options.cpus;
  if (options.memoryBytes !== undefined) body.memory_bytes = options.memoryBytes;
  if (options.pids !== undefined) body.pids = options.pids;
  if (options.diskBytes !== undefined) body.disk_bytes = options.diskBytes;
  const fenced = (options.allowHosts?.length ?? 0) + (options.allowCidrs?.length ?? 0) + (options.secrets?.length ?? 0) > 0;
  if (fenced && options.network !== undefined && options.network !== "allowlist") {
    throw new TypeError(`allowHosts, allowCidrs and secrets need network "allowlist", not "${options.network}"`);
  }
  const network = fenced ? "allowlist" : options.network;
  if (network !== undefined) body.network = network;
  if (options.allowHosts?.length || options.allowCidrs?.length) {
    body.egress = {};
    if (options.allowHosts?.length) body.egress.allow_hosts = [...options.allowHosts];
    if (options.allowCidrs?.length) body.egress.allow_cidrs = [...options.allowCidrs];
  }
  if (options.secrets?.length) {
    body.secrets = options.secrets.map((s) => (s.value === undefined ? { name: s.name, hosts: [...s.hosts] } : { name: s.name, hosts: [...s.hosts], value: s.value }));
  }
  if (options.seccompUnconfined === true) body.seccomp_unconfined = true;
  if (options.onIdle !== undefined) body.on_idle = options.onIdle;
  if (options.autoResume !== undefined) body.auto_resume = options.autoResume;
  if (getOrCreate) body.get_or_create = true;
  return body;
}

/**
 * A sandbox. Make one with `Sandbox.create`, `Sandbox.getOrCreate` or `Sandbox.connect`;
 * `close()` ends the connection, `delete()` removes the sandbox itself.
 *
 * - `sandbox.commands`: processes, foreground and background
 * - `sandbox.files`: the file system, batches, tar, watch
 * - `sandbox.pty`: terminals
 * - `sandbox.ports`: listening ports and preview URLs
 * - `pause()` and `resume()`: freeze every process in it, memory kept, and go on
 */
export class Sandbox {
  info: SandboxInfo;
  /** @internal */
  readonly relay: RelayClient;
  readonly commands: Commands;
  readonly files: Files;
  readonly pty: Pty;
  readonly ports: Ports;
  private conn: Connection | undefined;
  private connecting: Promise<Connection> | undefined;
  /** Set by `pause()` (or a `pause()` that found it paused): the next call resumes it first,
   * since this object's open session would not. */
  private knownPaused = false;
  private waking: Promise<void> | undefined;

  private constructor(info: SandboxInfo, relay: RelayClient) {
    this.info = info;
    this.relay = relay;
    this.commands = new Commands(this);
    this.files = new Files(this);
    this.pty = new Pty(this);
    this.ports = new Ports(this);
  }

  /** The relay's id of the sandbox, e.g. `sb-3f9a2c`. */
  get id(): string {
    return this.info.id;
  }

  /** Creates a sandbox. */
  static async create(options: CreateOptions = {}): Promise<Sandbox> {
    const relay = new RelayClient(RelayConfig.resolve(options));
    return new Sandbox(await relay.create(createBody(options, false)), relay);
  }

  /** Returns the tenant's sandbox with exactly these `labels` if there is one, else creates
   * it (`info.created` says which). */
  static async getOrCreate(options: CreateOptions & { labels: Record<string, string> }): Promise<Sandbox> {
    const relay = new RelayClient(RelayConfig.resolve(options));
    return new Sandbox(await relay.create(createBody(options, true)), relay);
  }

  /** An existing sandbox by id. A paused one stays paused until the first call that reaches
   * it, which resumes it (or, created with `autoResume: false`, throws `SandboxPausedError`
   * until `resume()`). */
  static async connect(id: string, options: RelayOptions = {}): Promise<Sandbox> {
    const relay = new RelayClient(RelayConfig.resolve(options));
    return new Sandbox(await relay.get(id), relay);
  }

  /** The tenant's sandboxes carrying all of `labels`. */
  static async list(labels: Record<string, string> = {}, options: RelayOptions = {}): Promise<SandboxInfo[]> {
    return new RelayClient(RelayConfig.resolve(options)).list(labels);
  }

  /** The connection to the sandbox's agent, opened on first use and after a drop; first
   * resumes a sandbox this object paused (see the module's note). */
  async connection(): Promise<Connection> {
    if (this.knownPaused) {
      this.waking ??= this.wake().finally(() => {
        this.waking = undefined;
      });
      await this.waking;
    }
    if (this.conn !== undefined && !this.conn.isClosed) return this.conn;
    if (this.connecting === undefined) {
      this.connecting = Connection.open({ url: this.relay.config.wsUrl(this.id), token: this.relay.config.token })
        .then((conn) => {
          this.conn = conn;
          return conn;
        })
        .catch((e: unknown) => {
          // The relay refuses a session only to a sandbox paused without auto-resume.
          throw e instanceof ConflictError ? new SandboxPausedError(e.message) : e;
        })
        .finally(() => {
          this.connecting = undefined;
        });
    }
    return this.connecting;
  }

  /** Resumes the sandbox this object knows paused, as a new session would: unless it was
   * created without auto-resume, and is still paused. */
  private async wake(): Promise<void> {
    if (!this.info.autoResume) {
      this.info = await this.relay.get(this.id);
      if (this.info.state === "paused") {
        throw new SandboxPausedError(`sandbox ${this.id} is paused, and was created with autoResume: false: call resume() first`);
      }
    } else {
      try {
        this.info = await this.relay.resume(this.id);
      } catch (e) {
        if (!(e instanceof ConflictError)) throw e; // another client resumed it first, as good
      }
    }
    this.knownPaused = false;
  }

  /** Pauses the sandbox: every process in it stops where it is, its memory kept, and nothing
   * it runs uses CPU until it resumes. Streams already attached (a command's output, a PTY)
   * stay open and lose nothing: their output goes on after the resume.
   *
   * The next call that reaches the sandbox through this object (a command, a file) resumes
   * it first, unless it was created with `autoResume: false`: then such calls throw
   * `SandboxPausedError` until `resume()`. Throws `SandboxPausedError` if it is paused
   * already, `UnsupportedError` if its provider cannot pause. */
  async pause(): Promise<SandboxInfo> {
    try {
      this.info = await this.relay.pause(this.id);
    } catch (e) {
      if (!(e instanceof ConflictError)) throw e;
      // Paused by someone else: this object's session would not wake it either.
      this.knownPaused = true;
      throw new SandboxPausedError(e.message);
    }
    this.knownPaused = true;
    return this.info;
  }

  /** Resumes a paused sandbox where it was. Throws `ConflictError` if it is not paused. */
  async resume(): Promise<SandboxInfo> {
    try {
      this.info = await this.relay.resume(this.id);
    } catch (e) {
      if (e instanceof ConflictError) this.knownPaused = false; // it runs already
      throw e;
    }
    this.knownPaused = false;
    return this.info;
  }

  /** Stops the sandbox: every process in it ends (its agent too, so this object's connection
   * closes), its files are kept. The next call that reaches it starts it again, unless it was
   * created with `autoResume: false`: then such calls throw `SandboxPausedError` until
   * `start()`. Throws `ConflictError` if it is stopped already, `UnsupportedError` if its
   * provider cannot stop. */
  async stop(): Promise<SandboxInfo> {
    await this.close();
    this.info = await this.relay.stop(this.id);
    this.knownPaused = false;
    return this.info;
  }

  /** Starts a stopped sandbox again, its files as they were and no process from before.
   * Throws `ConflictError` if it is not stopped. */
  async start(): Promise<SandboxInfo> {
    this.info = await this.relay.start(this.id);
    return this.info;
  }

  /** Drops the connection at once, as a network failure would: foreground processes die,
   * background ones keep running (their handles re-attach on next read). */
  disconnect(): void {
    this.conn?.terminate();
  }

  /** Closes the connection (the sandbox keeps running). */
  async close(): Promise<void> {
    const conn = this.conn;
    this.conn = undefined;
    conn?.close();
  }

  /** Deletes the sandbox and everything in it. */
  async delete(): Promise<void> {
    await this.close();
    await this.relay.delete(this.id);
  }

  /** Re-reads the sandbox's state from the relay. */
  async refresh(): Promise<SandboxInfo> {
    this.info = await this.relay.get(this.id);
    return this.info;
  }

  /** Extends the TTL to `ttlSeconds` from now. */
  async renew(ttlSeconds: number): Promise<SandboxInfo> {
    this.info = await this.relay.renew(this.id, ttlSeconds);
    return this.info;
  }

  /** Facts about the agent and its machine. */
  async agentInfo(): Promise<AgentInfo> {
    const stream = await (await this.connection()).openStream("info");
    const m = await expectReply(stream, "info");
    return {
      agentVersion: str(m, "agent_version"),
      os: str(m, "os"),
      arch: str(m, "arch"),
      user: str(m, "user"),
      home: str(m, "home"),
      cwd: str(m, "cwd"),
      hostname: str(m, "hostname"),
      cpus: uint(m, "cpus"),
      memoryBytes: uint(m, "memory_bytes"),
      pid: uint(m, "pid"),
    };
  }

  toString(): string {
    return `Sandbox(${this.id} on ${this.relay.config.url})`;
  }
}
