"""Every process on every GPU: who it is, what it holds, what it costs."""
from __future__ import annotations

from rich.text import Text

from jobs.telemetry.snapshot import Snapshot

from console.format import NA, human_age, human_bytes, safe_text
from console.widgets.synced_table import Cell, SyncedTable

UNKNOWN_PID = "pid not in this /proc (other PID namespace?)"


def _num(value, fmt: str) -> str:
    return NA if value is None else format(value, fmt)


class GpuProcessTable(SyncedTable):
    COLUMNS = (
        ("gpu", 3), ("pid", 8), ("user", 10), ("GPU mem", 8), ("SM%", 4),
        ("CPU%", 5), ("RSS", 7), ("age", 7), ("command", None),
    )

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.border_title = "GPU processes"

    def apply_snapshot(self, snapshot: Snapshot | None, stale: bool) -> None:
        self.set_class(stale, "-stale")
        rows: dict[str, tuple[Cell, ...]] = {}
        count = 0
        if snapshot is not None:
            for gpu in snapshot.gpus:
                for p in sorted(gpu.processes, key=lambda p: p.pid):
                    count += 1
                    info = p.proc
                    known = info is not None and info.known
                    if known:
                        command = safe_text(info.cmdline or info.name or "")
                        user = safe_text(info.user) or "?"
                        cpu = _num(info.cpu_percent, ".0f")
                        rss = human_bytes(info.rss) if info.rss is not None else NA
                        age = human_age(info.age_s)
                    else:
                        command = Text(UNKNOWN_PID, style="italic")
                        user = cpu = rss = age = "?"
                    rows[f"{gpu.index}:{p.pid}"] = (
                        str(gpu.index), str(p.pid), user,
                        human_bytes(p.mem_used) if p.mem_used is not None else NA,
                        _num(p.sm_util, ".0f"), cpu, rss, age, command,
                    )
        title = f"GPU processes ({count})"
        self.border_title = title + (" · STALE" if stale else "")
        self.sync(rows)
