import { Sandbox } from "tether-sandbox"; // TETHER_RELAY / TETHER_TOKEN, or { relay, token }

const sandbox = await Sandbox.getOrCreate({ labels: { thread: "42" }, ttl: 1800 });
const r = await sandbox.commands.run("echo hi; echo oops >&2; exit 3");
console.log(r.stdoutText, r.stderrText, r.exitCode);                 // "hi\n" "oops\n" 3
await sandbox.files.write("/workspace/app.py", "print(6 * 7)\n");
console.log((await sandbox.commands.run(["python3", "/workspace/app.py"])).stdoutText); // "42\n"
const job = await sandbox.commands.start("for i in 1 2 3; do echo step $i; sleep 0.1; done", { background: true });
for await (const chunk of job) process.stdout.write(chunk.bytes);    // re-attaches after a drop
await sandbox.close();                                                // the sandbox keeps running
