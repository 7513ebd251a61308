"""What the app hands each telemetry screen after a tick: the latest snapshot, its history, and whether it is stale."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Protocol, Sequence

from gpudeck.jobs.telemetry.snapshot import Snapshot


class SeriesSource(Protocol):
    def series(self, key: tuple[Any, ...]) -> Sequence[Any]: ...


@dataclass(frozen=True)
class TelemetryView:
    snapshot: Optional[Snapshot]          # None until the first tick succeeds
    history: Optional[SeriesSource]
    stale: bool = False                   # the last tick failed: values shown are old
    error: Optional[str] = None           # why the last tick failed
    paused: bool = False                  # the operator froze sampling
    refresh_s: float = 1.0

    def values(self, key: tuple[Any, ...], limit: int) -> list[Optional[float]]:
        """The last `limit` points of one history series, as plain numbers (None for gaps)."""
        if self.history is None or limit <= 0:
            return []
        try:
            points = list(self.history.series(key))[-limit:]
        except (KeyError, LookupError):
            return []
        # Accept both bare values and (time, value) pairs, so the ring buffer may store either.
        return [p[-1] if isinstance(p, tuple) else p for p in points]
