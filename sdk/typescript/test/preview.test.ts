// Preview URLs against a real relay and a local sandbox: the URL `previewUrl` returns is fetched
// by Node's global fetch (redirects not followed: a program must get the page itself, not a
// browser's cookie-and-redirect) and by curl; the host form is returned only where the
// platform's resolver gives its name loopback addresses.

import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import dns from "node:dns";
import { promisify } from "node:util";
import { TestRelay } from "./relay.js";
import { Sandbox } from "../src/index.js";

const PORT = 8124;
const BODY = "preview for every client\n";

let relay: TestRelay;
let sandbox: Sandbox;

before(async () => {
  relay = await TestRelay.start();
  sandbox = await Sandbox.create({ ...relay.options, labels: { suite: "preview" } });
  await sandbox.files.write("/workspace/site/index.html", BODY);
  await sandbox.commands.start(["python3", "-m", "http.server", String(PORT), "--bind", "127.0.0.1"], { background: true, cwd: "/workspace/site" });
  for (let i = 0; !(await sandbox.ports.list()).some((p) => p.port === PORT); i++) {
    if (i > 20_000) throw new Error("the server in the sandbox never listened");
    await new Promise((r) => setImmediate(r));
  }
});

after(async () => {
  await sandbox?.delete();
  await relay?.stop();
});

/** The body curl gets; no message quotes the URL, which carries the token. */
async function curl(url: string): Promise<string> {
  const { stdout } = await promisify(execFile)("curl", ["-sS", "--fail", "--max-time", "30", url]);
  return stdout;
}

describe("preview URLs", () => {
  test("the URL previewUrl returns is fetched by fetch and curl", async () => {
    const url = await sandbox.ports.previewUrl(PORT);
    assert.ok([await sandbox.ports.previewHostUrl(PORT), await sandbox.ports.previewPathUrl(PORT)].includes(url));
    const res = await fetch(url, { redirect: "manual" });
    assert.equal(res.status, 200);
    assert.equal(await res.text(), BODY);
    assert.equal(await curl(url), BODY);
    // The path form, wherever the relay is reachable, by both.
    const pathUrl = await sandbox.ports.previewPathUrl(PORT);
    assert.equal(await (await fetch(pathUrl, { redirect: "manual" })).text(), BODY);
    assert.equal(await curl(pathUrl), BODY);
  });

  test("the host form only where the resolver gives its name loopback", async (t) => {
    // CI's machines differ in whether they resolve *.localhost, so the resolver is stood in
    // for: the SDK asks dns.lookup, the resolver Node's fetch uses.
    const answer = { address: "127.0.0.1" };
    const real = dns.promises.lookup;
    t.mock.method(dns.promises, "lookup", (async (host: string, options: unknown) =>
      host.endsWith(".localhost") ? [{ address: answer.address, family: 4 }] : real(host, options as dns.LookupAllOptions)) as typeof real);
    const hostUrl = await sandbox.ports.previewHostUrl(PORT);
    assert.equal(await sandbox.ports.previewUrl(PORT), hostUrl);
    // curl resolves *.localhost itself, as browsers do: the host form works for it.
    assert.equal(await curl(hostUrl), BODY);
    // A resolver that sends the name elsewhere must not get the token.
    answer.address = "203.0.113.7";
    assert.equal(await sandbox.ports.previewUrl(PORT), await sandbox.ports.previewPathUrl(PORT));
  });
});
