//! The relay's REST API (client/src/api.rs): create (and get-or-create by labels), get, list,
//! delete, renew, pause, resume, preview and tokens, with retries on 429, 5xx and network errors. Nothing
//! here touches the WebSocket protocol.

import { HTTP_ATTEMPTS, HTTP_BACKOFF_MAX_MS, HTTP_BACKOFF_MS, HTTP_TIMEOUT_MS } from "./constants.js";
import { ConfigurationError, errorFromCode, NotFoundError, PermissionDeniedError, SandboxGoneError, TetherError, UnavailableError } from "./errors.js";
import type { IdleAction, NetworkInfo, NetworkMode, PreviewInfo, SandboxCapabilities, SandboxInfo, Secret } from "./types.js";

/** Where the relay is and how to authenticate. */
export interface RelayOptions {
  /** The relay's URL; `TETHER_RELAY` or `http://127.0.0.1:7420` when absent. */
  relay?: string;
  /** An API token; `TETHER_TOKEN` when absent. */
  token?: string;
}

const DEFAULT_RELAY = "http://127.0.0.1:7420";

function env(name: string): string | undefined {
  const proc = (globalThis as { process?: { env?: Record<string, string | undefined> } }).process;
  const v = proc?.env?.[name];
  return v === undefined || v === "" ? undefined : v;
}

/** The relay's address and token, from options or the environment. */
export class RelayConfig {
  readonly url: string;
  /** @internal */
  readonly token: string;

  constructor(url: string, token: string) {
    this.url = url;
    this.token = token;
  }

  /** Resolves options against `TETHER_RELAY` and `TETHER_TOKEN` (and `defaultRelay`; `null`
   * for none); throws a `ConfigurationError` saying what to set when one is missing or the URL
   * is bad. */
  static resolve(options: RelayOptions = {}, defaultRelay: string | null = DEFAULT_RELAY): RelayConfig {
    const url = options.relay ?? env("TETHER_RELAY") ?? defaultRelay;
    if (url === null) {
      throw new ConfigurationError("missing relay URL: pass `relay` or set TETHER_RELAY (e.g. http://127.0.0.1:7420)");
    }
    let parsed: URL;
    try {
      parsed = new URL(url);
    } catch {
      throw new ConfigurationError(`relay URL ${JSON.stringify(url)} is not a URL; pass e.g. http://127.0.0.1:7420`);
    }
    if (parsed.protocol !== "http:" && parsed.protocol !== "https:") {
      throw new ConfigurationError(`relay URL ${url} must be http:// or https://`);
    }
    const token = options.token ?? env("TETHER_TOKEN");
    if (token === undefined || token.trim() === "") {
      throw new ConfigurationError(
        "missing API token: pass `token` or set TETHER_TOKEN (`tether token create --tenant NAME` mints one; a local relay's admin token is in ~/.local/share/tether/admin.token)",
      );
    }
    return new RelayConfig(url.replace(/\/+$/, ""), token.trim());
  }

  /** The WebSocket URL of a sandbox's session. */
  wsUrl(sandboxId: string): string {
    return `${this.url.replace(/^http/, "ws")}/v1/sandboxes/${encodeURIComponent(sandboxId)}/ws`;
  }

  /** Never shows the token. */
  toString(): string {
    return `RelayConfig(${this.url})`;
  }
}

/** What `POST /v1/sandboxes` takes (besides `get_or_create`). */
export interface CreateBody {
  provider?: string;
  image?: string;
  labels?: Record<string, string>;
  env?: Record<string, string>;
  ttl?: number;
  idle_timeout?: number;
  cpus?: number;
  memory_bytes?: number;
  pids?: number;
  disk_bytes?: number;
  network?: NetworkMode;
  egress?: { allow_hosts?: string[]; allow_cidrs?: string[] };
  secrets?: Secret[];
  seccomp_unconfined?: boolean;
  on_idle?: IdleAction;
  auto_resume?: boolean;
  get_or_create?: boolean;
}

function retryable(status: number): boolean {
  // 501 is a missing feature (a provider without pause): retrying cannot help.
  return status === 429 || (status >= 500 && status !== 501);
}

function delay(attempt: number, retryAfter: string | null): number {
  const seconds = retryAfter === null ? NaN : Number(retryAfter);
  const base = Number.isFinite(seconds) && seconds >= 0 ? seconds * 1000 : HTTP_BACKOFF_MS * 2 ** attempt;
  return Math.min(base, HTTP_BACKOFF_MAX_MS);
}

/** A client of one relay's REST API. */
export class RelayClient {
  readonly config: RelayConfig;

  constructor(config: RelayConfig) {
    this.config = config;
  }

