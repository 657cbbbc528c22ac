//! A deepagentsjs backend (its `SandboxBackendProtocolV2`): `execute` runs a shell command in
//! a Tether sandbox, and every file operation uses the agent's own operation (read, write,
//! list, glob, grep, edit, batches) rather than shell scripts. Types come from `deepagents`
//! at compile time only; at run time this module needs nothing of it.

import type {
  EditResult,
  ExecuteResponse,
  FileDownloadResponse,
  FileInfo as DeepFileInfo,
  FileOperationError,
  FileUploadResponse,
  GlobResult,
  GrepResult,
  LsResult,
  ReadRawResult,
  ReadResult,
  SandboxBackendProtocolV2,
  WriteResult,
  DeleteResult,
} from "deepagents";
import { NotFoundError, PathKindError, PermissionDeniedError, TetherError } from "./errors.js";
import { Sandbox, type CreateOptions } from "./sandbox.js";
import type { FileInfo } from "./types.js";

/** Options of the backend. */
export interface TetherBackendOptions {
  /** `execute`'s timeout, in milliseconds (default 30 minutes). */
  timeoutMs?: number;
  /** Output `execute` returns, in bytes (default 100,000); more is cut, `truncated`. */
  outputLimit?: number;
  /** The most bytes one file read returns (default 10 MiB). */
  maxReadBytes?: number;
}

/** Stats `glob` keeps in flight at once to learn which matches are directories. */
const STAT_CONCURRENCY = 32; // requests

const BINARY_TYPES: Record<string, string> = {
  png: "image/png", jpg: "image/jpeg", jpeg: "image/jpeg", gif: "image/gif", webp: "image/webp",
  pdf: "application/pdf", mp3: "audio/mpeg", wav: "audio/wav", mp4: "video/mp4", zip: "application/zip",
  gz: "application/gzip", tar: "application/x-tar",
};

function mimeType(path: string): string {
  const ext = /\.([^./]+)$/.exec(path)?.[1]?.toLowerCase() ?? "";
  if (BINARY_TYPES[ext] !== undefined) return BINARY_TYPES[ext];
  if (ext === "md" || ext === "markdown") return "text/markdown";
  if (ext === "json") return "application/json";
  return "text/plain";
}

function isBinary(path: string): boolean {
  const ext = /\.([^./]+)$/.exec(path)?.[1]?.toLowerCase() ?? "";
  return ext in BINARY_TYPES;
}

function join(base: string, rel: string): string {
  if (rel.startsWith("/")) return rel;
  return `${base.replace(/\/+$/, "")}/${rel}`;
}

function operationError(e: unknown): FileOperationError {
  if (e instanceof NotFoundError) return "file_not_found";
  if (e instanceof PermissionDeniedError) return "permission_denied";
  if (e instanceof PathKindError) return e.code === "is_directory" ? "is_directory" : "invalid_path";
  return "invalid_path";
}

function batchError(code: string): FileOperationError {
  switch (code) {
    case "not_found":
      return "file_not_found";
    case "permission_denied":
      return "permission_denied";
    case "is_directory":
      return "is_directory";
    default:
      return "invalid_path";
  }
}

function message(e: unknown): string {
  return e instanceof Error ? e.message : String(e);
}

function toDeepInfo(base: string, f: FileInfo): DeepFileInfo {
  const path = join(base, f.path);
  return {
    path: f.kind === "dir" ? `${path}/` : path,
    is_dir: f.kind === "dir",
    size: f.size,
    modified_at: new Date(f.mtimeMs).toISOString(),
  };
}

/** A deepagentsjs sandbox backend on a Tether sandbox: `createDeepAgent({ backend })`. */
export class TetherBackend implements SandboxBackendProtocolV2 {
  readonly sandbox: Sandbox;
  private readonly options: TetherBackendOptions;

  constructor(sandbox: Sandbox, options: TetherBackendOptions = {}) {
    this.sandbox = sandbox;
    this.options = options;
  }

  /** Creates a sandbox and a backend on it (`deleteSandbox()` removes it again). */
  static async create(options: CreateOptions & TetherBackendOptions = {}): Promise<TetherBackend> {
    return new TetherBackend(await Sandbox.create(options), options);
  }

  /** The sandbox's id. */
  get id(): string {
    return this.sandbox.id;
  }

