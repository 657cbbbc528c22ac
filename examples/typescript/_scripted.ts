// The model behind the AI SDK examples: OpenAI's (`@ai-sdk/openai`) when OPENAI_API_KEY is
// set, else the AI SDK's own mock model, scripted: it makes the example's tool calls in order,
// one per step, as a real model would for the example's prompt, then answers with what the
// last tool returned. The answer an example prints is therefore the sandbox's own output, and
// examples/check checks it with no LLM account.

import type { LanguageModel } from "ai";
import { MockLanguageModelV3 } from "ai/test";

/** A tool's name and the input the model passes it. */
export type Call = [name: string, input: Record<string, unknown>];

/** The scripted model's closing message. */
export function finalAnswer(lastToolOutput: string): string {
  return `Done. The last tool returned:\n${lastToolOutput}`;
}

const USAGE = { inputTokens: { total: 1, noCache: 1, cacheRead: 0, cacheWrite: 0 }, outputTokens: { total: 1, text: 1, reasoning: 0 } };

export async function model(script: Call[]): Promise<LanguageModel> {
  if (process.env["OPENAI_API_KEY"]) {
    const provider = "@ai-sdk/openai"; // installed by examples/typescript's package.json
    const { openai } = (await import(provider)) as { openai: (id: string) => LanguageModel };
    return openai("gpt-4o");
  }
  const steps = [...script];
  return new MockLanguageModelV3({
    doGenerate: async ({ prompt }) => {
      const next = steps.shift();
      if (next !== undefined) {
        const [toolName, input] = next;
        const toolCallId = `call-${steps.length}`;
        return { content: [{ type: "tool-call", toolCallId, toolName, input: JSON.stringify(input) }], finishReason: { unified: "tool-calls", raw: undefined }, usage: USAGE, warnings: [] };
      }
      const results = prompt.flatMap((m) => (m.role === "tool" ? m.content : [])).filter((p) => p.type === "tool-result");
      const output = results.at(-1)?.output;
      const text = output === undefined ? "" : output.type === "text" ? output.value : JSON.stringify("value" in output ? output.value : output);
      return { content: [{ type: "text", text: finalAnswer(text) }], finishReason: { unified: "stop", raw: undefined }, usage: USAGE, warnings: [] };
    },
  });
}