  /** Sends a request, retrying 429, 5xx and network failures with backoff; other errors
   * become typed errors carrying the relay's message. `idempotent: false` requests (a create
   * without get-or-create) are not retried after the relay may have acted on them. */
  async request(method: string, path: string, body?: unknown, idempotent = true): Promise<unknown> {
    let lastError: TetherError | undefined;
    let wait = 0;
    for (let attempt = 0; attempt < HTTP_ATTEMPTS; attempt++) {
      if (attempt > 0) await new Promise((r) => setTimeout(r, wait));
      wait = delay(attempt, null);
      let response: Response;
      try {
        response = await fetch(`${this.config.url}${path}`, {
          method,
          headers: {
            Authorization: `Bearer ${this.config.token}`,
            ...(body === undefined ? {} : { "Content-Type": "application/json" }),
          },
          body: body === undefined ? undefined : JSON.stringify(body),
          signal: AbortSignal.timeout(HTTP_TIMEOUT_MS),
        });
      } catch (e) {
        lastError = new UnavailableError("unavailable", `cannot reach the relay at ${this.config.url}: ${(e as Error).message}; is \`tether serve\` running?`);
        if (!idempotent) throw lastError;
        continue;
      }
      const text = await response.text();
      if (response.ok) {
        if (text === "") return undefined;
        try {
          return JSON.parse(text) as unknown;
        } catch {
          throw new TetherError("internal", `the relay answered ${method} ${path} with something that is not JSON`);
        }
      }
      lastError = this.error(response.status, text, method, path);
      // 429 and 503 mean the relay did nothing; other 5xx may have, so only idempotent ones retry.
      if (retryable(response.status) && (idempotent || response.status === 429 || response.status === 503)) {
        wait = delay(attempt, response.headers.get("retry-after"));
        continue;
      }
      throw lastError;
    }
    throw lastError ?? new UnavailableError("unavailable", `the relay at ${this.config.url} did not answer`);
  }

  private error(status: number, text: string, method: string, path: string): TetherError {
    let code: string | undefined;
    let message = text.trim().slice(0, 2000);
    try {
      const parsed = JSON.parse(text) as { error?: { code?: unknown; message?: unknown } };
      if (typeof parsed.error?.code === "string") code = parsed.error.code;
      if (typeof parsed.error?.message === "string") message = parsed.error.message.slice(0, 2000);
    } catch {
      // keep the text
    }
    if (message === "") message = `HTTP ${status} for ${method} ${path}`;
    if (status === 401) return new PermissionDeniedError("unauthorized", `the relay refused the token: ${message} (check TETHER_TOKEN)`);
    if (status === 404) return new NotFoundError(message);
    if (status === 410) return new SandboxGoneError(message);
    if (code !== undefined) return errorFromCode(code, message);
    if (status >= 500) return new UnavailableError("unavailable", message);
    return errorFromCode("invalid_argument", message);
  }

  /** Creates a sandbox (or, with `get_or_create`, finds the tenant's one with these labels). */
  async create(body: CreateBody): Promise<SandboxInfo> {
    return parseSandboxInfo(await this.request("POST", "/v1/sandboxes", body, body.get_or_create === true));
  }

  /** One sandbox. */
  async get(id: string): Promise<SandboxInfo> {
    return parseSandboxInfo(await this.request("GET", `/v1/sandboxes/${encodeURIComponent(id)}`));
  }

  /** The tenant's sandboxes with all of these labels. */
  async list(labels: Record<string, string> = {}): Promise<SandboxInfo[]> {
    const query = Object.entries(labels)
      .map(([k, v]) => `label=${encodeURIComponent(`${k}=${v}`)}`)
      .join("&");
    const answer = await this.request("GET", `/v1/sandboxes${query ? `?${query}` : ""}`);
    const list = Array.isArray(answer) ? answer : (answer as { sandboxes?: unknown })?.sandboxes;
    if (!Array.isArray(list)) throw new TetherError("internal", "the relay's sandbox list is not an array");
    return list.map(parseSandboxInfo);
  }

  /** Deletes a sandbox; one already gone is not an error. */
  async delete(id: string): Promise<void> {
    try {
      await this.request("DELETE", `/v1/sandboxes/${encodeURIComponent(id)}`);
    } catch (e) {
      if (e instanceof NotFoundError || e instanceof SandboxGoneError) return;
      throw e;
    }
  }

  /** Extends a sandbox's TTL to `ttlSeconds` from now. */
  async renew(id: string, ttlSeconds: number): Promise<SandboxInfo> {
    return parseSandboxInfo(await this.request("POST", `/v1/sandboxes/${encodeURIComponent(id)}/renew`, { ttl_secs: ttlSeconds }));
  }

  /** Pauses a sandbox. Not retried after the relay may have acted: the retry would find it
   * paused. */
  async pause(id: string): Promise<SandboxInfo> {
    return parseSandboxInfo(await this.request("POST", `/v1/sandboxes/${encodeURIComponent(id)}/pause`, undefined, false));
  }

