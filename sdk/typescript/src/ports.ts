//! Ports inside a sandbox: which are listening, and the preview URLs through which a browser
//! reaches them on the relay.

import { objects, str, uint } from "./protocol/fields.js";
import { expectReply } from "./protocol/fields.js";
import type { Sandbox } from "./sandbox.js";
import type { ListeningPort, PreviewInfo } from "./types.js";

function checkPort(port: number): void {
  if (!Number.isInteger(port) || port < 1 || port > 65535) throw new RangeError(`port must be 1 to 65535, not ${port}`);
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

  /** The URL of `port` by host name, carrying the preview token, ready for a browser. */
  async previewUrl(port: number): Promise<string> {
    checkPort(port);
    const p = await this.previewInfo();
    return `${p.hostUrl.replace("{port}", String(port))}?tether_preview_token=${encodeURIComponent(p.token)}`;
  }

  /** The same by path, for clients that cannot resolve `*.localhost`. */
  async previewPathUrl(port: number): Promise<string> {
    checkPort(port);
    const p = await this.previewInfo();
    return `${p.pathUrl.replace("{port}", String(port))}?tether_preview_token=${encodeURIComponent(p.token)}`;
  }
}
