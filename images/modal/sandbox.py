"""Start a Tether agent in a Modal Sandbox with Modal's own SDK (no relay).

    pip install modal && modal setup
    python images/modal/sandbox.py                   # Debian slim plus ./tether-agent
    TETHER_IMAGE=ghcr.io/you/tether-sandbox:1 python images/modal/sandbox.py

It prints the agent's WebSocket URL and token; connect with the Rust client
(`tether_client::Session::connect(url, Some(token))`). To let a Tether relay create
and manage sandboxes instead, use `tether create --provider modal --image IMAGE`.
"""

import os
import secrets
import sys

import modal

AGENT_PORT = 7421
# The agent's whole command line. Modal appends it to the image's ENTRYPOINT, so the image
# must have none (`.entrypoint([])` below clears one a registry image may have).
AGENT_ARGS = ["tether-agent", "serve", "--listen", f"0.0.0.0:{AGENT_PORT}"]
# The static agent (`cargo build --release --target x86_64-unknown-linux-musl -p tether-agent`).
LOCAL_AGENT = os.environ.get(
    "TETHER_AGENT_BIN", "target/x86_64-unknown-linux-musl/release/tether-agent"
)


def image() -> modal.Image:
    prebuilt = os.environ.get("TETHER_IMAGE")
    if prebuilt:
        # images/modal/Dockerfile, or `tether image build --start cmd` then `tether image push`.
        return modal.Image.from_registry(prebuilt).entrypoint([])
    if not os.path.isfile(LOCAL_AGENT):
        sys.exit(f"{LOCAL_AGENT} not found: build the static agent or set TETHER_AGENT_BIN")
    return (
        modal.Image.debian_slim()
        .add_local_file(LOCAL_AGENT, "/usr/local/bin/tether-agent", copy=True)
        .run_commands("chmod 0755 /usr/local/bin/tether-agent")
        .entrypoint([])
    )


def main() -> None:
    app = modal.App.lookup("tether", create_if_missing=True)
    # One token per sandbox, in its environment only: the agent removes it at once, and the
    # tunnel URL alone does not let anyone in.
    token = secrets.token_hex(16)
    sandbox = modal.Sandbox.create(
        *AGENT_ARGS,
        app=app,
        image=image(),
        encrypted_ports=[AGENT_PORT],
        secrets=[modal.Secret.from_dict({"TETHER_AGENT_TOKEN": token})],
        timeout=3600,
    )
    tunnel = sandbox.tunnels()[AGENT_PORT]
    url = tunnel.url.replace("https://", "wss://", 1)
    print(f"sandbox {sandbox.object_id}")
    print(f"agent   {url}")
    print(f"token   {token}")
    print(f"stop it with: modal sandbox terminate {sandbox.object_id}  (or wait an hour)")


if __name__ == "__main__":
    main()
