//! # tether-sandbox
//!
//! A TypeScript client for Tether sandboxes.
//!
//! ## Layout
//! - `sandbox.ts`: `Sandbox`, the entry point: create, get-or-create, connect, list, delete.
//! - `relay.ts`: the relay's REST API with retries.
//! - `commands.ts` (and `process.ts`, a running process), `pty.ts`, `files.ts`, `ports.ts`:
//!   what runs inside a sandbox.
//! - `protocol/`: the wire protocol (frames, flow control, streams); nothing else sees frames.
//! - `toolkit.ts`: `TetherSandboxToolkit`, four tools for agents (AI SDK, LangChain.js).
//! - `deepagents.ts`: `TetherBackend`, a deepagentsjs sandbox backend.
//! - `errors.ts`, `types.ts`, `constants.ts`.

export { Sandbox, type CreateOptions } from "./sandbox.js";
export { RelayClient, RelayConfig, type RelayOptions } from "./relay.js";
export { Commands, type Command, type ExecOptions, type RunOptions, type StartOptions } from "./commands.js";
export { CommandHandle, shellExitCode, type DroppedRange } from "./process.js";
export { Pty, PtyHandle, type PtyOptions } from "./pty.js";
export { Files, Watch } from "./files.js";
export { Ports, Forward } from "./ports.js";
export { TEMPLATES, isTemplateBuilt, templateLayout } from "./templates.js";
export { Connection, Stream, type StreamItem, type ConnectOptions } from "./protocol/connection.js";
export * from "./errors.js";
export type * from "./types.js";
export { TetherSandboxToolkit, type TetherSandboxToolkitOptions, type TetherTool, type RunOutput } from "./toolkit.js";
