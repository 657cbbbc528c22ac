// Allowlisted egress and secrets at create, against a loopback server standing in for the
// relay: the request carries them as the relay's API spells them, and the answer's network
// guarantees are read back.

import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { Sandbox } from "../src/index.js";

let server: Server;
let url: string;
const bodies: unknown[] = [];

const answer = {
  id: "sb-egress",
  provider: "daytona",
  provider_ref: "d1",
  state: "running",
  labels: {},
  created_ms: 1,
  last_active_ms: 1,
  created: true,
  network: {
    mode: "allowlist",
    egress: { allow_hosts: ["*.pypi.org"] },
    secrets: [{ name: "OPENAI_API_KEY", hosts: ["api.openai.com"] }],
    enforced_by: "daytona",
    guarantees: ["Daytona's firewall allows the names of its domainAllowList only"],
    not_guaranteed: ["tiers 1 and 2"],
  },
};

before(async () => {
  server = createServer((req, res) => {
    let data = "";
    req.on("data", (chunk: Buffer) => (data += chunk.toString()));
    req.on("end", () => {
      bodies.push(JSON.parse(data));
      res.writeHead(201, { "content-type": "application/json" });
      res.end(JSON.stringify(answer));
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

after(() => new Promise<void>((r) => server.close(() => r())));

test("create sends the allowlist and secrets, and reads back the guarantees", async () => {
  bodies.length = 0;
  const sandbox = await Sandbox.create({
    relay: url,
    token: "t",
    provider: "daytona",
    allowHosts: ["*.pypi.org"],
    allowCidrs: ["10.1.0.0/16"],
    secrets: [{ name: "OPENAI_API_KEY", hosts: ["api.openai.com"], value: "sk-test-value" }, { name: "GITHUB_TOKEN", hosts: ["api.github.com"] }],
  });
  assert.deepEqual(bodies, [
    {
      provider: "daytona",
      network: "allowlist",
      egress: { allow_hosts: ["*.pypi.org"], allow_cidrs: ["10.1.0.0/16"] },
      secrets: [
        { name: "OPENAI_API_KEY", hosts: ["api.openai.com"], value: "sk-test-value" },
        { name: "GITHUB_TOKEN", hosts: ["api.github.com"] },
      ],
    },
  ]);
  const network = sandbox.info.network;
  assert.ok(network);
  assert.equal(network.mode, "allowlist");
  assert.equal(network.enforcedBy, "daytona");
  assert.deepEqual(network.allowHosts, ["*.pypi.org"]);
  assert.deepEqual(network.secrets, [{ name: "OPENAI_API_KEY", hosts: ["api.openai.com"] }]);
  assert.deepEqual(network.notGuaranteed, ["tiers 1 and 2"]);
  await sandbox.close();
});

test("the mode alone, and an allowlist under another mode is refused before sending", async () => {
  bodies.length = 0;
  await (await Sandbox.create({ relay: url, token: "t", network: "allowlist" })).close();
  assert.deepEqual(bodies, [{ network: "allowlist" }]);
  await assert.rejects(Sandbox.create({ relay: url, token: "t", network: "host", allowHosts: ["a.test"] }), /allowlist/);
  assert.equal(bodies.length, 1);
});

test("a preset is sent as written, for the relay to expand", async () => {
  bodies.length = 0;
  await (await Sandbox.create({ relay: url, token: "t", allowHosts: ["@package-registries"] })).close();
  assert.deepEqual(bodies, [{ network: "allowlist", egress: { allow_hosts: ["@package-registries"] } }]);
});
