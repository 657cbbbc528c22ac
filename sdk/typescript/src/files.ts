//! The sandbox's file system: read and write (atomic), metadata, listing, glob, grep, edit,
//! batches with per-file results, tar archives both ways, and watches. Downloads are bounded
//! by a byte limit, and every size and path the agent reports is checked before use. Every host
//! file written here (`downloadFile`, `downloadDir`) lands through `landing.ts`.

import { DEFAULT_MAX_DOWNLOAD } from "./constants.js";
import { ConnectionLostError, NotFoundError, ProtocolError, TooLargeError } from "./errors.js";
import { HostFile, unpackTar } from "./landing.js";
import type { Stream } from "./protocol/connection.js";
import { expectReply, flag, objects, optStr, str, streamError, uint } from "./protocol/fields.js";
import type { Sandbox } from "./sandbox.js";
import type { BatchFileResult, FileEvent, FileInfo, GlobResult, GrepResult } from "./types.js";

const encoder = new TextEncoder();
const utf8 = new TextDecoder("utf-8");

function bytesOf(data: string | Uint8Array): Uint8Array {
  return typeof data === "string" ? encoder.encode(data) : data;
}

function fileInfo(value: Record<string, unknown>): FileInfo {
  const o: Record<string, unknown> = { type: "stat", ...value };
  const kind = str(o, "kind");
  return {
    path: str(o, "path"),
    kind: kind === "file" || kind === "dir" || kind === "symlink" ? kind : "other",
    size: uint(o, "size"),
    mode: uint(o, "mode"),
    mtimeMs: typeof o["mtime_ms"] === "number" ? o["mtime_ms"] : 0,
    target: optStr(o, "target"),
  };
}

/** Passes a download's bytes on `out` to `sink` until `eof`, at most `limit` of them (past
 * that the stream is cancelled with `TooLargeError`, saying `advice`); returns how many. */
async function streamDownload(
  stream: Stream,
  limit: number,
  what: string,
  advice: string,
  sink: (bytes: Uint8Array) => void | Promise<void>,
): Promise<number> {
  let total = 0;
  let complete = false;
  for (;;) {
    const item = await stream.next();
    if (item === null) break;
    if (item.kind === "data") {
      total += item.bytes.length;
      if (total > limit) {
        stream.cancel();
        throw new TooLargeError(`${what} is larger than ${limit} bytes; ${advice}`);
      }
      await sink(item.bytes);
      continue;
    }
    const m = item.message;
    if (m.type === "error") throw streamError(m);
    if (m.type === "eof") complete = true;
  }
  if (!complete) throw new ConnectionLostError(`${what}: the download ended before it was complete`);
  return total;
}

/** Reads a download's bytes on `out` until `eof`, keeping at most `limit`. */
async function readDownload(stream: Stream, limit: number, what: string): Promise<Uint8Array> {
  const chunks: Uint8Array[] = [];
  const total = await streamDownload(stream, limit, what, "pass a larger maxBytes or read it in ranges", (bytes) => {
    chunks.push(bytes);
  });
  const out = new Uint8Array(total);
  let at = 0;
  for (const c of chunks) {
    out.set(c, at);
    at += c.length;
  }
  return out;
}

/** Sends `data` on `in`, then `eof`, and waits for the reply of `kind`. */
async function upload(stream: Stream, data: Uint8Array, kind: string): Promise<Record<string, unknown>> {
  // The agent may refuse before any data arrives (section 9, `write`): race the upload
  // against the reply so its error wins over a write that can no longer go anywhere.
  const replying = expectReply(stream, kind);
  const sending = (async () => {
    await stream.write(data);
    await stream.eof();
  })();
  sending.catch(() => undefined);
  const reply = await replying;
  await sending.catch(() => undefined);
  return reply;
}

/** A watch on a directory: iterate it for changes; `close()` stops it. */
export class Watch implements AsyncIterable<FileEvent> {
  private readonly stream: Stream;

  /** @internal */
  constructor(stream: Stream) {
    this.stream = stream;
  }

