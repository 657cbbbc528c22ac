//! The WebSocket underneath a connection: the platform's standard `WebSocket` where there is
//! one, the `ws` package on Node 20 (which has none). Either way the rest of the SDK sees
//! binary messages in, binary messages out with backpressure, and one close.

import { DEAD_AFTER_MS, MAX_PAYLOAD, HEADER_LEN, PING_INTERVAL_MS, SEND_HIGH_WATER } from "../constants.js";
import { ConnectionLostError, errorFromCode, PermissionDeniedError, SandboxGoneError, TetherError, UnavailableError, NotFoundError } from "../errors.js";

/** What a connection needs from its WebSocket. */
export interface Socket {
  /** Sends one binary message; resolves when the platform's send buffer has room again. */
  send(message: Uint8Array): Promise<void>;
  /** Closes normally (1000). */
  close(): void;
  /** Drops the connection at once, as a network failure would. */
  terminate(): void;
}

/** Callbacks a socket calls; `onClose` exactly once. */
export interface SocketEvents {
  onMessage(message: Uint8Array): void;
  onClose(error: TetherError): void;
}

/** Largest message we accept: twice the largest frame, as the agent and relay do. */
const MAX_MESSAGE = 2 * (HEADER_LEN + MAX_PAYLOAD);

/** Opens `url` with `headers` (the relay's `Authorization`), resolving once it is open. */
export async function openSocket(url: string, headers: Record<string, string>, events: SocketEvents): Promise<Socket> {
  const Standard = (globalThis as { WebSocket?: StandardWebSocketCtor }).WebSocket;
  if (Standard !== undefined) return openStandard(Standard, url, headers, events);
  return openWs(url, headers, events);
}

/** Maps a refused upgrade (PROTOCOL.md section 15) to an error that says what to do. */
function upgradeError(url: string, status: number, body: string): TetherError {
  let message = body.trim();
  let code: string | undefined;
  try {
    const parsed = JSON.parse(body) as { error?: { code?: unknown; message?: unknown } };
    if (typeof parsed.error?.message === "string") message = parsed.error.message;
    if (typeof parsed.error?.code === "string") code = parsed.error.code;
  } catch {
    // not the relay's JSON: keep the text
  }
  message = message.slice(0, 500) || `HTTP ${status}`;
  const where = url.replace(/\?.*$/, "");
  switch (status) {
    case 401:
      return new PermissionDeniedError("unauthorized", `${where}: the token was refused (${message}); check TETHER_TOKEN`);
    case 403:
      return new PermissionDeniedError("forbidden", `${where}: ${message}`);
    case 404:
      return new NotFoundError(`${where}: ${message}`);
    case 410:
      return new SandboxGoneError(`${where}: ${message}`);
    case 502:
    case 503:
      return new UnavailableError("unavailable", `${where}: ${message} (HTTP ${status}; worth retrying)`);
    default:
      return code !== undefined ? errorFromCode(code, message) : new ConnectionLostError(`${where}: HTTP ${status}: ${message}`);
  }
}

// --- the `ws` package (Node 20) ---------------------------------------------------------------

