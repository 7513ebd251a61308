"""One GPU as a full card (roomy terminals), and the one-line form small terminals use."""
from __future__ import annotations

from typing import Any, Optional, Sequence

from textual.strip import Strip
from textual.widget import Widget

from gpudeck.jobs.telemetry.snapshot import GpuSample

from gpudeck.console.widgets.border_titles import set_border_titles
from gpudeck.console.widgets.strip_painter import PaintedLines, Part, content_width, refresh_changed_lines
from gpudeck.console.format import NA, hbar, human_bytes, level_style, pct, short_gpu_name, sparkline

# Clock-event reasons a driver reports in normal operation: showing them would cry wolf.
BENIGN_THROTTLE_REASONS = frozenset({
    "gpu_idle", "idle", "none", "applications_clocks_setting", "app_clocks",
    "clocks_event_reason_gpu_idle", "clocks_event_reason_applications_clocks_setting",
})

# A card is this many rows tall (border included); the grid panel needs it to pick a density.
CARD_HEIGHT = 8
# Thresholds for colouring: where an operator should look, and where act.
UTIL_WARN, UTIL_CRIT = 101.0, 101.0     # busy GPUs are good news: util is never alarming
MEM_WARN, MEM_CRIT = 85.0, 95.0
TEMP_WARN, TEMP_CRIT = 80.0, 88.0
POWER_WARN, POWER_CRIT = 90.0, 98.0     # percent of the power limit


def active_throttle_reasons(sample: GpuSample) -> list[str]:
    return [r for r in sample.throttle_reasons if r.lower() not in BENIGN_THROTTLE_REASONS]


def _mem_fraction(sample: GpuSample) -> Optional[float]:
    if sample.mem_used is None or not sample.mem_total:
        return None
    return sample.mem_used / sample.mem_total


def _power_pct(sample: GpuSample) -> Optional[float]:
    if sample.power_w is None or not sample.power_limit_w:
        return None
    return 100.0 * sample.power_w / sample.power_limit_w


def _temp(sample: GpuSample) -> str:
    return NA if sample.temp is None else f"{sample.temp:.0f}°C"


def _power(sample: GpuSample, with_limit: bool) -> str:
    if sample.power_w is None:
        return "n/a W"
    if with_limit and sample.power_limit_w:
        return f"{sample.power_w:.0f}/{sample.power_limit_w:.0f}W"
    return f"{sample.power_w:.0f}W"


def _mem_text(sample: GpuSample) -> str:
    if sample.mem_used is None:
        return NA
    return f"{human_bytes(sample.mem_used)}/{human_bytes(sample.mem_total)}"


def _clock(mhz: Optional[int]) -> str:
    return NA if mhz is None else f"{mhz}MHz"


def gpu_line_parts(s: GpuSample, recent_util: Sequence[Optional[float]], width: int, stale: bool) -> list[Part]:
    """One GPU in one line of `width` cells: fixed fields first, the rest of the width to the sparkline."""
    parts: list[Part] = []
    used = 0

    def add(text: str, style: str = "") -> None:
        nonlocal used
        parts.append((text, style) if style else text)
        used += len(text)

    mem_frac = _mem_fraction(s)
    mem_pct = None if mem_frac is None else mem_frac * 100
    sim = s.simulated
    sim_w = 4 if sim else 0
    roomy = width >= 72
    wide = width >= 110
    add(f"{s.index:>1} ", "bold")
    add(f"{short_gpu_name(s.name)[:8]:<8} ", "$text-muted")
    bar_w = 10 if roomy else 6
    add(hbar(None if s.util is None else s.util / 100, bar_w), "$primary on $panel")
    add(f"{pct(s.util)} ")
    add(hbar(mem_frac, bar_w), f"{level_style(mem_pct, MEM_WARN, MEM_CRIT)} on $panel")
    add(f" {_mem_text(s):<10} " if roomy else f"{pct(mem_pct)} ")
    add(f"{_temp(s):>5} ", level_style(s.temp, TEMP_WARN, TEMP_CRIT))
    power = _power(s, with_limit=wide)
    if used + len(power) + 1 + sim_w <= width:
        add(f"{power:>9} " if wide else f"{power:>5} ", level_style(_power_pct(s), POWER_WARN, POWER_CRIT))
    if wide and used + 9 + sim_w <= width:
        add(f"{_clock(s.sm_clock_mhz):>8} ", "$text-muted")
    if active_throttle_reasons(s) and used + 4 + sim_w <= width:
        add("THR ", "bold $error")
    sim_label = "SIMULATED" if width - used >= 9 + 12 else "SIM"
    spark_w = width - used - (len(sim_label) if sim else 0)
    if spark_w >= 4:
        add(sparkline(recent_util, spark_w - 1) + " ", "$text-muted" if stale else "$primary")
    if sim:
        add(sim_label, "bold $warning")
    return parts