  /** The next change, or `null` once the watch ended. */
  async next(): Promise<FileEvent | null> {
    for (;;) {
      const item = await this.stream.next();
      if (item === null) return null;
      if (item.kind !== "message") continue;
      const m = item.message;
      if (m.type === "error") throw streamError(m);
      if (m.type !== "event") continue;
      switch (m["kind"]) {
        case "create":
          return { kind: "create", path: str(m, "path"), dir: flag(m, "dir") };
        case "modify":
          return { kind: "modify", path: str(m, "path") };
        case "remove":
          return { kind: "remove", path: str(m, "path"), dir: flag(m, "dir") };
        case "rename":
          return { kind: "rename", from: str(m, "from"), to: str(m, "to") };
        case "overflow":
          return { kind: "overflow" };
        default:
          continue;
      }
    }
  }

  async *[Symbol.asyncIterator](): AsyncIterator<FileEvent> {
    for (;;) {
      const e = await this.next();
      if (e === null) return;
      yield e;
    }
  }

  /** Stops watching. */
  close(): void {
    this.stream.cancel();
  }
}

/** The file system: `sandbox.files`. Relative paths are relative to the agent's working
 * directory. */
export class Files {
  private readonly sandbox: Sandbox;

  /** @internal */
  constructor(sandbox: Sandbox) {
    this.sandbox = sandbox;
  }

  private async request(op: string, fields: Record<string, unknown>, reply: string): Promise<Record<string, unknown>> {
    const stream = await (await this.sandbox.connection()).openStream(op, fields);
    return expectReply(stream, reply);
  }

  /** A file's bytes (or `len` bytes from `offset`); at most `maxBytes` (256 MiB) are kept. */
  async read(path: string, options: { offset?: number; len?: number; maxBytes?: number } = {}): Promise<Uint8Array> {
    const fields: Record<string, unknown> = { path };
    if (options.offset !== undefined) fields["offset"] = options.offset;
    if (options.len !== undefined) fields["len"] = options.len;
    const stream = await (await this.sandbox.connection()).openStream("read", fields);
    const first = await stream.next();
    if (first === null) throw new ProtocolError(`read ${path}: the stream closed without a reply`);
    if (first.kind === "message" && first.message.type === "error") throw streamError(first.message);
    if (first.kind !== "message" || first.message.type !== "reply") throw new ProtocolError(`read ${path}: expected a stat reply first`);
    return readDownload(stream, options.maxBytes ?? DEFAULT_MAX_DOWNLOAD, path);
  }

  /** A file's text, decoded as UTF-8 (invalid bytes replaced). */
  async readText(path: string, options: { maxBytes?: number } = {}): Promise<string> {
    return utf8.decode(await this.read(path, options));
  }

  /**
   * Writes a file atomically (readers see the old file or the new one). Parent directories
   * are created unless `createParents: false`. Returns the bytes written.
   */
  async write(
    path: string,
    data: string | Uint8Array,
    options: { mode?: number; createParents?: boolean; ifExists?: "overwrite" | "fail" | "append" } = {},
  ): Promise<number> {
    const fields: Record<string, unknown> = { path, create_parents: options.createParents ?? true };
    if (options.mode !== undefined) fields["mode"] = options.mode;
    if (options.ifExists !== undefined) fields["if_exists"] = options.ifExists;
    const stream = await (await this.sandbox.connection()).openStream("write", fields);
    return uint(await upload(stream, bytesOf(data), "written"), "bytes");
  }

  /** A path's metadata (symlinks not followed). */
  async stat(path: string): Promise<FileInfo> {
    return fileInfo(await this.request("stat", { path }, "stat"));
  }

  /** Whether a path exists. */
  async exists(path: string): Promise<boolean> {
    try {
      await this.stat(path);
      return true;
    } catch (e) {
      if (e instanceof NotFoundError) return false;
      throw e;
    }
  }

  /** A directory's entries, `depth` levels down, paths relative to it. */
  async list(path = ".", options: { depth?: number } = {}): Promise<FileInfo[]> {
    const m = await this.request("list", { path, depth: options.depth ?? 1 }, "entries");
    return objects(m, "entries").map(fileInfo);
  }

  /** Creates a directory and its parents, like `mkdir -p`. */
  async mkdir(path: string, options: { mode?: number } = {}): Promise<void> {
    await this.request("mkdir", options.mode === undefined ? { path } : { path, mode: options.mode }, "ok");
  }

  /** Removes a file, symlink or directory (`recursive` for a non-empty one). */
  async remove(path: string, options: { recursive?: boolean } = {}): Promise<void> {
    await this.request("remove", { path, recursive: options.recursive ?? false }, "ok");
  }

