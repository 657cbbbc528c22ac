//! Reading a tar archive a sandbox sent (`tar_read`), entry by entry, without trusting it:
//! every size is parsed strictly and checked against the bytes there, names come from the
//! ustar header, a GNU long name (`L`, `K`) or a PAX record (`path`, `linkpath`), and nothing
//! is written here; landing the entries is `landing.ts`'s job.

import { ProtocolError } from "./errors.js";

/** One entry of an archive. `data` is a view into the archive (files only). */
export interface TarEntry {
  name: string;
  kind: "file" | "dir" | "symlink" | "other";
  /** The type flag as sent, for messages about `other`. */
  type: string;
  mode: number;
  linkname: string;
  data: Uint8Array;
}

/** Bytes in a tar block. */
const BLOCK = 512;
/** The most bytes a GNU long name or PAX header may hold (far above PATH_MAX). */
const MAX_META_BYTES = 1 << 20; // 1 MiB

const utf8 = new TextDecoder("utf-8", { fatal: true });

function text(bytes: Uint8Array): string {
  const end = bytes.indexOf(0);
  try {
    return utf8.decode(end < 0 ? bytes : bytes.subarray(0, end));
  } catch {
    throw new ProtocolError("the sandbox sent a tar entry whose name is not UTF-8");
  }
}

/** An octal field (NUL or space terminated), or a base-256 one within 2^53. */
function number(bytes: Uint8Array, what: string): number {
  if (bytes[0]! & 0x80) {
    let n = 0;
    for (let i = 1; i < bytes.length; i++) n = n * 256 + bytes[i]!;
    if (bytes[0] !== 0x80 || !Number.isSafeInteger(n)) throw new ProtocolError(`the archive's ${what} is out of range`);
    return n;
  }
  const field = new TextDecoder("latin1").decode(bytes).replace(/[\0 ]+$/, "").replace(/^ +/, "");
  if (field === "") return 0;
  if (!/^[0-7]+$/.test(field)) throw new ProtocolError(`the archive's ${what} is not a number: ${JSON.stringify(field.slice(0, 40))}`);
  return parseInt(field, 8);
}

/** PAX records (`LEN key=value\n`): the ones this reader uses. */
function pax(bytes: Uint8Array): Map<string, string> {
  const out = new Map<string, string>();
  let at = 0;
  while (at < bytes.length) {
    const space = bytes.indexOf(0x20, at);
    const len = space < 0 ? NaN : Number(new TextDecoder("latin1").decode(bytes.subarray(at, space)));
    if (!Number.isSafeInteger(len) || len <= 0 || at + len > bytes.length) throw new ProtocolError("the archive holds a malformed PAX header");
    const record = utf8.decode(bytes.subarray(space + 1, at + len - 1));
    const eq = record.indexOf("=");
    if (eq > 0) out.set(record.slice(0, eq), record.slice(eq + 1));
    at += len;
  }
  return out;
}

/** The entries of `archive`, in order. */
export function* readTar(archive: Uint8Array): Generator<TarEntry> {
  let at = 0;
  let longName: string | undefined;
  let longLink: string | undefined;
  let paxRecords = new Map<string, string>();
  while (at + BLOCK <= archive.length) {
    const header = archive.subarray(at, at + BLOCK);
    if (header.every((b) => b === 0)) return;
    const size = number(header.subarray(124, 136), "size");
    const start = at + BLOCK;
    if (start + Math.ceil(size / BLOCK) * BLOCK > archive.length) throw new ProtocolError("the archive ends inside an entry; the download was cut");
    const data = archive.subarray(start, start + size);
    at = start + Math.ceil(size / BLOCK) * BLOCK;
    const type = String.fromCharCode(header[156]!);
    if (type === "L" || type === "K" || type === "x") {
      if (size > MAX_META_BYTES) throw new ProtocolError(`the archive holds a ${size}-byte name header`);
      if (type === "L") longName = text(data);
      else if (type === "K") longLink = text(data);
      else paxRecords = pax(data);
      continue;
    }
    if (type === "g") continue;
    const prefix = text(header.subarray(345, 500));
    const ustar = text(header.subarray(257, 262)) === "ustar";
    const short = text(header.subarray(0, 100));
    const name = paxRecords.get("path") ?? longName ?? (ustar && prefix !== "" ? `${prefix}/${short}` : short);
    const linkname = paxRecords.get("linkpath") ?? longLink ?? text(header.subarray(157, 257));
    longName = longLink = undefined;
    paxRecords = new Map();
    const kind = type === "0" || type === "\0" || type === "7" ? "file" : type === "5" ? "dir" : type === "2" ? "symlink" : "other";
    yield { name, kind, type, mode: number(header.subarray(100, 108), "mode"), linkname, data };
  }
  // No end-of-archive block: the stream stopped between (or inside) entries.
  throw new ProtocolError("the archive ends without its end-of-archive block; the download was cut");
}
