//! How bytes from a sandbox land on this machine: the one discipline every host-side write of
//! this SDK goes through (`files.downloadFile`, `files.downloadDir`). The same as the Python
//! SDK's `_landing.py` and the CLI's `client/src/hostfs`.
//!
//! The sandbox is hostile, and what it sent before (through `downloadDir`, `tether sync` pulls
//! or `tether cp`, which keep links as links) may already stand where we write. So:
//! - Names from the sandbox are checked component by component (`entryParts`): no absolute
//!   name, no `..`, no NUL, no component over 255 bytes, no name over 4,095 bytes.
//! - Directories below a destination are walked one component at a time with `lstat`: a
//!   symlink or a file on the way is refused, never followed, and the directory reached is
//!   checked with `realpath` to be the one below the destination's real path (Node has no
//!   `openat`; the sandbox cannot change the host tree between the two). The destination
//!   itself is the caller's choice and may be reached through the caller's own links.
//! - Files are written under a fresh random name opened with `O_CREAT | O_EXCL | O_NOFOLLOW`
//!   and mode 0o600 in their final directory (`HostFile`), so nothing planted at any name is
//!   ever opened; complete, they get their mode and are renamed into place, and `rename`
//!   replaces a symlink standing at the final name instead of following it. A file that
//!   never completes is removed: the old file, or none, stays.
//! - Symlinks are made after every file and directory (`Dest.symlinks`), each only if its
//!   target, resolved against the tree on disk (following the links already there, as the
//!   kernel would, not lexically), stays inside the destination. Once all are made each is
//!   resolved again, since a later link can change where an earlier one leads; one that now
//!   leads out is removed (it is ours: just made, and still the same link) and the download
//!   fails.

import { randomBytes } from "node:crypto";
import { constants, promises as fs, type Stats } from "node:fs";
import { basename, dirname, join } from "node:path";
import { MAX_TAR_ENTRIES } from "./constants.js";
import { ProtocolError, TooLargeError } from "./errors.js";
import { readTar } from "./tar.js";

/** Bytes in one component of a name from the sandbox (NAME_MAX). */
const MAX_NAME_BYTES = 255;
/** Bytes in a whole name or link target from the sandbox (PATH_MAX - 1). */
const MAX_PATH_BYTES = 4095;
/** Links followed resolving one link target, as the kernel allows. */
const MAX_LINK_HOPS = 40;
/** Temporary names: this prefix and `TEMP_RANDOM_BYTES` random bytes in hex. */
const TEMP_PREFIX = ".tether-";
/** 48 random bits per temporary name. */
const TEMP_RANDOM_BYTES = 6;
/** Fresh names tried before giving up (each taken: someone else's). */
const TEMP_ATTEMPTS = 16;
/** A temporary file's mode until it is complete: no one else reads a partial file. */
const TEMP_MODE = 0o600;
/** Mode of a directory made on the way to a file (the umask applies). */
const NEW_DIR_MODE = 0o755;

const TEMP_FLAGS = constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW;

const encoder = new TextEncoder();
const byteLength = (s: string): number => encoder.encode(s).length;
const tempName = (): string => TEMP_PREFIX + randomBytes(TEMP_RANDOM_BYTES).toString("hex");
const shownName = (s: string): string => JSON.stringify(s.slice(0, 200));

function errno(e: unknown): string | undefined {
  return typeof e === "object" && e !== null && "code" in e ? String((e as { code: unknown }).code) : undefined;
}

async function lstatOrNull(path: string): Promise<Stats | null> {
  try {
    return await fs.lstat(path);
  } catch (e) {
    if (errno(e) === "ENOENT" || errno(e) === "ENOTDIR") return null;
    throw e;
  }
}

/** The components of `name`, a path relative to a destination as the sandbox sent it; throws
 * `ProtocolError` for one that could leave the destination or that no file system takes.
 * `.` and empty components are dropped (`./a//b` is `a/b`). */
