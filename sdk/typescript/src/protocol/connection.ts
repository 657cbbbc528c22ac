//! One WebSocket to a sandbox's agent (directly or through the relay) and the streams on it:
//! the handshake, stream ids, per-stream credit flow control in both directions, and the end
//! of every stream. The rest of the SDK opens streams and reads their items; it never sees a
//! frame. Everything the agent sends is checked: data beyond the credit we granted, data for a
//! stream we did not open, or a malformed frame fail that stream or the connection, never us.

import { CLIENT_NAME, DATA_CHUNK, HANDSHAKE_TIMEOUT_MS, INITIAL_WINDOW, MAX_SEND_CREDIT, MAX_WINDOW, PROTOCOL_VERSION } from "../constants.js";
import { ConnectionLostError, errorFromCode, ProtocolError, TetherError } from "../errors.js";
import { type Channel, decodeFrame, encodeControl, encodeData, encodeWindow, type Message } from "./frames.js";
import { openSocket, type Socket } from "./socket.js";

export type { Channel, Message } from "./frames.js";

/** One thing a stream delivers, in the agent's order. */
export type StreamItem =
  | { kind: "data"; channel: Channel; bytes: Uint8Array }
  | { kind: "message"; message: Message; size: number };

/** The most bytes of control messages a stream queues unread: watch events are not
 * flow-controlled, so an agent that floods them fails its stream instead of our memory. */
const MAX_QUEUED_MESSAGE_BYTES = 16 << 20; // 16 MiB

/** One operation on a connection. Read it with `next()` until it returns `null` (`closed`). */
export class Stream {
  readonly id: number;
  private readonly conn: Connection;
  private readonly window: number;
  private readonly items: StreamItem[] = [];
  private head = 0;
  private queuedMessageBytes = 0;
  private waiter: (() => void) | undefined;
  /** Credit we granted and the agent has not used yet. */
  private outstanding: number;
  /** Bytes the consumer took since our last grant. */
  private consumed = 0;
  /** Credit the agent granted us for `in`, minus what we sent. */
  private sendCredit = INITIAL_WINDOW;
  private creditWaiter: (() => void) | undefined;
  private ended = false;
  private failure: TetherError | undefined;

  /** @internal */
  constructor(conn: Connection, id: number, window: number) {
    this.conn = conn;
    this.id = id;
    this.window = window;
    this.outstanding = window;
  }

  /** Whether the agent ended the stream (or the connection went) and every item was read. */
  get finished(): boolean {
    return this.ended && this.head === this.items.length;
  }

  /** The next item, or `null` once the stream is closed. Throws `ConnectionLostError` if the
   * connection ends first (after every item that arrived before it). */
  async next(): Promise<StreamItem | null> {
    for (;;) {
      if (this.head < this.items.length) {
        const item = this.items[this.head]!;
        this.items[this.head] = undefined as unknown as StreamItem;
        this.head += 1;
        if (this.head > 1024 && this.head * 2 > this.items.length) {
          this.items.splice(0, this.head);
          this.head = 0;
        }
        if (item.kind === "data") this.took(item.bytes.length);
        else this.queuedMessageBytes -= item.size;
        return item;
      }
      if (this.failure !== undefined) throw this.failure;
      if (this.ended) return null;
      await new Promise<void>((resolve) => {
        this.waiter = resolve;
      });
    }
  }

  /** Returns credit for bytes the consumer took, half a window at a time (section 8). */
  private took(bytes: number): void {
    this.consumed += bytes;
    if (this.consumed >= Math.max(1, this.window >> 1) && !this.ended) {
      const credit = this.consumed;
      this.consumed = 0;
      this.outstanding += credit;
      this.conn.sendQuietly(encodeWindow(this.id, credit));
    }
  }

  /** Sends bytes on `in`, within the agent's credit, in chunks of `DATA_CHUNK`; `onSent`
   * hears how many bytes have gone to the socket so far (a caller resuming after a failure
   * knows where to start). */
  async write(data: Uint8Array, onSent?: (bytes: number) => void): Promise<void> {
    let offset = 0;
    while (offset < data.length) {
      if (this.ended) throw this.failure ?? new ConnectionLostError(`stream ${this.id} ended while sending`);
      if (this.sendCredit <= 0) {
        await new Promise<void>((resolve) => {
          this.creditWaiter = resolve;
        });
        continue;
      }
      const len = Math.min(DATA_CHUNK, this.sendCredit, data.length - offset);
      this.sendCredit -= len;
      await this.conn.send(encodeData(this.id, "in", data.subarray(offset, offset + len)));
      offset += len;
      onSent?.(offset);
    }
  }