  /** Renames (moves) a path. */
  async rename(from: string, to: string, options: { overwrite?: boolean } = {}): Promise<void> {
    await this.request("rename", { from, to, overwrite: options.overwrite ?? false }, "ok");
  }

  /** Changes a path's permission bits, e.g. `0o755`. */
  async chmod(path: string, mode: number): Promise<void> {
    await this.request("chmod", { path, mode }, "ok");
  }

  /** Paths under `root` matching a glob (`src/**\/*.ts`), relative to `root`. */
  async glob(pattern: string, options: { root?: string; limit?: number } = {}): Promise<GlobResult> {
    const fields: Record<string, unknown> = { root: options.root ?? ".", pattern };
    if (options.limit !== undefined) fields["limit"] = options.limit;
    const m = await this.request("glob", fields, "paths");
    const paths = m["paths"];
    if (!Array.isArray(paths) || !paths.every((p) => typeof p === "string")) throw new ProtocolError("`paths` reply without a list of paths");
    return { paths: paths as string[], truncated: flag(m, "truncated") };
  }

  /** Lines matching a literal (or, with `regex`, a regular expression) under `path`. */
  async grep(
    pattern: string,
    options: { path?: string; regex?: boolean; ignoreCase?: boolean; glob?: string; limit?: number } = {},
  ): Promise<GrepResult> {
    const fields: Record<string, unknown> = { path: options.path ?? ".", pattern };
    if (options.regex === true) fields["regex"] = true;
    if (options.ignoreCase === true) fields["ignore_case"] = true;
    if (options.glob !== undefined) fields["glob"] = options.glob;
    if (options.limit !== undefined) fields["limit"] = options.limit;
    const m = await this.request("grep", fields, "matches");
    const matches = objects(m, "matches").map((x) => {
      const o: Record<string, unknown> = { type: "matches", ...x };
      return { path: str(o, "path"), line: uint(o, "line"), text: str(o, "text") };
    });
    return { matches, truncated: flag(m, "truncated") };
  }

  /** Replaces `old` with `new` in a text file, atomically; `old` must occur exactly once
   * unless `replaceAll`. Returns the number of replacements. */
  async edit(path: string, oldText: string, newText: string, options: { replaceAll?: boolean } = {}): Promise<number> {
    const m = await this.request("edit", { path, old: oldText, new: newText, replace_all: options.replaceAll ?? false }, "edited");
    return uint(m, "replacements");
  }

  /** Writes many files in one upload (parents created). One file failing does not stop the
   * others: each result says `ok` or why not. */
  async writeBatch(files: readonly { path: string; data: string | Uint8Array; mode?: number }[]): Promise<BatchFileResult[]> {
    const bodies = files.map((f) => bytesOf(f.data));
    const total = bodies.reduce((n, b) => n + b.length, 0);
    const all = new Uint8Array(total);
    let at = 0;
    for (const b of bodies) {
      all.set(b, at);
      at += b.length;
    }
    const spec = files.map((f, i) => ({ path: f.path, size: bodies[i]!.length, ...(f.mode === undefined ? {} : { mode: f.mode }) }));
    const stream = await (await this.sandbox.connection()).openStream("write_batch", { files: spec });
    const m = await upload(stream, all, "batch");
    return batchResults(m, files.map((f) => f.path));
  }

  /** Reads many files in one download; each result has its `content` or why not. At most
   * `maxBytes` (256 MiB) in all. */
  async readBatch(paths: readonly string[], options: { maxBytes?: number } = {}): Promise<BatchFileResult[]> {
    const limit = options.maxBytes ?? DEFAULT_MAX_DOWNLOAD;
    const stream = await (await this.sandbox.connection()).openStream("read_batch", { paths: [...paths] });
    const first = await stream.next();
    if (first === null) throw new ProtocolError("read_batch closed without a reply");
    if (first.kind === "message" && first.message.type === "error") throw streamError(first.message);
    if (first.kind !== "message" || first.message["reply"] !== "batch") throw new ProtocolError("read_batch: expected a batch reply first");
    const results = batchResults(first.message, paths);
    const expected = results.reduce((n, r) => n + (r.ok ? r.size : 0), 0);
    if (expected > limit) {
      stream.cancel();
      throw new TooLargeError(`the files add up to ${expected} bytes, more than maxBytes ${limit}`);
    }
    const bytes = await readDownload(stream, expected, "read_batch");
    if (bytes.length !== expected) throw new ProtocolError(`read_batch sent ${bytes.length} bytes, not the ${expected} announced`);
    let at = 0;
    return results.map((r) => {
      if (!r.ok) return r;
      const content = bytes.subarray(at, at + r.size);
      at += r.size;
      return { ...r, content };
    });
  }