  /** Deletes the sandbox (`delete(path)` is deepagents' file delete). */
  async deleteSandbox(): Promise<void> {
    await this.sandbox.delete();
  }

  async execute(command: string): Promise<ExecuteResponse> {
    const result = await this.sandbox.commands.run(command, {
      mergeStderr: true,
      timeoutMs: this.options.timeoutMs ?? 30 * 60_000,
      outputLimit: this.options.outputLimit ?? 100_000,
    });
    let output = result.stdoutText;
    if (result.timedOut) output += `\n[timed out after ${(this.options.timeoutMs ?? 30 * 60_000) / 1000} s]`;
    return { output, exitCode: result.exitCode, truncated: result.truncated };
  }

  async ls(path: string): Promise<LsResult> {
    try {
      const entries = await this.sandbox.files.list(path, { depth: 1 });
      return { files: entries.map((f) => toDeepInfo(path, f)).sort((a, b) => a.path.localeCompare(b.path)) };
    } catch (e) {
      // deepagents' contract (its generic sandbox and standard suite): a directory that does
      // not exist lists as empty, not as an error.
      if (e instanceof NotFoundError) return { files: [] };
      return { error: `Error listing '${path}': ${message(e)}` };
    }
  }

  async read(filePath: string, offset = 0, limit = 500): Promise<ReadResult> {
    let bytes: Uint8Array;
    try {
      bytes = await this.sandbox.files.read(filePath, { maxBytes: this.options.maxReadBytes ?? 10 << 20 });
    } catch (e) {
      if (e instanceof NotFoundError) return { error: `File '${filePath}' not found` };
      return { error: `Error reading file '${filePath}': ${message(e)}` };
    }
    const type = mimeType(filePath);
    if (isBinary(filePath)) return { content: bytes, mimeType: type };
    const content = new TextDecoder().decode(bytes);
    if (content.trim() === "") return { content: "System reminder: File exists but has empty contents", mimeType: type };
    const start = Number.isFinite(offset) ? Math.max(0, Math.floor(offset)) : 0;
    const count = Number.isFinite(limit) ? Math.max(0, Math.floor(limit)) : 0;
    const lines = content.split("\n");
    const totalLines = lines[lines.length - 1] === "" ? lines.length - 1 : lines.length;
    if (start >= totalLines) return { error: `Line offset ${start} exceeds file length (${totalLines} lines)` };
    const end = Math.min(start + count, totalLines);
    return {
      content: lines.slice(start, Math.min(start + count, lines.length)).join("\n"),
      mimeType: type,
      totalLines,
      startLine: start + 1,
      endLine: end,
      ...(end < totalLines ? { nextOffset: end } : {}),
    };
  }

  async readRaw(filePath: string): Promise<ReadRawResult> {
    try {
      const bytes = await this.sandbox.files.read(filePath, { maxBytes: this.options.maxReadBytes ?? 10 << 20 });
      const info = await this.sandbox.files.stat(filePath);
      const when = new Date(info.mtimeMs).toISOString();
      const content = isBinary(filePath) ? bytes : new TextDecoder().decode(bytes);
      return { data: { content, mimeType: mimeType(filePath), created_at: when, modified_at: when } };
    } catch (e) {
      if (e instanceof NotFoundError) return { error: `File '${filePath}' not found` };
      return { error: `Error reading file '${filePath}': ${message(e)}` };
    }
  }

  async write(filePath: string, content: string): Promise<WriteResult> {
    try {
      await this.sandbox.files.write(filePath, content);
      return { path: filePath, filesUpdate: null };
    } catch (e) {
      return { error: `Failed to write file '${filePath}': ${message(e)}` };
    }
  }

