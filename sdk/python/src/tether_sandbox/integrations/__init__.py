"""Tether inside the agent frameworks: one module per framework, each an optional extra.

- ``deepagents``: ``TetherSandbox`` (a deepagents ``BaseSandbox`` on native file operations,
  no python3 needed in the image) and ``TetherProvider`` (the ``deepagents_code``
  ``SandboxProvider``, registered under the ``deepagents_code.sandbox_providers`` entry point).
- ``dynamiq``: ``TetherSandbox``, a Dynamiq ``Sandbox`` backend.
- ``agno``: ``TetherTools`` (a ``Toolkit`` with the tools of Agno's E2B toolkit) and
  ``SandboxManager`` (several sandboxes at once).
- ``openai_agents``: ``TetherSandboxClient`` and its session for ``agents.sandbox``.

Each module imports its framework at import time; this package imports none of them, so the
core SDK installs and imports without any framework (``pip install 'tether-sandbox[agno]'``
brings one in). ``_bridge`` lets framework code on any thread or event loop await the SDK.
"""
