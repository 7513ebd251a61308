"""Every process on every GPU: who it is, what it holds, what it costs."""
from __future__ import annotations

from typing import Optional

from gpudeck.jobs.telemetry.snapshot import Snapshot

from gpudeck.console.feeds import FollowsTelemetry
from gpudeck.console.format import NA, human_age, human_bytes, safe_text
from gpudeck.console.telemetry_view import TelemetryView
from gpudeck.console.widgets.rows_table import Cell, Column, RowsTable

UNKNOWN_PID = "pid not in this /proc (other PID namespace?)"


def _num(value: Optional[float], fmt: str) -> str:
    return NA if value is None else format(value, fmt)


class GpuProcessTable(FollowsTelemetry, RowsTable):
    COLUMNS = (
        Column("gpu", 3, right=True), Column("pid", 8, right=True), Column("user", 10),
        Column("GPU mem", 7, right=True), Column("SM%", 4, right=True), Column("CPU%", 5, right=True),
        Column("RSS", 6, right=True), Column("age", 6, right=True), Column("command"),
    )
    EMPTY = "no GPU processes"

    def apply_telemetry(self, view: TelemetryView) -> None:
        self.apply_snapshot(view.snapshot, view.stale)

    def apply_snapshot(self, snapshot: Snapshot | None, stale: bool) -> None:
        rows: dict[str, tuple[Cell, ...]] = {}
        if snapshot is not None:
            for gpu in snapshot.gpus:
                for p in sorted(gpu.processes, key=lambda p: p.pid):
                    info = p.proc
                    if info is not None and info.known:
                        command: Cell = safe_text(info.cmdline or info.name or "")
                        user = safe_text(info.user) or "?"
                        cpu = _num(info.cpu_percent, ".0f")
                        rss = human_bytes(info.rss) if info.rss is not None else NA
                        age = human_age(info.age_s)
                    else:
                        # The GPU driver saw it but this /proc cannot: say so rather than show a wrong process.
                        command = (UNKNOWN_PID, "italic $warning")
                        user = cpu = rss = age = "?"
                    rows[f"{gpu.index}:{p.pid}"] = (
                        str(gpu.index), str(p.pid), user,
                        human_bytes(p.mem_used) if p.mem_used is not None else NA,
                        _num(p.sm_util, ".0f"), cpu, rss, age, command,
                    )
        self.sync(rows, f"GPU processes ({len(rows)})", stale)