export function entryParts(name: string): string[] {
  const shown = shownName(name);
  if (name.includes("\0")) throw new ProtocolError(`the sandbox sent a name with a NUL byte: ${shown}`);
  if (name.startsWith("/")) throw new ProtocolError(`the sandbox sent an absolute name: ${shown}; refused`);
  if (byteLength(name) > MAX_PATH_BYTES) throw new ProtocolError(`the sandbox sent a name over ${MAX_PATH_BYTES} bytes: ${shown}`);
  const parts = name.split("/").filter((p) => p !== "" && p !== ".");
  for (const part of parts) {
    if (part === "..") throw new ProtocolError(`the sandbox sent a name with \`..\`: ${shown}; refused`);
    if (byteLength(part) > MAX_NAME_BYTES) throw new ProtocolError(`the sandbox sent a name with a component over ${MAX_NAME_BYTES} bytes: ${shown}`);
  }
  return parts;
}

/** A file being written under a temporary name in `dir`; `land()` renames it to `name` there,
 * `discard()` (call it in a `finally`) removes it unless it landed. */
export class HostFile {
  private landed = false;

  private constructor(
    private readonly handle: fs.FileHandle,
    private readonly dir: string,
    private readonly tmp: string,
    private readonly name: string,
  ) {}

  /** A new empty file beside `local`, the caller's own path (its directory may be reached
   * through the caller's links; a symlink at `local` itself is replaced, never written through). */
  static async beside(local: string): Promise<HostFile> {
    const name = basename(local);
    if (name === "" || name === "." || name === ".." || local.endsWith("/")) {
      throw new ProtocolError(`${local} names no file; give the file's path`);
    }
    return HostFile.create(dirname(local), name);
  }

  /** A new empty file in the directory `dir`, to land as `name`. */
  static async create(dir: string, name: string): Promise<HostFile> {
    let last: unknown;
    for (let i = 0; i < TEMP_ATTEMPTS; i++) {
      const tmp = tempName();
      try {
        return new HostFile(await fs.open(join(dir, tmp), TEMP_FLAGS, TEMP_MODE), dir, tmp, name);
      } catch (e) {
        if (errno(e) !== "EEXIST") throw e;
        last = e;
      }
    }
    throw new Error(`could not make a temporary file beside ${join(dir, name)}: every name was taken (${String(last)})`);
  }

  async write(data: Uint8Array): Promise<void> {
    let at = 0;
    while (at < data.length) at += (await this.handle.write(data, at, data.length - at)).bytesWritten;
  }

  /** Gives the file `mode` (permission bits only: never setuid) and renames it into place,
   * replacing a file or symlink there (a directory there is an error). */
  async land(mode: number): Promise<void> {
    await this.handle.chmod(mode & 0o777);
    await this.handle.close();
    try {
      await fs.rename(join(this.dir, this.tmp), join(this.dir, this.name));
    } catch (e) {
      if (errno(e) === "EISDIR") throw new Error(`${join(this.dir, this.name)} is a directory; remove it or choose another name`);
      throw e;
    }
    this.landed = true;
  }

  /** Removes the file unless it landed. */
  async discard(): Promise<void> {
    if (this.landed) return;
    await this.handle.close().catch(() => undefined);
    await fs.unlink(join(this.dir, this.tmp)).catch(() => undefined);
    this.landed = true;
  }
}

/** A destination directory; everything below it is reached without following links. */
export class Dest {
  private readonly links: [string[], string][] = [];

  private constructor(
    readonly path: string,
    private readonly real: string,
  ) {}

  /** Opens `path`, created (with its parents) if missing. */
  static async open(path: string): Promise<Dest> {
    await fs.mkdir(path, { recursive: true });
    return new Dest(path, await fs.realpath(path));
  }

  shown(parts: readonly string[]): string {
    return join(this.path, ...parts);
  }

  private notADirectory(parts: readonly string[]): ProtocolError {
    return new ProtocolError(
      `${this.shown(parts)} is a symlink or a file, not a directory; nothing is written through it (remove it to download here)`,
    );
  }

