//! Ports inside a sandbox: which are listening, the preview URLs through which a browser or a
//! program reaches them on the relay (which form to hand out: preview.ts), and local TCP ports carried to them (each local connection is a
//! `connect` stream, flow-controlled end to end).

import type { Server, Socket } from "node:net";
import type { Stream } from "./protocol/connection.js";
import { fetchable, withToken } from "./preview.js";
import { expectReply, objects, str, streamError, uint } from "./protocol/fields.js";
import type { Sandbox } from "./sandbox.js";
import type { ListeningPort, PreviewInfo } from "./types.js";

function checkPort(port: number): void {
  if (!Number.isInteger(port) || port < 1 || port > 65535) throw new RangeError(`port must be 1 to 65535, not ${port}`);
}

/** A local TCP port carried to a port inside the sandbox; `close()` stops it. */
export class Forward {
  /** The local port (useful when 0 was asked for). */
  readonly localPort: number;
  private readonly server: Server;
  private readonly sockets: Set<Socket>;

  /** @internal */
  constructor(server: Server, localPort: number, sockets: Set<Socket>) {
    this.server = server;
    this.localPort = localPort;
    this.sockets = sockets;
  }

  /** `http://127.0.0.1:{localPort}`. */
  get url(): string {
    return `http://127.0.0.1:${this.localPort}`;
  }

  /** Stops listening and closes the connections being carried. */
  async close(): Promise<void> {
    for (const socket of this.sockets) socket.destroy();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }
}

/** Carries one local connection over a `connect` stream, both ways, with backpressure. */
async function carry(socket: Socket, stream: Stream): Promise<void> {
  socket.on("data", (chunk: Buffer) => {
    socket.pause();
    stream.write(new Uint8Array(chunk.buffer, chunk.byteOffset, chunk.byteLength)).then(
      () => socket.resume(),
      () => socket.destroy(),
    );
  });
  socket.on("end", () => {
    stream.eof().catch(() => socket.destroy());
  });
  socket.on("error", () => stream.cancel());
  socket.on("close", () => stream.cancel());
  try {
    for (;;) {
      const item = await stream.next();
      if (item === null) break;
      if (item.kind === "data") {
        // Take the next bytes only once the socket took these: credit follows the consumer.
        if (!socket.write(item.bytes)) await new Promise<void>((r) => socket.once("drain", r).once("close", r));
      } else if (item.message.type === "eof") {
        socket.end();
      } else if (item.message.type === "error") {
        throw streamError(item.message);
      }
    }
    socket.end();
  } catch {
    socket.destroy();
  }
}

/** Ports: `sandbox.ports`. */
export class Ports {
  private readonly sandbox: Sandbox;
  private preview: PreviewInfo | undefined;

  /** @internal */
  constructor(sandbox: Sandbox) {
    this.sandbox = sandbox;
  }

  /** The TCP ports listening inside the sandbox. */
  async list(): Promise<ListeningPort[]> {
    const stream = await (await this.sandbox.connection()).openStream("ports");
    const m = await expectReply(stream, "ports");
    return objects(m, "ports").map((p) => {
      const o: Record<string, unknown> = { type: "ports", ...p };
      return { port: uint(o, "port"), address: str(o, "address") };
    });
  }

  /** The sandbox's preview token and URL templates. */
  async previewInfo(): Promise<PreviewInfo> {
    this.preview ??= await this.sandbox.relay.preview(this.sandbox.id);
    return this.preview;
  }

  /** A URL that reaches `port` inside the sandbox through the relay, carrying the sandbox's
   * preview token: one that fetch, curl and Python's HTTP clients on this machine can fetch, and
   * a browser can open. That is the host form (`http://PORT-ID.localhost:...`, its own origin)
   * when this machine's resolver gives its name loopback addresses, the path form
   * (`http://relay/preview/ID/PORT/`, the relay's origin) otherwise; `previewHostUrl` and
   * `previewPathUrl` give each. The URL is a credential for the sandbox's previews: keep it out
   * of logs. */
  async previewUrl(port: number): Promise<string> {
    return fetchable(await this.previewHostUrl(port), await this.previewPathUrl(port));
  }

  /** The URL of `port` by host name, carrying the preview token: its own origin, for browsers
   * and curl (which resolve `*.localhost` themselves) wherever the resolver does not. */
  async previewHostUrl(port: number): Promise<string> {
    checkPort(port);
    const p = await this.previewInfo();
    return withToken(p.hostUrl, port, p.token);
  }

  /** Listens on a local TCP port (`localPort`, 0 for any; on 127.0.0.1) and carries each
   * connection to `port` inside the sandbox (dialled at `host`, default 127.0.0.1). */
  async forward(port: number, options: { localPort?: number; host?: string } = {}): Promise<Forward> {
    checkPort(port);
    const net = await import("node:net");
    const sockets = new Set<Socket>();
    const server = net.createServer((socket) => {
      sockets.add(socket);
      socket.once("close", () => sockets.delete(socket));
      this.sandbox
        .connection()
        .then((conn) => conn.openStream("connect", { port, host: options.host ?? "127.0.0.1" }))
        .then((stream) => carry(socket, stream))
        .catch(() => socket.destroy());
    });
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(options.localPort ?? 0, "127.0.0.1", () => resolve());
    });
    const address = server.address();
    const localPort = typeof address === "object" && address !== null ? address.port : 0;
    return new Forward(server, localPort, sockets);
  }

  /** The URL of `port` by path, carrying the preview token: every client that reaches the
   * relay reaches it, but it shares the relay's origin with every other sandbox's previews, and
   * an app's absolute links escape its prefix. */
  async previewPathUrl(port: number): Promise<string> {
    checkPort(port);
    const p = await this.previewInfo();
    return withToken(p.pathUrl, port, p.token);
  }
}
