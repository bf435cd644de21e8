"""Exceptions shared across packages."""

from __future__ import annotations


class StartupError(Exception):
    """A reason to refuse to start that the operator can act on (printed as one line by the
    command-line entry points, exit status 1)."""
