"""The host: CPU (total and per core), load, RAM and swap, disk and network rates."""
from __future__ import annotations

from typing import Any, Optional

from textual.geometry import Size
from textual.strip import Strip
from textual.widget import Widget

from gpudeck.jobs.telemetry.snapshot import HostSample

from gpudeck.console.feeds import FollowsTelemetry
from gpudeck.console.format import hbar, human_bytes, human_rate, level_style, pct, safe_text
from gpudeck.console.telemetry_view import TelemetryView
from gpudeck.console.widgets.border_titles import set_border_titles
from gpudeck.console.widgets.strip_painter import PaintedLines, Part, content_width, plain, refresh_changed_lines

_LEVELS = "▁▂▃▄▅▆▇█"
# Few cores get a labelled bar each; more (a 16-core VM, a 192-core box) get one glyph each.
# Labelled bars for 16 cores took 6 lines whose figures moved nearly every tick, the most
# repainted lines of the dashboard; 16 glyphs fit one line and change only across a level.
LABELLED_CORES_MAX = 8

Line = list[Part]


def _core_glyph(value: float) -> str:
    return _LEVELS[min(len(_LEVELS) - 1, int(max(value, 0.0) / 100 * len(_LEVELS)))]


def host_lines(h: Optional[HostSample], width: int, message: str) -> list[Line]:
    """The panel's lines for `width` cells, as (text, style) parts."""
    if h is None:
        return [[(message, "$text-muted")]]
    width = max(width, 20)
    bar_w = max(6, min(30, width // 3))
    cpu: Line = [
        ("CPU  ", "$text-muted"),
        (hbar(None if h.cpu_percent is None else h.cpu_percent / 100, bar_w),
         f"{level_style(h.cpu_percent, 85, 97)} on $panel"),
        pct(h.cpu_percent, 4),
        ("  load ", "$text-muted"),
        " ".join(f"{v:.2f}" for v in h.load_avg),
    ]
    cores = f"  {h.cpu_count} cores"
    if len(plain(cpu)) + len(cores) <= width:
        cpu.append((cores, "$text-muted"))
    lines = [cpu]
    lines.extend(_core_lines(h, width))
    mem_frac = h.mem_used / h.mem_total if h.mem_total else None
    swap_frac = h.swap_used / h.swap_total if h.swap_total else None
    ram: Line = [
        ("RAM  ", "$text-muted"),
        (hbar(mem_frac, bar_w), f"{level_style(None if mem_frac is None else mem_frac * 100, 85, 95)} on $panel"),
        f" {human_bytes(h.mem_used)}/{human_bytes(h.mem_total)}",
    ]
    swap: Line = [
        ("swap ", "$text-muted"),
        (hbar(swap_frac, min(bar_w, 10)),
         f"{level_style(None if swap_frac is None else swap_frac * 100, 50, 80)} on $panel"),
        f" {human_bytes(h.swap_used)}/{human_bytes(h.swap_total)}",
    ]
    if len(plain(ram)) + 2 + len(plain(swap)) <= width:
        lines.append([*ram, "  ", *swap])
    else:
        lines.extend([ram, swap])
    lines.append([
        ("disk ", "$text-muted"), f"R {human_rate(h.disk_read_bps)}  W {human_rate(h.disk_write_bps)}",
        ("   net ", "$text-muted"), f"rx {human_rate(h.net_rx_bps)}  tx {human_rate(h.net_tx_bps)}",
    ])
    return lines


def _core_lines(h: HostSample, width: int) -> list[Line]:
    cores = h.cpu_per_core
    if not cores:
        return []
    if len(cores) <= LABELLED_CORES_MAX:
        cell_w = 16   # "c12 ██████  97%" plus a gap
        per_row = max(1, (width + 1) // cell_w)
        rows: list[Line] = []
        for start in range(0, len(cores), per_row):
            row: Line = []
            for i, v in enumerate(cores[start:start + per_row], start):
                row += [(f"c{i:<2} ", "$text-muted"), (hbar(v / 100, 6), f"{level_style(v, 85, 97)} on $panel"),
                        pct(v, 4), " "]
            rows.append(row)
        return rows
    # One glyph per core, coloured by load, wrapped to the panel width after a label.
    label = "core "
    per_row = max(8, width - len(label))
    rows = []
    for start in range(0, len(cores), per_row):
        row = [(label if start == 0 else " " * len(label), "$text-muted")]
        for v in cores[start:start + per_row]:
            glyph, style = _core_glyph(v), level_style(v, 85, 97)
            if isinstance(row[-1], tuple) and row[-1][1] == style:
                row[-1] = (row[-1][0] + glyph, style)     # one span per run of equal colour
            else:
                row.append((glyph, style))
        rows.append(row)
    return rows


class HostPanel(FollowsTelemetry, PaintedLines, Widget):
    DEFAULT_CSS = """
    HostPanel {
        height: auto;
        border: round $primary;
        border-title-color: $foreground;
        border-title-style: bold;
        padding: 0 1;
    }
    HostPanel.-stale { border: round $error; color: $text-muted; }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.border_title = "host"
        self.host: Optional[HostSample] = None
        self.message = "waiting for the first sample…"
        self._shown: object = None
        self._line_count = 0
        self._lines: tuple[int, list[Line]] = (-1, [])

    def apply_telemetry(self, view: TelemetryView) -> None:
        host = view.snapshot.host if view.snapshot else None
        key = (host, view.stale, view.error if host is None else None)
        if key == self._shown:
            return
        restyled = self.has_class("-stale") != view.stale
        self._shown = key
        self.host = host
        if host is None and view.error:
            self.message = f"host data unavailable: {view.error}"
        if restyled:
            self.set_class(view.stale, "-stale")
            self._painter.invalidate()      # the class changes the base style; data alone does not
        title = f"host · {safe_text(host.name, 60)}" if host else "host"
        set_border_titles(self, title + (" · STALE" if view.stale else ""))
        width = content_width(self)
        shown = self._lines[1] if self._lines[0] == width and not restyled else None
        self._lines = (width, host_lines(host, width, self.message))
        line_count = len(self._lines[1])
        if shown is None:
            # Height depends on the core count and the width: re-layout only when the line count changes.
            self.refresh(layout=line_count != self._line_count)
        else:
            # Most ticks change the CPU, one core row and the disk/net line; the rest stays put.
            refresh_changed_lines(self, shown, self._lines[1])
        self._line_count = line_count

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(host_lines(self.host, width, self.message))

    def lines(self) -> list[Line]:
        width = content_width(self)
        if self._lines[0] != width:
            self._lines = (width, host_lines(self.host, width, self.message))
        return self._lines[1]

    def render_line(self, y: int) -> Strip:
        return self.painted_line(y, self.lines())