class GpuCardPanel(PaintedLines, Widget):
    """Renders one GpuSample; redraws only when what it shows changed."""

    DEFAULT_CSS = """
    GpuCardPanel {
        width: 1fr;
        text-wrap: nowrap;
        text-overflow: ellipsis;
        height: 8;
        border: round $primary 60%;
        border-title-color: $foreground;
        border-title-style: bold;
        border-subtitle-color: $warning;
        border-subtitle-style: bold;
        padding: 0 1;
    }
    GpuCardPanel.-stale {
        color: $text-muted;
        border: round $error 60%;
    }
    """

    def __init__(self, index: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.index = index
        self.sample: Optional[GpuSample] = None
        self.recent_util: Sequence[Optional[float]] = ()
        self.stale = False
        self._shown: object = None
        self._lines: tuple[int, list[list[Part]]] = (-1, [])    # (width, the card's lines as parts)

    def update_card(self, sample: GpuSample, recent_util: Sequence[Optional[float]], stale: bool) -> None:
        key = (sample, tuple(recent_util), stale)
        if key == self._shown:
            return
        self._shown = key
        self.sample = sample
        self.recent_util = recent_util
        restyled = stale != self.stale
        if restyled:
            self.stale = stale
            self.set_class(stale, "-stale")
            self._painter.invalidate()      # the class changes the base style; data alone does not
        self._update_titles()
        width = content_width(self)
        shown = self._lines[1] if self._lines[0] == width and not restyled else None
        self._lines = (width, self.card_lines(width))
        if shown is None:
            self.refresh()
        else:
            # Clocks, memory and throttling rarely move: most ticks repaint util, temp/power and the sparkline.
            refresh_changed_lines(self, shown, self._lines[1])

    def _update_titles(self) -> None:
        sample = self.sample
        if sample is None:
            return
        title = f"GPU {sample.index} · {short_gpu_name(sample.name)}"
        if self.stale:
            title += " · STALE"
        set_border_titles(self, title, "SIMULATED" if sample.simulated else None)

    def lines(self) -> list[list[Part]]:
        width = content_width(self)
        if self._lines[0] != width:
            self._lines = (width, self.card_lines(width))
        return self._lines[1]

    def render_line(self, y: int) -> Strip:
        return self.painted_line(y, self.lines())

    def card_lines(self, width: int) -> list[list[Part]]:
        """The card's lines for `width` cells, as (text, style) parts."""
        s = self.sample
        if s is None:
            return [[(f"GPU {self.index}: waiting for the first sample…", "$text-muted")]]
        mem_frac = _mem_fraction(s)
        mem_pct = None if mem_frac is None else mem_frac * 100
        label_w = 5
        tail_w = 5  # " 100%"
        bar_w = max(4, width - label_w - tail_w)
        fan = "" if s.fan_pct is None else f"  fan {s.fan_pct:.0f}%"
        throttled = active_throttle_reasons(s)
        return [
            [("util ", "$text-muted"),
             (hbar(None if s.util is None else s.util / 100, bar_w), "$primary on $panel"),
             pct(s.util, 4)],
            [("mem  ", "$text-muted"),
             (hbar(mem_frac, bar_w), f"{level_style(mem_pct, MEM_WARN, MEM_CRIT)} on $panel"),
             pct(mem_pct, 4)],
            [(_temp(s), level_style(s.temp, TEMP_WARN, TEMP_CRIT)), "  ",
             (_power(s, with_limit=True), level_style(_power_pct(s), POWER_WARN, POWER_CRIT)),
             "  " + _mem_text(s), (fan, "$text-muted")],
            [("SM ", "$text-muted"), _clock(s.sm_clock_mhz), ("  mem ", "$text-muted"), _clock(s.mem_clock_mhz)],
            [("throttle: " + ", ".join(throttled), "bold $error")] if throttled
            else [("no throttling", "$text-muted")],
            [(sparkline(self.recent_util, width), "$text-muted" if self.stale else "$primary")],
        ]
