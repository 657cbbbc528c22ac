// Host-side landing attacked as a hostile sandbox would (issue 32), as the Python SDK's
// tests/test_landing.py and the CLI's hostfs tests do: symlinks planted at the old fixed
// temporary name, at the final name and in the path, link chains that only lead out when
// resolved on the real tree, and hostile names in archives. Each test asserts that what the
// attack was after (a host file outside the destination) is untouched.

import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, readlinkSync, realpathSync, rmSync, statSync, symlinkSync, writeFileSync, lstatSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, sep } from "node:path";
import { TestRelay } from "./relay.js";
import { ProtocolError, Sandbox } from "../src/index.js";
import { unpackTar } from "../src/landing.js";

const KEEP = "keep";
let scratch: string;
let n = 0;

/** A fresh directory holding `victim` (content `keep`) and an empty `out`. */
function place(): { root: string; victim: string; out: string } {
  const root = join(scratch, `case-${++n}`);
  mkdirSync(join(root, "out"), { recursive: true });
  writeFileSync(join(root, "victim"), KEEP);
  return { root, victim: join(root, "victim"), out: join(root, "out") };
}

/** Every symlink under `dest` resolves (on the real tree) inside it. */
function linksStayInside(dest: string): void {
  const root = realpathSync(dest);
  const walk = (dir: string): void => {
    for (const name of readdirSync(dir)) {
      const path = join(dir, name);
      const st = lstatSync(path);
      if (st.isSymbolicLink()) {
        let real: string;
        try {
          real = realpathSync(path);
        } catch {
          continue; // dangling or a loop: leads nowhere
        }
        assert.ok(real === root || real.startsWith(root + sep), `${path} leads to ${real}`);
      } else if (st.isDirectory()) walk(path);
    }
  };
  walk(dest);
}

// --- a minimal tar writer, for archives no agent would send ------------------------------

function header(name: string, type: string, size: number, link: string): Uint8Array {
  const h = new Uint8Array(512);
  const put = (at: number, s: string): void => h.set(new TextEncoder().encode(s), at);
  put(0, name);
  put(100, "0000644\0");
  put(108, "0000000\0");
  put(116, "0000000\0");
  put(124, size.toString(8).padStart(11, "0") + "\0");
  put(136, "00000000000\0");
  put(148, "        ");
  put(156, type);
  put(157, link);
  put(257, "ustar\0" + "00");
  const sum = h.reduce((a, b) => a + b, 0);
  put(148, sum.toString(8).padStart(6, "0") + "\0 ");
  return h;
}

/** An archive of [name, type ("0" file, "2" symlink, "5" dir), link target] members; files
 * hold `EVIL`, long names go in GNU `L` entries. */
function tar(...members: [string, string, string][]): Uint8Array {
  const blocks: Uint8Array[] = [];
  const pad = (b: Uint8Array): Uint8Array => {
    const out = new Uint8Array(Math.ceil(b.length / 512) * 512);
    out.set(b);
    return out;
  };
  for (const [name, type, link] of members) {
    const bytes = new TextEncoder().encode(name);
    if (bytes.length > 99) blocks.push(header("././@LongLink", "L", bytes.length + 1, ""), pad(new Uint8Array([...bytes, 0])));
    const data = type === "0" ? new TextEncoder().encode("EVIL") : new Uint8Array(0);
    blocks.push(header(bytes.length > 99 ? "long" : name, type, data.length, link), pad(data));
  }
  blocks.push(new Uint8Array(1024));
  const out = new Uint8Array(blocks.reduce((a, b) => a + b.length, 0));
  let at = 0;
  for (const b of blocks) {
    out.set(b, at);
    at += b.length;
  }
  return out;
}

before(() => {
  scratch = mkdtempSync(join(tmpdir(), "tether-ts-landing-"));
});

after(() => rmSync(scratch, { recursive: true, force: true }));