  /** Ends `in` (the process reads end-of-file; an upload is complete). */
  async eof(): Promise<void> {
    if (!this.ended) await this.conn.send(encodeControl({ type: "eof", stream: this.id, channel: "in" }));
  }

  /** Abandons the stream; the agent answers `closed` (section 7). Never throws. */
  cancel(): void {
    if (!this.ended) this.conn.sendQuietly(encodeControl({ type: "cancel", stream: this.id }));
  }

  /** Signals the stream's process (or its group). */
  async signal(signal: string, group: boolean): Promise<void> {
    await this.conn.send(encodeControl({ type: "signal", stream: this.id, signal, group }));
  }

  /** Resizes the stream's terminal. */
  async resize(cols: number, rows: number): Promise<void> {
    await this.conn.send(encodeControl({ type: "resize", stream: this.id, cols, rows }));
  }

  // --- called by the connection's reader --------------------------------------------------------

  /** @internal */
  pushData(channel: Channel, bytes: Uint8Array): void {
    if (this.ended) return;
    if (channel === "in") return this.violate(`the agent sent data on \`in\` of stream ${this.id}`);
    if (bytes.length > this.outstanding) {
      return this.violate(`the agent sent ${bytes.length} bytes on stream ${this.id} with ${this.outstanding} bytes of credit`);
    }
    this.outstanding -= bytes.length;
    this.push({ kind: "data", channel, bytes });
  }

  /** @internal */
  pushMessage(message: Message, size: number): void {
    if (this.ended) return;
    if (this.queuedMessageBytes + size > MAX_QUEUED_MESSAGE_BYTES) {
      return this.violate(`stream ${this.id} has over ${MAX_QUEUED_MESSAGE_BYTES} bytes of unread messages; the reader fell too far behind`);
    }
    this.queuedMessageBytes += size;
    this.push({ kind: "message", message, size });
  }

  /** @internal */
  grant(credit: number): void {
    this.sendCredit = Math.min(this.sendCredit + credit, MAX_SEND_CREDIT);
    const waiter = this.creditWaiter;
    this.creditWaiter = undefined;
    waiter?.();
  }

  /** @internal the agent's `closed`, or the connection's end (with `failure`). */
  end(failure?: TetherError): void {
    if (this.ended) return;
    this.ended = true;
    this.failure = failure;
    this.wake();
    const waiter = this.creditWaiter;
    this.creditWaiter = undefined;
    waiter?.();
  }

  private violate(why: string): void {
    this.cancel();
    this.conn.forget(this.id);
    this.end(new ProtocolError(why));
  }

  private push(item: StreamItem): void {
    this.items.push(item);
    this.wake();
  }

  private wake(): void {
    const waiter = this.waiter;
    this.waiter = undefined;
    waiter?.();
  }
}

/** Where and how to connect. */
export interface ConnectOptions {
  /** `ws://` or `wss://` URL of the agent or of the relay's `/v1/sandboxes/{id}/ws`. */
  url: string;
  /** A bearer token sent at the upgrade (the relay's API token, or an agent token). */
  token?: string;
}

/** A connection to one sandbox: open with `Connection.open`, then `openStream`. */
export class Connection {
  private socket!: Socket;
  private readonly streams = new Map<number, Stream>();
  private nextId = 1;
  private closedWith: TetherError | undefined;
  private welcome: Message | undefined;
  private handshake: { resolve: (m: Message) => void; reject: (e: TetherError) => void } | undefined;
  /** The capabilities the agent announced. */
  capabilities: ReadonlySet<string> = new Set();
  /** The agent's version, from `welcome`. */
  agentVersion = "";
  /** Called once when the connection ends. */
  onClose: ((error: TetherError) => void) | undefined;

  private constructor() {}

