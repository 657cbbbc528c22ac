// The chat model behind the deepagentsjs examples: OpenAI's (`@langchain/openai`) when
// OPENAI_API_KEY is set, else LangChain's fake chat model, scripted as in _scripted.ts: the
// example's tool calls in order, then an answer quoting what the last tool returned.

import type { BaseChatModel } from "@langchain/core/language_models/chat_models";
import { AIMessage, type BaseMessage, ToolMessage } from "@langchain/core/messages";
import type { ChatResult } from "@langchain/core/outputs";
import { FakeListChatModel } from "@langchain/core/utils/testing";
import { finalAnswer, type Call } from "./_scripted.js";

class ScriptedChatModel extends FakeListChatModel {
  private readonly steps: Call[];

  constructor(script: Call[]) {
    super({ responses: [""] });
    this.steps = [...script];
  }

  override async _generate(messages: BaseMessage[]): Promise<ChatResult> {
    const next = this.steps.shift();
    let message: AIMessage;
    if (next !== undefined) {
      const [name, args] = next;
      message = new AIMessage({ content: "", tool_calls: [{ id: `call-${this.steps.length}`, name, args, type: "tool_call" }] });
    } else {
      const last = messages.filter((m) => ToolMessage.isInstance(m)).at(-1);
      const text = last === undefined ? "" : typeof last.content === "string" ? last.content : JSON.stringify(last.content);
      message = new AIMessage(finalAnswer(text));
    }
    return { generations: [{ message, text: String(message.content) }] };
  }

  // The agent binds its tools; the script already knows which it calls.
  override bindTools(): this {
    return this;
  }
}

export async function chatModel(script: Call[]): Promise<BaseChatModel> {
  if (process.env["OPENAI_API_KEY"]) {
    const provider = "@langchain/openai"; // installed by examples/typescript's package.json
    const { ChatOpenAI } = (await import(provider)) as { ChatOpenAI: new (fields: { model: string }) => BaseChatModel };
    return new ChatOpenAI({ model: "gpt-4o" });
  }
  return new ScriptedChatModel(script);
}
