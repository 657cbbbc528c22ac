// Run by standard-websocket.test.ts under `node --experimental-websocket`, where the platform
// has a standard `WebSocket`: the SDK must then use it (not `ws`) and still work end to end.
// Prints one JSON line of what it saw.

import { createHash } from "node:crypto";
import { Sandbox } from "../src/index.js";

const [relay, token] = process.argv.slice(2);
const sandbox = await Sandbox.create({ relay: relay!, token: token! });
try {
  const run = await sandbox.commands.run("head -c 3000000 /dev/urandom > /tmp/r.bin; cat /tmp/r.bin; echo err >&2; exit 4");
  const file = await sandbox.files.read("/tmp/r.bin");
  const remote = (await sandbox.commands.run(["sha256sum", "/tmp/r.bin"])).stdoutText.split(" ")[0];
  console.log(
    JSON.stringify({
      standard: typeof (globalThis as { WebSocket?: unknown }).WebSocket === "function",
      runSha: createHash("sha256").update(run.stdout).digest("hex"),
      fileSha: createHash("sha256").update(file).digest("hex"),
      remote,
      stderr: run.stderrText,
      exitCode: run.exitCode,
    }),
  );
} finally {
  await sandbox.delete();
}
