"""Agno on Tether.

- ``tools.TetherTools`` (also named ``E2BToolkit``, as on the E2B toolkit's page): a
  ``Toolkit`` with the tools of Agno's E2B toolkit (stateful Python, commands, background jobs,
  files, figures and chart data, preview URLs, run_server, sandbox management); no tool raises.
- ``manager.SandboxManager``: several sandboxes at once, one the default; it takes the page's
  ``api_key`` and ignores it (the relay's token is ``token=`` or ``TETHER_TOKEN``).

Install with ``pip install 'tether-sandbox[agno]'``.
"""

from .manager import SandboxManager, SandboxSlot
from .tools import E2BToolkit, TetherTools

__all__ = ["E2BToolkit", "SandboxManager", "SandboxSlot", "TetherTools"]
