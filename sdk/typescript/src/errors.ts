//! Errors as classes with a `code`: the agent's error codes (PROTOCOL.md section 11), the
//! relay's (`ErrorBody` of client/src/api.rs), and the SDK's own. Wire codes map to classes in
//! exactly one place, `errorFromCode`.

/** Every error code an SDK error can carry. */
export type ErrorCode =
  // the agent's (PROTOCOL.md section 11)
  | "not_found"
  | "permission_denied"
  | "is_directory"
  | "not_a_directory"
  | "already_exists"
  | "invalid_path"
  | "invalid_argument"
  | "timeout"
  | "too_large"
  | "unauthorized"
  | "unsupported"
  | "internal"
  // the relay's
  | "forbidden"
  | "conflict"
  | "provider_error"
  | "unavailable"
  | "gone"
  // the SDK's own
  | "connection_lost"
  | "protocol_error"
  | "configuration"
  | "template_not_built";

/** The base of every error this SDK throws. `code` says what went wrong, for programs. */
export class TetherError extends Error {
  readonly code: ErrorCode;
  constructor(code: ErrorCode, message: string) {
    super(message);
    this.name = new.target.name;
    this.code = code;
  }
}

/** A path, process, sandbox or stream does not exist. */
export class NotFoundError extends TetherError {
  constructor(message: string) {
    super("not_found", message);
  }
}
/** The token may not do this (the relay's 401/403, the agent's `permission_denied`). */
export class PermissionDeniedError extends TetherError {}
/** The request was malformed or out of range; the message names the field. */
export class InvalidArgumentError extends TetherError {}
/** The target exists and the request said not to replace it. */
export class AlreadyExistsError extends TetherError {
  constructor(message: string) {
    super("already_exists", message);
  }
}
/** A file was expected and a directory found, or the reverse, or a path is malformed. */
export class PathKindError extends TetherError {}
/** A result, file or disk is too large or full. */
export class TooLargeError extends TetherError {
  constructor(message: string) {
    super("too_large", message);
  }
}
/** The request conflicts with the sandbox's state (the relay's 409, `conflict`): resuming a
 * sandbox that is not paused, for one. */
export class ConflictError extends TetherError {
  constructor(message: string) {
    super("conflict", message);
  }
}
/** The sandbox is paused and the request needs it running: pausing it again, or reaching it
 * (a command, a file) when it was created with `autoResume: false`. `resume()` runs it
 * again. */
export class SandboxPausedError extends ConflictError {}
/** The provider or agent cannot do what was asked (`unsupported`; the relay's 501): pausing
 * a sandbox, or `onIdle: "pause"`, on a provider without pause. Retrying cannot help. */
export class UnsupportedError extends TetherError {
  constructor(message: string) {
    super("unsupported", message);
  }
}
/** The relay or agent cannot serve this now (503, 502, a provider failure); worth retrying. */
export class UnavailableError extends TetherError {}
/** The relay deleted the sandbox on its own (TTL, idle timeout, gone); HTTP 410. */
export class SandboxGoneError extends TetherError {
  constructor(message: string) {
    super("gone", message);
  }
}
/** A sandbox was asked of a template (`base`, `data-science`) not built on this machine; the
 * message names the command that builds it (`command`). */
export class TemplateNotBuiltError extends TetherError {
  readonly template: string;
  readonly command: string;
  constructor(template: string, layout: string) {
    const command = `tether image build --template ${template}`;
    super(
      "template_not_built",
      `the template ${template} is not built on this machine (no ${layout}): build it with \`${command}\` (as root; a few minutes, from the Debian archive and PyPI)`,
    );
    this.template = template;
    this.command = command;
  }
}
/** The WebSocket to the sandbox closed while an operation was in flight. */
export class ConnectionLostError extends TetherError {
  constructor(message: string) {
    super("connection_lost", message);
  }
}
/** The peer broke the protocol (a malformed frame, an unexpected message). */
export class ProtocolError extends TetherError {
  constructor(message: string) {
    super("protocol_error", message);
  }
}
/** The SDK is missing its relay URL or token, or was given an option it cannot use. */
export class ConfigurationError extends TetherError {
  constructor(message: string) {
    super("configuration", message);
  }
}
/** An operation with its own deadline did not finish in time. */
export class TimeoutError extends TetherError {
  constructor(message: string) {
    super("timeout", message);
  }
}

/** The error class for a wire code (agent or relay). The one place codes become classes. */
export function errorFromCode(code: string, message: string): TetherError {
  switch (code) {
    case "not_found":
      return new NotFoundError(message);
    case "permission_denied":
    case "unauthorized":
    case "forbidden":
      return new PermissionDeniedError(code, message);
    case "invalid_argument":
      return new InvalidArgumentError(code, message);
    case "conflict":
      return new ConflictError(message);
    case "unsupported":
      return new UnsupportedError(message);
    case "already_exists":
      return new AlreadyExistsError(message);
    case "is_directory":
    case "not_a_directory":
    case "invalid_path":
      return new PathKindError(code, message);
    case "too_large":
      return new TooLargeError(message);
    case "timeout":
      return new TimeoutError(message);
    case "unavailable":
    case "provider_error":
      return new UnavailableError(code, message);
    case "gone":
      return new SandboxGoneError(message);
    default:
      return new TetherError("internal", `${code}: ${message}`);
  }
}