  /** Opens the WebSocket and completes the handshake (section 4). */
  static async open(options: ConnectOptions): Promise<Connection> {
    const conn = new Connection();
    const headers: Record<string, string> = {};
    if (options.token !== undefined) headers["Authorization"] = `Bearer ${options.token}`;
    const welcome = new Promise<Message>((resolve, reject) => {
      conn.handshake = { resolve, reject };
    });
    welcome.catch(() => undefined); // a failed upgrade rejects it with nobody waiting yet
    conn.socket = await openSocket(options.url, headers, {
      onMessage: (m) => conn.dispatch(m),
      onClose: (e) => conn.closed(e),
    });
    conn.sendQuietly(encodeControl({ type: "hello", protocol: PROTOCOL_VERSION, client: CLIENT_NAME }));
    let timer: ReturnType<typeof setTimeout> | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(
        () => reject(new ConnectionLostError(`the agent did not answer hello within ${HANDSHAKE_TIMEOUT_MS / 1000} s`)),
        HANDSHAKE_TIMEOUT_MS,
      );
    });
    try {
      const message = await Promise.race([welcome, timeout]);
      const caps = message["capabilities"];
      conn.capabilities = new Set(Array.isArray(caps) ? caps.filter((c): c is string => typeof c === "string") : []);
      conn.agentVersion = typeof message["agent_version"] === "string" ? message["agent_version"] : "";
      return conn;
    } catch (e) {
      conn.socket.terminate();
      throw e;
    } finally {
      clearTimeout(timer);
    }
  }

  /** Whether the connection has ended. */
  get isClosed(): boolean {
    return this.closedWith !== undefined;
  }

  /** Opens a stream for `op` with its fields; `window` is the credit granted for its output. */
  async openStream(op: string, fields: Record<string, unknown> = {}, window = INITIAL_WINDOW): Promise<Stream> {
    if (this.closedWith !== undefined) throw this.closedWith;
    const win = Math.max(1, Math.min(MAX_WINDOW, Math.floor(window)));
    const id = this.allocateId();
    const stream = new Stream(this, id, win);
    this.streams.set(id, stream);
    await this.send(encodeControl({ ...fields, type: "open", stream: id, window: win, op }));
    return stream;
  }

  /** Closes normally; every open stream ends with `ConnectionLostError`. */
  close(): void {
    this.socket.close();
  }

  /** Drops the connection at once, as a network failure would. */
  terminate(): void {
    this.socket.terminate();
  }

  /** @internal */
  async send(frame: Uint8Array): Promise<void> {
    if (this.closedWith !== undefined) throw this.closedWith;
    await this.socket.send(frame);
  }

  /** @internal sends without waiting; a failure shows up as the connection's end. */
  sendQuietly(frame: Uint8Array): void {
    this.send(frame).catch(() => undefined);
  }

  /** @internal a stream the agent misbehaved on: its later frames are dropped. */
  forget(id: number): void {
    this.streams.delete(id);
  }

  private allocateId(): number {
    // Count up from 1; after a wrap skip 0 and ids still open (section 7).
    for (;;) {
      const id = this.nextId;
      this.nextId = id >= 0xffffffff ? 1 : id + 1;
      if (!this.streams.has(id)) return id;
    }
  }

  private dispatch(raw: Uint8Array): void {
    let frame;
    try {
      frame = decodeFrame(raw);
    } catch {
      // A malformed frame from the agent is logged and dropped (section 6: no error back).
      return;
    }
    if (frame.kind === "data") {
      this.streams.get(frame.stream)?.pushData(frame.channel, frame.payload);
      return;
    }
    if (frame.kind === "window") {
      this.streams.get(frame.stream)?.grant(frame.credit);
      return;
    }
    const message = frame.message;
    if (this.welcome === undefined) return this.onHandshake(message);
    const stream = typeof message["stream"] === "number" ? message["stream"] : 0;
    if (stream === 0) return; // a message error: a frame of ours was refused; nothing else changes
    const target = this.streams.get(stream);
    if (target === undefined) return;
    if (message.type === "closed") {
      this.streams.delete(stream);
      target.end();
      return;
    }
    target.pushMessage(message, raw.length);
  }

  private onHandshake(message: Message): void {
    if (message.type === "welcome") {
      this.welcome = message;
      this.handshake?.resolve(message);
    } else if (message.type === "error") {
      const code = typeof message["code"] === "string" ? message["code"] : "internal";
      const text = typeof message["message"] === "string" ? message["message"] : "handshake refused";
      this.handshake?.reject(errorFromCode(code, `the agent refused the connection: ${text}`));
    }
  }

  private closed(error: TetherError): void {
    if (this.closedWith !== undefined) return;
    this.closedWith = error;
    this.handshake?.reject(error);
    for (const stream of this.streams.values()) stream.end(error);
    this.streams.clear();
    this.onClose?.(error);
  }
}