  /** Resumes a paused sandbox (not retried after the relay may have acted, as `pause`). */
  async resume(id: string): Promise<SandboxInfo> {
    return parseSandboxInfo(await this.request("POST", `/v1/sandboxes/${encodeURIComponent(id)}/resume`, undefined, false));
  }

  /** Stops a sandbox: its processes end, its files are kept (not retried, as `pause`). */
  async stop(id: string): Promise<SandboxInfo> {
    return parseSandboxInfo(await this.request("POST", `/v1/sandboxes/${encodeURIComponent(id)}/stop`, undefined, false));
  }

  /** Starts a stopped sandbox again (not retried, as `pause`). */
  async start(id: string): Promise<SandboxInfo> {
    return parseSandboxInfo(await this.request("POST", `/v1/sandboxes/${encodeURIComponent(id)}/start`, undefined, false));
  }

  /** How a browser reaches ports inside the sandbox. */
  async preview(id: string): Promise<PreviewInfo> {
    const v = (await this.request("GET", `/v1/sandboxes/${encodeURIComponent(id)}/preview`)) as Record<string, unknown>;
    if (typeof v?.["token"] !== "string" || typeof v["host_url"] !== "string" || typeof v["path_url"] !== "string") {
      throw new TetherError("internal", "the relay's preview answer is malformed");
    }
    return { token: v["token"], hostUrl: v["host_url"], pathUrl: v["path_url"] };
  }

  /** Mints an API token for a tenant (admin tokens only). */
  async createToken(tenant: string, admin = false): Promise<string> {
    const v = (await this.request("POST", "/v1/tokens", { tenant, admin }, false)) as Record<string, unknown>;
    if (typeof v?.["token"] !== "string") throw new TetherError("internal", "the relay's token answer is malformed");
    return v["token"];
  }
}

function parseSandboxInfo(value: unknown): SandboxInfo {
  const v = value as Record<string, unknown> | null;
  if (typeof v !== "object" || v === null || typeof v["id"] !== "string" || typeof v["state"] !== "string") {
    throw new TetherError("internal", "the relay's sandbox description is malformed");
  }
  const labels: Record<string, string> = {};
  if (typeof v["labels"] === "object" && v["labels"] !== null) {
    for (const [k, x] of Object.entries(v["labels"] as Record<string, unknown>)) if (typeof x === "string") labels[k] = x;
  }
  const num = (x: unknown): number | undefined => (typeof x === "number" ? x : undefined);
  return {
    id: v["id"],
    provider: typeof v["provider"] === "string" ? v["provider"] : "",
    providerRef: typeof v["provider_ref"] === "string" ? v["provider_ref"] : "",
    state: v["state"],
    labels,
    image: typeof v["image"] === "string" ? v["image"] : undefined,
    createdMs: num(v["created_ms"]) ?? 0,
    lastActiveMs: num(v["last_active_ms"]) ?? 0,
    expiresMs: num(v["expires_ms"]),
    idleTimeoutSecs: num(v["idle_timeout_secs"]),
    created: v["created"] === true,
    network: parseNetworkInfo(v["network"]),
    capabilities: capabilities(v["capabilities"]),
    autoResume: v["auto_resume"] !== false,
    onIdle: v["on_idle"] === "pause" || v["on_idle"] === "stop" ? v["on_idle"] : "delete",
  };
}

function parseNetworkInfo(value: unknown): NetworkInfo | undefined {
  if (typeof value !== "object" || value === null) return undefined;
  const v = value as Record<string, unknown>;
  const strings = (x: unknown): string[] => (Array.isArray(x) ? x.filter((s): s is string => typeof s === "string") : []);
  const egress = (typeof v["egress"] === "object" && v["egress"] !== null ? v["egress"] : {}) as Record<string, unknown>;
  const secrets = Array.isArray(v["secrets"]) ? (v["secrets"] as unknown[]) : [];
  return {
    mode: typeof v["mode"] === "string" ? v["mode"] : "",
    allowHosts: strings(egress["allow_hosts"]),
    allowCidrs: strings(egress["allow_cidrs"]),
    secrets: secrets
      .filter((s): s is Record<string, unknown> => typeof s === "object" && s !== null)
      .map((s) => ({ name: typeof s["name"] === "string" ? s["name"] : "", hosts: strings(s["hosts"]) })),
    enforcedBy: typeof v["enforced_by"] === "string" ? v["enforced_by"] : "",
    guarantees: strings(v["guarantees"]),
    notGuaranteed: strings(v["not_guaranteed"]),
  };
}

/** What a relay says a sandbox's provider can do; nothing, from a relay that does not say. */
function capabilities(v: unknown): SandboxCapabilities {
  const c = typeof v === "object" && v !== null ? (v as Record<string, unknown>) : {};
  return { pause: c["pause"] === true, stop: c["stop"] === true };
}