  async edit(filePath: string, oldString: string, newString: string, replaceAll = false): Promise<EditResult> {
    try {
      if (oldString === "") {
        // The agent refuses an empty `old`; deepagents means "fill an empty file".
        const current = await this.sandbox.files.read(filePath, { maxBytes: 1 });
        if (current.length > 0) return { error: "oldString must not be empty unless the file is empty" };
        await this.sandbox.files.write(filePath, newString);
        return { path: filePath, filesUpdate: null, occurrences: newString === "" ? 0 : 1 };
      }
      const occurrences = await this.sandbox.files.edit(filePath, oldString, newString, { replaceAll });
      return { path: filePath, filesUpdate: null, occurrences };
    } catch (e) {
      if (e instanceof NotFoundError) {
        return { error: /no such file/i.test(e.message) ? `Error: File '${filePath}' not found` : `String not found in file '${filePath}'` };
      }
      if (e instanceof TetherError && e.code === "invalid_argument" && /occurs \d+ times/.test(e.message)) {
        return { error: `Multiple occurrences found in '${filePath}'. Use replace_all=true to replace all, or provide a more specific string. (${e.message})` };
      }
      return { error: `Error editing file '${filePath}': ${message(e)}` };
    }
  }

  async grep(pattern: string, path?: string | null, glob?: string | null, maxCount?: number | null): Promise<GrepResult> {
    const base = path ?? "/";
    try {
      const info = await this.sandbox.files.stat(base);
      const isFile = info.kind === "file";
      const result = await this.sandbox.files.grep(pattern, {
        path: base,
        ...(glob ? { glob } : {}),
        ...(maxCount ? { limit: maxCount } : {}),
      });
      // A searched file's matches name the file itself; a directory's are relative to it.
      const matches = result.matches.map((m) => ({ path: isFile ? base : join(base, m.path), line: m.line, text: m.text }));
      return { matches, ...(result.truncated ? { truncated: true } : {}) };
    } catch (e) {
      if (e instanceof NotFoundError) return { matches: [] };
      return { error: `Error searching '${base}': ${message(e)}` };
    }
  }

  /** Paths under `path` matching `pattern`, relative to `path` as deepagents' generic sandbox
   * and standard suite have them, directories included (`is_dir`). */
  async glob(pattern: string, path = "/"): Promise<GlobResult> {
    let result: { paths: string[]; truncated: boolean };
    try {
      result = await this.sandbox.files.glob(pattern.replace(/^\/+/, ""), { root: path });
    } catch (e) {
      if (e instanceof NotFoundError || e instanceof PathKindError) return { files: [] };
      return { error: `Error matching '${pattern}' in '${path}': ${message(e)}` };
    }
    // The agent's glob answers paths only; a stat of each says which are directories. A path
    // gone between the two is left out, as it would be had the glob come a moment later.
    const files: DeepFileInfo[] = [];
    for (let i = 0; i < result.paths.length; i += STAT_CONCURRENCY) {
      const batch = result.paths.slice(i, i + STAT_CONCURRENCY);
      const infos = await Promise.all(batch.map((p) => this.sandbox.files.stat(join(path, p)).then((info) => ({ p, info }), () => undefined)));
      for (const found of infos) {
        if (found === undefined) continue;
        const { p, info } = found;
        files.push({ path: p, is_dir: info.kind === "dir", size: info.size, modified_at: new Date(info.mtimeMs).toISOString() });
      }
    }
    files.sort((a, b) => a.path.localeCompare(b.path));
    return { files, ...(result.truncated ? { truncated: true } : {}) };
  }

  async delete(filePath: string): Promise<DeleteResult> {
    try {
      await this.sandbox.files.remove(filePath, { recursive: true });
      return { path: filePath };
    } catch (e) {
      if (e instanceof NotFoundError) return { error: `Path '${filePath}' not found` };
      return { error: `Failed to delete '${filePath}': ${message(e)}` };
    }
  }

  async uploadFiles(files: Array<[string, Uint8Array]>): Promise<FileUploadResponse[]> {
    try {
      const results = await this.sandbox.files.writeBatch(files.map(([path, data]) => ({ path, data })));
      return results.map((r) => ({ path: r.path, error: r.ok ? null : batchError(r.code) }));
    } catch (e) {
      return files.map(([path]) => ({ path, error: operationError(e) }));
    }
  }

  async downloadFiles(paths: string[]): Promise<FileDownloadResponse[]> {
    try {
      const results = await this.sandbox.files.readBatch(paths, { maxBytes: this.options.maxReadBytes ?? 10 << 20 });
      return results.map((r) => (r.ok ? { path: r.path, content: r.content ?? new Uint8Array(), error: null } : { path: r.path, content: null, error: batchError(r.code) }));
    } catch (e) {
      return paths.map((path) => ({ path, content: null, error: operationError(e) }));
    }
  }
}
