"""Listening TCP ports and who owns them."""
from __future__ import annotations

from gpudeck.jobs.telemetry.snapshot import Snapshot

from gpudeck.console.feeds import FollowsTelemetry
from gpudeck.console.format import safe_text
from gpudeck.console.telemetry_view import TelemetryView
from gpudeck.console.widgets.rows_table import Cell, Column, RowsTable


class PortsTable(FollowsTelemetry, RowsTable):
    COLUMNS = (Column("port", 5, right=True), Column("address", 15), Column("pid", 8, right=True), Column("process"))
    EMPTY = "no listening TCP ports"

    def apply_telemetry(self, view: TelemetryView) -> None:
        self.apply_snapshot(view.snapshot, view.stale)

    def apply_snapshot(self, snapshot: Snapshot | None, stale: bool) -> None:
        rows: dict[str, tuple[Cell, ...]] = {}
        ports = sorted(snapshot.ports, key=lambda p: (p.port, p.address)) if snapshot else []
        for listener in ports:
            if listener.pid is None:
                pid: Cell = "?"
                process: Cell = ("owner not readable (needs root?)", "italic $text-muted")
            else:
                pid = str(listener.pid)
                process = safe_text(listener.process) or "?"
            rows[f"{listener.address}:{listener.port}"] = (str(listener.port), safe_text(listener.address), pid, process)
        self.sync(rows, f"listening ports ({len(rows)})", stale)
