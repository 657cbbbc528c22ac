//! Tunables of the SDK, with their units, in one place. The protocol's own limits are those of
//! proto/PROTOCOL.md section 14; the others are this SDK's choices.

/** The protocol version this SDK speaks (`hello.protocol`). */
export const PROTOCOL_VERSION = 1;
/** Bytes in a frame header. */
export const HEADER_LEN = 6;
/** The largest payload of any frame: 1 MiB. */
export const MAX_PAYLOAD = 1 << 20;
/** The largest data payload this SDK sends: 64 KiB, so streams interleave. */
export const DATA_CHUNK = 1 << 16;
/** Each stream direction's initial credit: 4 MiB. */
export const INITIAL_WINDOW = 4 << 20;
/** The most credit a receiver may have outstanding in one stream direction: 64 MiB. */
export const MAX_WINDOW = 64 << 20;
/** The most send credit this SDK accumulates; grants beyond it are discarded. */
export const MAX_SEND_CREDIT = 1 << 30; // 1 GiB, as the agent
/** How often this SDK pings the WebSocket (where the platform lets it), in milliseconds. */
export const PING_INTERVAL_MS = 20_000;
/** Silence after which a connection is considered dead, in milliseconds. */
export const DEAD_AFTER_MS = 60_000;
/** The WebSocket send buffer above which writers wait for it to drain: 8 MiB. */
export const SEND_HIGH_WATER = 8 << 20;
/** How long `hello` may wait for `welcome`, in milliseconds. */
export const HANDSHAKE_TIMEOUT_MS = 30_000;

/** REST requests answered 429 or 5xx (or failing in the network) are tried this many times. */
export const HTTP_ATTEMPTS = 5;
/** First retry delay, doubled per attempt, in milliseconds. */
export const HTTP_BACKOFF_MS = 200;
/** The longest retry delay, in milliseconds (also caps a server's Retry-After). */
export const HTTP_BACKOFF_MAX_MS = 5_000;
/** One REST request's deadline, in milliseconds (a local create takes well under this). */
export const HTTP_TIMEOUT_MS = 120_000;
/** How many times a background command's reader re-attaches after its connection drops. */
export const REATTACH_ATTEMPTS = 5;

/** The most bytes `files.read` and downloads keep in memory unless told otherwise: 256 MiB. */
export const DEFAULT_MAX_DOWNLOAD = 256 << 20;
/** Entries in one archive `files.downloadDir` unpacks. */
export const MAX_TAR_ENTRIES = 1_000_000;
/** Output kept by `commands.run` unless told otherwise: 64 MiB, then `truncated`. */
export const DEFAULT_OUTPUT_LIMIT = 64 << 20;

/** The client name sent in `hello`. */
export const CLIENT_NAME = "tether-sandbox-ts/0.1.0";

/** The query parameter the relay takes a preview token in. */
export const PREVIEW_TOKEN_PARAM = "tether_preview_token";
/** How long the resolver may take before a preview URL falls back to the path form, in ms. */
export const PREVIEW_RESOLVE_TIMEOUT_MS = 2_000;