async function openWs(url: string, headers: Record<string, string>, events: SocketEvents): Promise<Socket> {
  const { default: WebSocket } = await import("ws");
  const ws = new WebSocket(url, { headers, maxPayload: MAX_MESSAGE, perMessageDeflate: false });
  ws.binaryType = "nodebuffer";
  let closed = false;
  let lastHeard = Date.now();
  const finish = (error: TetherError): void => {
    if (closed) return;
    closed = true;
    clearInterval(pinger);
    events.onClose(error);
  };
  // Each side pings at least every 20 s and gives up after 60 s of silence (section 12).
  const pinger = setInterval(() => {
    if (Date.now() - lastHeard > DEAD_AFTER_MS) {
      ws.terminate();
      finish(new ConnectionLostError(`${url}: nothing heard for ${DEAD_AFTER_MS / 1000} s; the connection is dead`));
      return;
    }
    if (ws.readyState === WebSocket.OPEN) ws.ping();
  }, PING_INTERVAL_MS);
  pinger.unref?.();

  await new Promise<void>((resolve, reject) => {
    ws.once("open", () => resolve());
    ws.once("unexpected-response", (_req, res) => {
      let body = "";
      res.setEncoding("utf8");
      res.on("data", (chunk: string) => {
        if (body.length < 4096) body += chunk;
      });
      res.on("end", () => {
        const error = upgradeError(url, res.statusCode ?? 0, body);
        ws.terminate();
        finish(error);
        reject(error);
      });
      res.on("error", () => reject(upgradeError(url, res.statusCode ?? 0, body)));
    });
    ws.once("error", (e: Error) => {
      const error = new ConnectionLostError(`cannot connect to ${url.replace(/\?.*$/, "")}: ${e.message}`);
      finish(error);
      reject(error);
    });
  });
  ws.on("error", (e: Error) => finish(new ConnectionLostError(`the connection to the sandbox failed: ${e.message}`)));
  ws.on("pong", () => {
    lastHeard = Date.now();
  });
  ws.on("ping", () => {
    lastHeard = Date.now();
  });
  ws.on("message", (data: Buffer | ArrayBuffer | Buffer[], isBinary: boolean) => {
    lastHeard = Date.now();
    if (!isBinary) return; // not part of the protocol (section 2)
    const bytes = Array.isArray(data) ? Buffer.concat(data) : data instanceof ArrayBuffer ? new Uint8Array(data) : data;
    events.onMessage(new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength));
  });
  ws.on("close", (code: number, reason: Buffer) => {
    const why = reason.toString("utf8");
    finish(new ConnectionLostError(`the connection to the sandbox closed (code ${code}${why ? `: ${why}` : ""})`));
  });

  return {
    send(message) {
      if (closed) return Promise.reject(new ConnectionLostError("the connection to the sandbox is closed"));
      return new Promise((resolve, reject) => {
        ws.send(message, { binary: true }, (err) => {
          if (err) reject(new ConnectionLostError(`sending to the sandbox failed: ${err.message}`));
          else resolve();
        });
      });
    },
    close() {
      ws.close(1000);
      finish(new ConnectionLostError("the connection to the sandbox was closed by this client"));
    },
    terminate() {
      ws.terminate();
      finish(new ConnectionLostError("the connection to the sandbox was dropped by this client"));
    },
  };
}

// --- a standard WebSocket (browsers, Deno, Bun, Node 22+) -----------------------------------------

interface StandardWebSocket {
  binaryType: string;
  readonly bufferedAmount: number;
  readonly readyState: number;
  onopen: ((ev: unknown) => void) | null;
  onmessage: ((ev: { data: unknown }) => void) | null;
  onerror: ((ev: unknown) => void) | null;
  onclose: ((ev: { code: number; reason: string }) => void) | null;
  send(data: Uint8Array): void;
  close(code?: number): void;
}
type StandardWebSocketCtor = new (url: string, options?: unknown) => StandardWebSocket;

async function openStandard(
  Ctor: StandardWebSocketCtor,
  url: string,
  headers: Record<string, string>,
  events: SocketEvents,
): Promise<Socket> {
  // Node's (undici), Deno's and Bun's WebSocket take headers in a second argument; a browser
  // cannot send them, and the relay authenticates by header only (section 15).
  const ws = new Ctor(url, { headers });
  ws.binaryType = "arraybuffer";
  let closed = false;
  const finish = (error: TetherError): void => {
    if (closed) return;
    closed = true;
    events.onClose(error);
  };
  await new Promise<void>((resolve, reject) => {
    ws.onopen = () => resolve();
    ws.onerror = () => {
      const error = new ConnectionLostError(`cannot connect to ${url.replace(/\?.*$/, "")} (the upgrade failed; check the relay URL, token and sandbox id)`);
      finish(error);
      reject(error);
    };
  });
  ws.onerror = () => finish(new ConnectionLostError("the connection to the sandbox failed"));
  ws.onclose = (ev) => finish(new ConnectionLostError(`the connection to the sandbox closed (code ${ev.code}${ev.reason ? `: ${ev.reason}` : ""})`));
  ws.onmessage = (ev) => {
    if (ev.data instanceof ArrayBuffer) events.onMessage(new Uint8Array(ev.data));
  };
  return {
    async send(message) {
      if (closed) throw new ConnectionLostError("the connection to the sandbox is closed");
      ws.send(message);
      // The standard API has no drain event: wait for the buffer to empty below the mark.
      while (ws.bufferedAmount > SEND_HIGH_WATER && !closed) {
        await new Promise((r) => setTimeout(r, 5));
      }
    },
    close() {
      ws.close(1000);
      finish(new ConnectionLostError("the connection to the sandbox was closed by this client"));
    },
    terminate() {
      ws.close(1000);
      finish(new ConnectionLostError("the connection to the sandbox was dropped by this client"));
    },
  };
}