  /** The real path of the directory `parts`, made (with what is above it) when `create`. */
  private async walk(parts: readonly string[], create: boolean): Promise<string> {
    let here = this.real;
    for (let i = 0; i < parts.length; i++) {
      here = join(here, parts[i]!);
      let st = await lstatOrNull(here);
      if (st === null && create) {
        await fs.mkdir(here, NEW_DIR_MODE).catch((e: unknown) => {
          if (errno(e) !== "EEXIST") throw e;
        });
        st = await lstatOrNull(here);
      }
      if (st === null) throw Object.assign(new Error(`${this.shown(parts.slice(0, i + 1))} does not exist`), { code: "ENOENT" });
      if (!st.isDirectory()) throw this.notADirectory(parts.slice(0, i + 1));
    }
    if ((await fs.realpath(here)) !== here) throw this.notADirectory(parts);
    return here;
  }

  /** The directory `parts`, given `mode` (and always 0o700, so what goes in can be written). */
  async mkdir(parts: readonly string[], mode: number): Promise<void> {
    if (parts.length === 0) return; // the destination is the caller's, and keeps its mode
    const dir = await this.walk(parts, true);
    const handle = await fs.open(dir, constants.O_RDONLY | constants.O_DIRECTORY | constants.O_NOFOLLOW);
    try {
      await handle.chmod((mode & 0o777) | 0o700);
    } finally {
      await handle.close();
    }
  }

  /** The file `parts` with `data`, landed whole or not at all. */
  async writeFile(parts: readonly string[], data: Uint8Array, mode: number): Promise<void> {
    if (parts.length === 0) throw new ProtocolError("the sandbox sent a file with no name");
    const file = await HostFile.create(await this.walk(parts.slice(0, -1), true), parts[parts.length - 1]!);
    try {
      await file.write(data);
      await file.land(mode);
    } finally {
      await file.discard();
    }
  }

  /** Records the symlink `parts -> target`, made by `symlinks()` once everything else is in
   * place; refuses at once a target no resolution could keep inside. */
  addSymlink(parts: readonly string[], target: string): void {
    const shown = `${parts.join("/")} -> ${shownName(target)}`;
    if (parts.length === 0) throw new ProtocolError("the sandbox sent a symlink with no name");
    if (target === "" || target.includes("\0") || byteLength(target) > MAX_PATH_BYTES) {
      throw new ProtocolError(`the sandbox sent a symlink with an invalid target: ${shown}`);
    }
    if (target.startsWith("/")) throw new ProtocolError(`the archive's symlink ${shown} points outside its directory`);
    this.links.push([[...parts], target]);
  }

  /** Makes the recorded symlinks, each checked against the tree as it stands; returns their
   * names. */
  async symlinks(): Promise<string[]> {
    const made: [string[], string][] = [];
    for (const [parts, target] of this.links) {
      if ((await this.resolve(parts.slice(0, -1), target)) === null) {
        throw new ProtocolError(`the archive's symlink ${parts.join("/")} -> ${shownName(target)} leads outside its directory`);
      }
      await this.makeLink(parts, target);
      made.push([parts, target]);
    }
    // A later link may have changed where an earlier one leads: check them all again.
    const escaping: [string[], string][] = [];
    for (const [parts, target] of made) {
      if ((await this.resolve(parts.slice(0, -1), target)) === null) escaping.push([parts, target]);
    }
    for (const [parts, target] of escaping) await this.removeOwnLink(parts, target);
    if (escaping.length > 0) {
      const [parts, target] = escaping[0]!;
      throw new ProtocolError(
        `the archive's symlink ${parts.join("/")} -> ${shownName(target)} leads outside its directory through the links after it; removed`,
      );
    }
    return made.map(([p]) => p.join("/"));
  }

