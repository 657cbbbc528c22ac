"""deepagents' "hello world" program, one sandbox per conversation: the get-or-create by
thread_id pattern of its sandboxes page, with a Tether sandbox in place of Daytona's."""

import uuid

from deepagents import create_deep_agent
from tether_sandbox import Sandbox  # TETHER_RELAY / TETHER_TOKEN, or relay=, token=
from tether_sandbox.integrations.deepagents import TetherSandbox

from _scripted import chat_model  # Claude with ANTHROPIC_API_KEY, else these calls in turn

model = chat_model([
    ("write_file", {"file_path": "/workspace/hello.py", "content": "print('Hello,', 'world!')\n"}),
    ("execute", {"command": "python3 /workspace/hello.py"}),
])
thread_id = str(uuid.uuid4())
sb = Sandbox.get_or_create({"thread_id": thread_id}, ttl=3600)  # found again by its label
agent = create_deep_agent(
    model=model,
    backend=TetherSandbox(sb),
    system_prompt="You are a coding assistant with sandbox access. You can create and run code in the sandbox.",
)
try:
    result = agent.invoke(
        {"messages": [{"role": "user", "content": "Create a hello world Python script and run it"}]},
        config={"configurable": {"thread_id": thread_id}},
    )
    print(result["messages"][-1].content)
except Exception:
    sb.delete()  # optional: the TTL deletes it anyway
    raise
