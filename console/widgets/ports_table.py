"""Listening TCP ports and who owns them."""
from __future__ import annotations

from rich.text import Text

from jobs.telemetry.snapshot import Snapshot

from console.format import safe_text
from console.widgets.synced_table import Cell, SyncedTable


class PortsTable(SyncedTable):
    COLUMNS = (("port", 6), ("address", 15), ("pid", 8), ("process", None))

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.border_title = "listening ports"

    def apply_snapshot(self, snapshot: Snapshot | None, stale: bool) -> None:
        self.set_class(stale, "-stale")
        rows: dict[str, tuple[Cell, ...]] = {}
        ports = sorted(snapshot.ports, key=lambda p: (p.port, p.address)) if snapshot else []
        for listener in ports:
            if listener.pid is None:
                pid: Cell = "?"
                process: Cell = Text("owner not readable", style="italic")
            else:
                pid = str(listener.pid)
                process = safe_text(listener.process) or "?"
            rows[f"{listener.address}:{listener.port}"] = (str(listener.port), safe_text(listener.address), pid, process)
        self.border_title = f"listening ports ({len(rows)})" + (" · STALE" if stale else "")
        self.sync(rows)
