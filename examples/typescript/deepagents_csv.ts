// deepagentsjs with a Tether sandbox as its backend: the agent's file tools are the sandbox's
// own file operations and `execute` runs in it.
import { createDeepAgent } from "deepagents";
import { TetherBackend } from "tether-sandbox/deepagents";
import { chatModel } from "./_scripted_langchain.js"; // OpenAI with OPENAI_API_KEY, else these calls

const PARSER = "def parse(text):\n    return [line.split(',') for line in text.splitlines() if line]\n";
const TEST = "from csvparse import parse\nassert parse('a,b\\n1,2\\n') == [['a', 'b'], ['1', '2']]\nprint('parse ok:', parse('x,y'))\n";
const model = await chatModel([
  ["write_file", { file_path: "/workspace/csvparse.py", content: PARSER }],
  ["write_file", { file_path: "/workspace/test_csvparse.py", content: TEST }],
  ["execute", { command: "cd /workspace && python3 test_csvparse.py" }],
]);

const backend = await TetherBackend.create({ labels: { thread: "42" } });
try {
  const agent = createDeepAgent({ model, backend });
  const result = await agent.invoke({ messages: [{ role: "user", content: "Write and test a CSV parser" }] });
  console.log(result.messages.at(-1)?.content);
} finally {
  await backend.deleteSandbox();
}
