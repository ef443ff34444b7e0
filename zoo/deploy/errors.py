"""The one exception the deploy check raises for bad input (a path, a config key, a model folder).

It is the program reader's :class:`~zoo.weights.program.ProgramError` under the deploy check's
name: a bad model folder found while reading the program and a bad key found by the check are one
kind of error, caught and printed alike. The message is one line naming the file or key and what
was expected, and the tool prints it without a traceback.
"""
from __future__ import annotations

from zoo.weights.program import ProgramError

__all__ = ["DeployError"]

# A ValueError, so the tools print it as one ``error:`` line with exit status 2 (tools/_entry.py).
DeployError = ProgramError
