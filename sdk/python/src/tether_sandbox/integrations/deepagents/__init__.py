"""deepagents on Tether.

- ``backend.TetherSandbox``: a ``BaseSandbox`` on the agent's native file operations (no python3
  in the image), with async twins.
- ``provider.TetherProvider``: the deepagents-code ``SandboxProvider`` (``get_or_create`` /
  ``delete``), the ``tether`` entry point of ``deepagents_code.sandbox_providers``.

Install with ``pip install 'tether-sandbox[deepagents]'``.
"""

from .backend import TetherSandbox
from .provider import TetherProvider

__all__ = ["TetherProvider", "TetherSandbox"]
