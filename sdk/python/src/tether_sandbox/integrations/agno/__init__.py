"""Agno on Tether.

- ``tools.TetherTools``: a ``Toolkit`` with the tools of Agno's E2B toolkit (stateful Python,
  commands, background jobs, files, preview URLs, run_server, sandbox management).
- ``manager.SandboxManager``: several sandboxes at once, one the default.

Install with ``pip install 'tether-sandbox[agno]'``.
"""

from .manager import SandboxManager, SandboxSlot
from .tools import TetherTools

__all__ = ["SandboxManager", "SandboxSlot", "TetherTools"]