describe("against a real sandbox", () => {
  let relay: TestRelay;
  let sandbox: Sandbox;

  before(async () => {
    relay = await TestRelay.start();
    sandbox = await Sandbox.create({ ...relay.options, labels: { suite: "landing" } });
  });

  after(async () => {
    await sandbox?.delete();
    await relay?.stop();
  });

  test("downloadFile writes through no planted link", async () => {
    const { root, out } = place();
    const atTemp = join(root, "at-temp");
    const atFinal = join(root, "at-final");
    writeFileSync(atTemp, KEEP);
    writeFileSync(atFinal, KEEP);
    // Links as a `tether sync` pull or an earlier download leaves them.
    symlinkSync(atTemp, join(out, "f.tether-part"));
    symlinkSync(atFinal, join(out, "f"));
    await sandbox.files.write("/workspace/f", "EVIL");
    assert.equal(await sandbox.files.downloadFile("/workspace/f", join(out, "f")), 4);
    assert.equal(readFileSync(atTemp, "utf8"), KEEP);
    assert.equal(readFileSync(atFinal, "utf8"), KEEP);
    assert.ok(!lstatSync(join(out, "f")).isSymbolicLink());
    assert.equal(readFileSync(join(out, "f"), "utf8"), "EVIL");
    assert.equal(statSync(join(out, "f")).mode & 0o777, 0o644);
    assert.deepEqual(readdirSync(out).sort(), ["f", "f.tether-part"], "no temporary left");
  });

  test("a downloadDir cannot plant what downloadFile follows", async () => {
    const { victim, out } = place();
    rmSync(out, { recursive: true });
    await sandbox.commands.run(
      "mkdir -p /workspace/t/sub && ln -s .. /workspace/t/sub/y && ln -s sub/y/../victim /workspace/t/f.tether-part" +
        " && ln -s sub/y/../victim /workspace/t/esc && echo EVIL > /workspace/data",
    );
    await assert.rejects(sandbox.files.downloadDir("/workspace/t", out), (e: unknown) => e instanceof ProtocolError && /outside/.test(e.message));
    linksStayInside(out);
    await sandbox.files.downloadFile("/workspace/data", join(out, "f"));
    assert.equal(readFileSync(victim, "utf8"), KEEP);
  });

  test("downloadDir goes through no planted directory link", async () => {
    const { root, out } = place();
    const outside = join(root, "outside");
    mkdirSync(outside, { mode: 0o700 });
    symlinkSync(outside, join(out, "d"));
    await sandbox.commands.run("mkdir -p /workspace/u/d && echo EVIL > /workspace/u/d/f && chmod 777 /workspace/u/d");
    await assert.rejects(sandbox.files.downloadDir("/workspace/u", out), (e: unknown) => e instanceof ProtocolError && /not a directory/.test(e.message));
    assert.equal(statSync(outside).mode & 0o777, 0o700, "the link's target was not chmodded");
    assert.deepEqual(readdirSync(outside), []);
  });

  test("a tree downloads, its links inside kept", async () => {
    const { out } = place();
    await sandbox.commands.run("mkdir -p /workspace/v/pkg && echo A > /workspace/v/pkg/a && ln -s pkg/a /workspace/v/link && chmod 750 /workspace/v/pkg");
    const names = await sandbox.files.downloadDir("/workspace/v", out);
    assert.equal(readFileSync(join(out, "link"), "utf8"), "A\n");
    assert.equal(readlinkSync(join(out, "link")), "pkg/a");
    assert.equal(statSync(join(out, "pkg")).mode & 0o777, 0o750);
    assert.ok(names.includes("pkg/a") && names.includes("link"));
  });
});

describe("hostile archives", () => {
  const chains: [string, [string, string, string][]][] = [
    ["the issue's chain", [["sub/y", "2", ".."], ["esc", "2", "sub/y/../victim"]]],
    ["the chain, reversed (caught on the final check)", [["esc", "2", "sub/y/../victim"], ["sub/y", "2", ".."]]],
    ["a link re-pointed after another was checked through it", [["sub/y", "2", "."], ["esc", "2", "sub/y/../../victim"], ["sub/y", "2", ".."]]],
    ["through a link to a directory, then up", [["a", "2", "sub"], ["sub/b", "2", "../a/../../victim"]]],
    ["a loop, and a link through it", [["l1", "2", "l2"], ["l2", "2", "l1"], ["esc", "2", "l1/x"]]],
    ["an absolute target", [["abs", "2", "/etc/passwd"]]],
  ];
  for (const [what, members] of chains) {
    test(`link targets are resolved on the real tree: ${what}`, async () => {
      const { victim, out } = place();
      await assert.rejects(unpackTar(tar(...members), out, 100), ProtocolError);
      linksStayInside(out);
      assert.equal(readFileSync(victim, "utf8"), KEEP);
    });
  }

  for (const name of ["../victim", "/tmp/victim", "a/../../victim", "./../victim", "n".repeat(256), "d/".repeat(2100) + "f"]) {
    test(`a hostile name is refused: ${name.slice(0, 30)}`, async () => {
      const { victim, out } = place();
      await assert.rejects(unpackTar(tar([name, "0", ""]), out, 100), ProtocolError);
      assert.equal(readFileSync(victim, "utf8"), KEEP);
    });
  }

  test("hard links and devices are refused; sizes are capped", async () => {
    const { out } = place();
    await assert.rejects(unpackTar(tar(["h", "1", "/etc/passwd"]), out, 100), ProtocolError);
    await assert.rejects(unpackTar(tar(["c", "3", ""]), out, 100), ProtocolError);
    await assert.rejects(unpackTar(tar(["big", "0", ""]), out, 3), /maxBytes/);
    await assert.rejects(unpackTar(tar(["cut", "0", ""]).subarray(0, 600), out, 100), /cut/);
  });

  test("archive files replace planted links", async () => {
    const { victim, out } = place();
    symlinkSync(victim, join(out, "f"));
    await unpackTar(tar(["f", "0", ""]), out, 100);
    assert.equal(readFileSync(victim, "utf8"), KEEP);
    assert.ok(!lstatSync(join(out, "f")).isSymbolicLink());
    assert.equal(readFileSync(join(out, "f"), "utf8"), "EVIL");
    assert.deepEqual(readdirSync(out), ["f"], "no temporary left");
  });

  test("links inside still land", async () => {
    const { out } = place();
    const names = await unpackTar(
      tar(["sub/f", "0", ""], ["sub/up", "2", ".."], ["to-f", "2", "sub/up/sub/f"], ["dangling", "2", "sub/none"]),
      out,
      100,
    );
    assert.equal(readFileSync(join(out, "to-f"), "utf8"), "EVIL");
    assert.equal(readlinkSync(join(out, "dangling")), "sub/none");
    assert.deepEqual(new Set(names), new Set(["sub/f", "sub/up", "to-f", "dangling"]));
    linksStayInside(out);
  });
});
