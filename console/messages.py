"""Messages the console's sampling worker posts to the app: facts about what a tick produced."""
from __future__ import annotations

from textual.message import Message

from gpudeck.jobs.telemetry.snapshot import Snapshot


class SamplesCollected(Message):
    """A sampling tick produced a snapshot of the box."""

    def __init__(self, snapshot: Snapshot) -> None:
        super().__init__()
        self.snapshot = snapshot


class SampleFailed(Message):
    """A sampling tick raised; the last good values are now stale."""

    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error