  private async makeLink(parts: readonly string[], target: string): Promise<void> {
    const dir = await this.walk(parts.slice(0, -1), true);
    for (let i = 0; i < TEMP_ATTEMPTS; i++) {
      const tmp = join(dir, tempName());
      try {
        await fs.symlink(target, tmp);
      } catch (e) {
        if (errno(e) === "EEXIST") continue;
        throw e;
      }
      try {
        await fs.rename(tmp, join(dir, parts[parts.length - 1]!));
      } catch (e) {
        await fs.unlink(tmp).catch(() => undefined);
        throw e;
      }
      return;
    }
    throw new Error(`no free temporary name beside ${this.shown(parts)}`);
  }

  private async removeOwnLink(parts: readonly string[], target: string): Promise<void> {
    const path = await this.linkPath(parts);
    if (path !== null && (await fs.readlink(path).catch(() => null)) === target) await fs.unlink(path).catch(() => undefined);
  }

  /** The real path of `parts` if its directory is reachable without following links. */
  private async linkPath(parts: readonly string[]): Promise<string | null> {
    try {
      return join(await this.walk(parts.slice(0, -1), false), parts[parts.length - 1]!);
    } catch {
      return null;
    }
  }

  /** The target of `parts` if it is a symlink now; `null` if anything else or nothing. */
  private async linkTarget(parts: readonly string[]): Promise<string | null> {
    const path = await this.linkPath(parts);
    if (path === null) return null;
    const st = await lstatOrNull(path);
    return st?.isSymbolicLink() === true ? fs.readlink(path) : null;
  }

  /** Where `target`, a link in the directory `base`, leads: components below the
   * destination, resolved against the tree on disk now (links in the way followed, as the
   * kernel would, at most `MAX_LINK_HOPS`); `null` if it leaves the destination, is absolute
   * or loops. */
  async resolve(base: readonly string[], target: string): Promise<string[] | null> {
    if (target.startsWith("/")) return null;
    const stack = [...base];
    const pending = target.split("/").reverse();
    let hops = 0;
    while (pending.length > 0) {
      const part = pending.pop()!;
      if (part === "" || part === ".") continue;
      if (part === "..") {
        if (stack.length === 0) return null;
        stack.pop();
        continue;
      }
      stack.push(part);
      const inner = await this.linkTarget(stack);
      if (inner === null) continue;
      hops += 1;
      if (hops > MAX_LINK_HOPS || inner.startsWith("/")) return null;
      stack.pop();
      pending.push(...inner.split("/").reverse());
    }
    return stack;
  }
}

/** Unpacks `archive` (from `tar_read`) into the directory `local` (created if missing) through
 * `Dest`; returns the names written. Files, directories and symlinks only (hard links and
 * devices are refused); at most `maxBytes` unpacked and `MAX_TAR_ENTRIES` entries. Stops at
 * the first entry it refuses; what landed before it stays (all of it inside `local`). */
export async function unpackTar(archive: Uint8Array, local: string, maxBytes: number): Promise<string[]> {
  const dest = await Dest.open(local);
  const written: string[] = [];
  let total = 0;
  let count = 0;
  for (const entry of readTar(archive)) {
    if (++count > MAX_TAR_ENTRIES) throw new TooLargeError(`the archive has more than ${MAX_TAR_ENTRIES} entries`);
    const parts = entryParts(entry.name);
    switch (entry.kind) {
      case "dir":
        await dest.mkdir(parts, entry.mode);
        break;
      case "file":
        total += entry.data.length;
        if (total > maxBytes) throw new TooLargeError(`the archive unpacks to more than maxBytes ${maxBytes}`);
        await dest.writeFile(parts, entry.data, entry.mode);
        break;
      case "symlink":
        dest.addSymlink(parts, entry.linkname); // made last: see the header
        continue;
      default:
        throw new ProtocolError(`the archive's entry ${shownName(entry.name)} is a hard link, device or type ${JSON.stringify(entry.type)}; refused`);
    }
    written.push(entry.name);
  }
  return [...written, ...(await dest.symlinks())];
}