  /** A directory (or file) as an uncompressed tar archive, at most `maxBytes`. */
  async readTar(path: string, options: { exclude?: readonly string[]; maxBytes?: number } = {}): Promise<Uint8Array> {
    const stream = await (await this.sandbox.connection()).openStream("tar_read", { path, exclude: [...(options.exclude ?? [])] });
    return readDownload(stream, options.maxBytes ?? DEFAULT_MAX_DOWNLOAD, `tar of ${path}`);
  }

  /**
   * Streams a sandbox file to the host file `local` (at most `maxBytes`); returns its size.
   * It lands through `landing.ts`: under a fresh random name beside `local`, renamed over it
   * when complete (a symlink at `local` is replaced, never written through), removed if the
   * download fails; with the sandbox's permission bits (never setuid).
   */
  async downloadFile(path: string, local: string, options: { maxBytes?: number } = {}): Promise<number> {
    const limit = options.maxBytes ?? DEFAULT_MAX_DOWNLOAD;
    const stream = await (await this.sandbox.connection()).openStream("read", { path });
    const first = await stream.next();
    if (first === null) throw new ProtocolError(`read ${path}: the stream closed without a reply`);
    if (first.kind === "message" && first.message.type === "error") throw streamError(first.message);
    if (first.kind !== "message" || first.message.type !== "reply") throw new ProtocolError(`read ${path}: expected a stat reply first`);
    const mode = fileInfo(first.message).mode;
    const file = await HostFile.beside(local);
    try {
      const total = await streamDownload(stream, limit, path, "pass a larger maxBytes", (bytes) => file.write(bytes));
      await file.land(mode);
      return total;
    } finally {
      await file.discard();
    }
  }

  /**
   * Copies the sandbox directory `path` into the host directory `local` (created if missing);
   * returns the names written. Everything lands through `landing.ts`: entries that would land
   * outside `local` (absolute names, `..`, symlinks that lead out on the real tree, anything
   * through a symlink already in `local`) are refused, as are hard links and devices.
   */
  async downloadDir(path: string, local: string, options: { exclude?: readonly string[]; maxBytes?: number } = {}): Promise<string[]> {
    const limit = options.maxBytes ?? DEFAULT_MAX_DOWNLOAD;
    return unpackTar(await this.readTar(path, { ...options, maxBytes: limit }), local, limit);
  }

  /** Unpacks a tar (or, with `gzip`, tar.gz) archive into a directory, created if missing. */
  async writeTar(path: string, archive: Uint8Array, options: { gzip?: boolean } = {}): Promise<void> {
    const stream = await (await this.sandbox.connection()).openStream("tar_write", { path, gzip: options.gzip ?? false });
    await upload(stream, archive, "ok");
  }

  /** Watches a directory; resolves once the watch is armed (later changes are reported). */
  async watch(path: string, options: { recursive?: boolean } = {}): Promise<Watch> {
    const stream = await (await this.sandbox.connection()).openStream("watch", { path, recursive: options.recursive ?? true });
    await expectReply(stream, "ok");
    return new Watch(stream);
  }
}

function batchResults(m: Record<string, unknown>, paths: readonly string[]): BatchFileResult[] {
  const results = objects({ type: "batch", ...m }, "results");
  if (results.length !== paths.length) throw new ProtocolError(`a batch reply with ${results.length} results for ${paths.length} files`);
  return results.map((r, i) => {
    const o: Record<string, unknown> = { type: "batch", ...r };
    // Report the path we asked for: the agent's echo is not trusted to name our files.
    const path = paths[i]!;
    if (typeof o["error"] === "string") {
      return { path, ok: false, code: o["error"], message: typeof o["message"] === "string" ? o["message"].slice(0, 4000) : o["error"] };
    }
    return { path, ok: true, size: uint(o, "size") };
  });
}
