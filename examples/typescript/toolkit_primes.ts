// The cloud sandbox toolkits' page with Tether: the AI SDK's generateText with the toolkit's
// four tools (run, shell, write_file, read_file) over one sandbox, made on the first call.
import { generateText, stepCountIs } from "ai";
import { TetherSandboxToolkit } from "tether-sandbox";
import { model } from "./_scripted.js"; // OpenAI with OPENAI_API_KEY, else these calls in turn

const toolkit = new TetherSandboxToolkit(); // TETHER_RELAY / TETHER_TOKEN, or { relay, token }
try {
  const { text } = await generateText({
    model: await model([
      ["sandbox_tether_write_file", { path: "/workspace/primes.py", contents: "print([n for n in range(2, 30) if all(n % d for d in range(2, n))])\n" }],
      ["sandbox_tether_shell", { command: "python3 /workspace/primes.py > /workspace/primes.txt" }],
      ["sandbox_tether_read_file", { path: "/workspace/primes.txt" }],
    ]),
    tools: toolkit.getAiSdkTools(), // LangChain.js: await toolkit.getLangChainTools()
    stopWhen: stepCountIs(10),
    prompt: "Write primes.py that prints the primes below 30, run it into primes.txt, and read it back",
  });
  console.log(text);
} finally {
  await toolkit.close(); // deletes the sandbox
}
