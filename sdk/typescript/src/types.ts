//! The SDK's result types: every value a public method returns.

/** A sandbox as the relay describes it. */
export interface SandboxInfo {
  /** The relay's id, e.g. `sb-3f9a2c`. */
  id: string;
  provider: string;
  /** The provider's own id. */
  providerRef: string;
  /** `running`, `paused` (`resume()`, or with auto-resume any call, continues it), `stopped`,
   * `dead` (its agent exited; remove it), `gone` or `unknown`. */
  state: string;
  labels: Record<string, string>;
  image: string | undefined;
  /** Milliseconds since the Unix epoch. */
  createdMs: number;
  lastActiveMs: number;
  /** When the TTL deletes it. */
  expiresMs: number | undefined;
  idleTimeoutSecs: number | undefined;
  /** Whether it was just created (false when get-or-create found an existing one). */
  created: boolean;
  /** Its network access and what enforces it (undefined from relays that do not say). */
  network: NetworkInfo | undefined;
  /** What its provider can do with it beyond create, connect and delete (all false from
   * relays that do not say). */
  capabilities: SandboxCapabilities;
  /** Whether a new session (or a preview request) resumes it while it is paused; when false,
   * only `resume()` does, and reaching it paused throws `SandboxPausedError`. */
  autoResume: boolean;
  /** What its idle timeout does: `delete`, `pause` or `stop`. */
  onIdle: IdleAction;
}

/** What a sandbox's provider can do with it beyond create, connect and delete. */
export interface SandboxCapabilities {
  /** Pause (processes frozen, memory kept) and resume. */
  pause: boolean;
  /** Stop (processes ended, files kept) and start. */
  stop: boolean;
}

/** What a sandbox's idle timeout does: delete it (the default), pause it, or stop it. */
export type IdleAction = "delete" | "pause" | "stop";

/** A sandbox's network mode: its own loopback only, the host's network, or an allowlist. */
export type NetworkMode = "none" | "host" | "allowlist";

/** A secret the sandbox uses without holding it: its environment variable `name` holds a
 * placeholder, replaced with the value by the relay's egress proxy in requests to `hosts`
 * only. `value` (absent: the relay's secret store) is sent once, at create. */
export interface Secret {
  name: string;
  hosts: string[];
  value?: string;
}

/** A sandbox's network as created, and what its provider guarantees for it. */
export interface NetworkInfo {
  mode: string;
  allowHosts: string[];
  allowCidrs: string[];
  /** Secrets bound to it: names and hosts, never values. */
  secrets: { name: string; hosts: string[] }[];
  /** `relay` (the relay's own egress proxy and rules), or the provider's name. */
  enforcedBy: string;
  guarantees: string[];
  notGuaranteed: string[];
}

/** How a browser reaches ports inside a sandbox. */
export interface PreviewInfo {
  /** The sandbox's preview token. */
  token: string;
  /** e.g. `http://{port}-sb-1.localhost:7420/`. */
  hostUrl: string;
  /** e.g. `http://127.0.0.1:7420/preview/sb-1/{port}/`. */
  pathUrl: string;
}

/** Facts about the agent and its machine. */
export interface AgentInfo {
  agentVersion: string;
  os: string;
  arch: string;
  user: string;
  home: string;
  cwd: string;
  hostname: string;
  cpus: number;
  memoryBytes: number;
  pid: number;
}

/** How a process ended, as the agent reports it. */
export interface ExitStatus {
  /** The exit code, when the process exited by itself. */
  code: number | undefined;
  /** The signal that ended it, when one did. */
  signal: number | undefined;
  /** The agent killed it because its timeout elapsed. */
  timedOut: boolean;
  /** Output was cut at the output limit. */
  truncated: boolean;
}

/** A finished command. */
export interface CommandResult {
  /** One shell exit code: 124 on timeout (like timeout(1)), else the code, else 128 + signal. */
  exitCode: number;
  stdout: Uint8Array;
  stderr: Uint8Array;
  /** `stdout` decoded as UTF-8 (invalid bytes replaced). */
  stdoutText: string;
  stderrText: string;
  timedOut: boolean;
  truncated: boolean;
  status: ExitStatus;
}

/** A piece of a process's output. */
export interface OutputChunk {
  channel: "out" | "err";
  /** The offset of its first byte in the process's output channel. */
  offset: number;
  bytes: Uint8Array;
}

/** A process the agent started. */
export interface ProcessInfo {
  process: number;
  pid: number;
  tag: string | undefined;
  command: string;
  pty: boolean;
  exit: ExitStatus | undefined;
  /** Output bytes produced so far on `out` and `err`. */
  offsets: [number, number];
  startedMs: number;
}

/** A path's metadata. */
export interface FileInfo {
  path: string;
  kind: "file" | "dir" | "symlink" | "other";
  size: number;
  /** Permission bits, e.g. `0o644`. */
  mode: number;
  mtimeMs: number;
  /** A symlink's target. */
  target: string | undefined;
}

/** Paths from `glob`. */
export interface GlobResult {
  paths: string[];
  truncated: boolean;
}

/** One line from `grep`. */
export interface GrepMatch {
  path: string;
  line: number;
  text: string;
}

/** Lines from `grep`. */
export interface GrepResult {
  matches: GrepMatch[];
  truncated: boolean;
}

/** One file of a batch: its bytes, or why not. */
export type BatchFileResult =
  | { path: string; ok: true; size: number; content?: Uint8Array }
  | { path: string; ok: false; code: string; message: string };

/** A change seen by a watch. */
export type FileEvent =
  | { kind: "create"; path: string; dir: boolean }
  | { kind: "modify"; path: string }
  | { kind: "remove"; path: string; dir: boolean }
  | { kind: "rename"; from: string; to: string }
  | { kind: "overflow" };

/** A listening TCP port inside the sandbox. */
export interface ListeningPort {
  port: number;
  address: string;
}
