"""The one exception the deploy check raises for bad input (a path, a config key, a model folder).

Its own module so that every piece of zoo/deploy can raise it without importing the program
interpreter; ``zoo.deploy.program`` re-exports it. The message is one line naming the file or key
and what was expected, and the tool prints it without a traceback.
"""
from __future__ import annotations

__all__ = ["DeployError"]


class DeployError(ValueError):
    """Bad input to the deploy check: the message names the path or key and what was expected. A
    ValueError, so the tools print it as one ``error:`` line with exit status 2 (tools/_entry.py)."""
