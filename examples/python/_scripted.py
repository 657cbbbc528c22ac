"""The model behind each example's agent: a real one when its provider's API key is set
(``ANTHROPIC_API_KEY`` for deepagents, as on its page; ``OPENAI_API_KEY`` for the others), else
a scripted one, so that every example runs, and ``examples/check`` checks it, with no LLM
account.

A scripted model makes the example's tool calls in order, one per turn, as a real model would
for the example's prompt, then answers with what the last tool returned (``final_answer``). The
answer an example prints is therefore the sandbox's own output: a broken adapter shows there,
not only in an exception. Each framework gets the model type it takes; each function imports
its framework, so an example needs only its own installed.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Iterator
from typing import Any

Call = tuple[str, dict[str, Any]]  # a tool's name and the arguments the model passes it


def final_answer(last_tool_output: str) -> str:
    """The scripted model's closing message."""
    return f"Done. The last tool returned:\n{last_tool_output}"


def chat_model(script: list[Call]) -> Any:
    """A LangChain chat model for deepagents: Claude with ``ANTHROPIC_API_KEY``, else scripted."""
    if os.environ.get("ANTHROPIC_API_KEY"):
        from langchain_anthropic import ChatAnthropic

        return ChatAnthropic(model_name="claude-sonnet-4-5", timeout=None, stop=None)

    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
    from langchain_core.outputs import ChatGeneration, ChatResult

    class ScriptedChatModel(BaseChatModel):
        steps: list[Call]

        @property
        def _llm_type(self) -> str:
            return "scripted"

        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self  # the script already knows which tools it calls

        def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
            if self.steps:
                name, call_args = self.steps.pop(0)
                call = {"name": name, "args": call_args, "id": f"call-{len(self.steps)}"}
                message = AIMessage(content="", tool_calls=[call])
            else:
                tools = [m for m in messages if isinstance(m, ToolMessage)]
                message = AIMessage(content=final_answer(str(tools[-1].content) if tools else ""))
            return ChatResult(generations=[ChatGeneration(message=message)])

    return ScriptedChatModel(steps=list(script))


def agno_model(script: list[Call]) -> Any:
    """An Agno model: OpenAI's with ``OPENAI_API_KEY``, else scripted."""
    if os.environ.get("OPENAI_API_KEY"):
        from agno.models.openai import OpenAIChat

        return OpenAIChat(id="gpt-4o")

    from agno.models.base import Model
    from agno.models.response import ModelResponse

    class ScriptedModel(Model):
        def __init__(self, steps: list[Call]) -> None:
            super().__init__(id="scripted", name="scripted", provider="scripted")
            self.steps = steps

        def invoke(self, *args: Any, **kwargs: Any) -> ModelResponse:
            if not self.steps:
                messages = kwargs.get("messages") or (args[0] if args else [])
                tools = [m for m in messages if m.role == "tool"]
                return ModelResponse(
                    role="assistant", content=final_answer(str(tools[-1].content) if tools else "")
                )
            name, call_args = self.steps.pop(0)
            call = {
                "id": f"call-{len(self.steps)}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(call_args)},
            }
            return ModelResponse(role="assistant", content="", tool_calls=[call])

        async def ainvoke(self, *args: Any, **kwargs: Any) -> ModelResponse:
            return self.invoke(*args, **kwargs)

        def invoke_stream(self, *args: Any, **kwargs: Any) -> Iterator[ModelResponse]:
            yield self.invoke(*args, **kwargs)

        async def ainvoke_stream(self, *args: Any, **kwargs: Any) -> AsyncIterator[ModelResponse]:
            yield self.invoke(*args, **kwargs)

        def _parse_provider_response(self, response: Any, **kwargs: Any) -> ModelResponse:
            return response  # type: ignore[no-any-return]

        def _parse_provider_response_delta(self, response: Any) -> ModelResponse:
            return response  # type: ignore[no-any-return]

    return ScriptedModel(list(script))


def dynamiq_llm(script: list[Call]) -> Any:
    """A Dynamiq LLM node: OpenAI's gpt-4o (as on Dynamiq's page) with ``OPENAI_API_KEY``,
    else one whose completions are the script's ReAct steps."""
    from dynamiq.connections import OpenAI as OpenAIConnection
    from dynamiq.nodes.llms import OpenAI

    if os.environ.get("OPENAI_API_KEY"):
        return OpenAI(connection=OpenAIConnection(), model="gpt-4o", temperature=0.2)

    import litellm

    steps = list(script)

    def completion(**kwargs: Any) -> litellm.ModelResponse:
        if steps:
            name, call_args = steps.pop(0)
            text = f"Thought: next step\nAction: {name}\nAction Input: {json.dumps(call_args)}"
        else:
            # The last message is the last tool's observation.
            text = f"Thought: done\nAnswer: {final_answer(str(kwargs['messages'][-1]['content']))}"
        return litellm.ModelResponse(
            choices=[{"message": {"role": "assistant", "content": text}, "index": 0}],
            usage={"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        )

    llm = OpenAI(connection=OpenAIConnection(api_key="scripted"), model="gpt-4o")
    llm._completion = completion  # the node's one call to the provider
    return llm


def agents_model(script: list[Call]) -> Any:
    """A model for the OpenAI Agents SDK: ``gpt-4.1`` with ``OPENAI_API_KEY``, else scripted."""
    if os.environ.get("OPENAI_API_KEY"):
        return "gpt-4.1"

    from agents import Model, ModelResponse, Usage
    from openai.types.responses import (
        ResponseFunctionToolCall,
        ResponseOutputMessage,
        ResponseOutputText,
    )

    class ScriptedModel(Model):
        def __init__(self, steps: list[Call]) -> None:
            self.steps = steps
            self.last_output = ""

        async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
            items = kwargs.get("input", args[1] if len(args) > 1 else [])
            for item in items if isinstance(items, list) else []:
                if isinstance(item, dict) and item.get("type") == "function_call_output":
                    self.last_output = str(item.get("output"))
            if self.steps:
                name, call_args = self.steps.pop(0)
                n = len(self.steps)
                out: Any = ResponseFunctionToolCall(
                    arguments=json.dumps(call_args),
                    call_id=f"call-{n}",
                    name=name,
                    type="function_call",
                    id=f"fc-{n}",
                    status="completed",
                )
            else:
                text = ResponseOutputText(
                    text=final_answer(self.last_output), type="output_text", annotations=[]
                )
                out = ResponseOutputMessage(
                    id="msg-final",
                    content=[text],
                    role="assistant",
                    status="completed",
                    type="message",
                )
            return ModelResponse(output=[out], usage=Usage(), response_id=None)

        def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
            raise NotImplementedError("the scripted model does not stream")

    return ScriptedModel(list(script))
