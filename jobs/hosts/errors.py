"""The failures of a remote host, importable without asyncssh (the CLI's mux client needs only these)."""
from __future__ import annotations

from typing import Optional


class HostError(Exception):
    """The host cannot be reached or its agent failed: one line for the operator."""


class HostKeyError(HostError):
    """Unknown or changed host key: refused, with the fingerprint and how to trust it."""

    def __init__(self, message: str, fingerprint: Optional[str] = None) -> None:
        super().__init__(message)
        self.fingerprint = fingerprint


class RemoteError(Exception):
    """The agent answered, with an error (unknown job, no jobs file...): one line, and the exit code the box
    gave it (2: the request was refused; 1: the box could not do it)."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code if code in (1, 2, 3) else 2
