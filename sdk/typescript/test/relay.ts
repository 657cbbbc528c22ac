//! A real relay for tests: `TETHER_BIN serve` on an ephemeral port with its own data
//! directory (as tests/src/lib.rs starts one), its address from the `listening ` line it
//! prints, its admin token from the file it writes. `stop()` deletes what the tests left and
//! stops it.

import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

const REPO = resolve(dirname(fileURLToPath(import.meta.url)), "../../../..");
const READY_TIMEOUT_MS = 60_000;

/** A binary: `TETHER_BIN` / `TETHER_AGENT_BIN`, else the repo's debug build. */
export function bin(name: "tether" | "tether-agent"): string {
  const fromEnv = process.env[name === "tether" ? "TETHER_BIN" : "TETHER_AGENT_BIN"];
  return fromEnv !== undefined && fromEnv !== "" ? fromEnv : join(REPO, "target", "debug", name);
}

export class TestRelay {
  readonly url: string;
  readonly adminToken: string;
  private readonly child: ChildProcess;
  private readonly dataDir: string;

  private constructor(child: ChildProcess, url: string, adminToken: string, dataDir: string) {
    this.child = child;
    this.url = url;
    this.adminToken = adminToken;
    this.dataDir = dataDir;
  }

  static async start(): Promise<TestRelay> {
    const dataDir = mkdtempSync(join(tmpdir(), "tether-ts-relay-"));
    const child = spawn(bin("tether"), ["serve", "--listen", "127.0.0.1:0", "--data-dir", dataDir], {
      env: { ...process.env, TETHER_AGENT_BIN: bin("tether-agent"), TETHER_LOG: process.env["TETHER_LOG"] ?? "warn" },
      stdio: ["ignore", "pipe", "pipe"],
    });
    // Keep the relay's log quiet unless it fails to start.
    let log = "";
    child.stderr!.on("data", (chunk: Buffer) => {
      log = (log + chunk.toString("utf8")).slice(-16_384);
    });
    const ready = new Promise<string>((resolveUrl, reject) => {
      const timer = setTimeout(() => reject(new Error(`the relay did not print \`listening \` within ${READY_TIMEOUT_MS} ms`)), READY_TIMEOUT_MS);
      child.once("exit", (code) => {
        clearTimeout(timer);
        reject(new Error(`the relay exited with ${code} before listening:\n${log}`));
      });
      child.once("error", (e) => {
        clearTimeout(timer);
        reject(new Error(`cannot start ${bin("tether")}: ${e.message}`));
      });
      const lines = createInterface({ input: child.stdout! });
      let found = false;
      lines.on("line", (line) => {
        if (!found && line.startsWith("listening ")) {
          found = true;
          clearTimeout(timer);
          resolveUrl(line.slice("listening ".length).trim());
        }
      });
    });
    try {
      const url = await ready;
      const token = readFileSync(join(dataDir, "admin.token"), "utf8").trim();
      return new TestRelay(child, url, token, dataDir);
    } catch (e) {
      child.kill("SIGKILL");
      rmSync(dataDir, { recursive: true, force: true });
      throw e;
    }
  }

  /** Options for SDK calls against this relay. */
  get options(): { relay: string; token: string } {
    return { relay: this.url, token: this.adminToken };
  }

  /** Deletes every sandbox of the admin's tenant, stops the relay, removes its data. */
  async stop(): Promise<void> {
    spawnSync(bin("tether"), ["rm", "--all"], {
      env: { ...process.env, TETHER_RELAY: this.url, TETHER_TOKEN: this.adminToken },
      stdio: "ignore",
      timeout: 60_000,
    });
    const exited = new Promise((r) => this.child.once("exit", r));
    this.child.kill("SIGTERM");
    await exited;
    rmSync(this.dataDir, { recursive: true, force: true });
  }
}
