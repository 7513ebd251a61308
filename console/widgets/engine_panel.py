"""The engine panel: each inference engine's state, model, port, uptime and serving numbers with short history."""
from __future__ import annotations

from collections import deque
from typing import Any, Optional

from textual.content import Content
from textual.widget import Widget

from gpudeck.console.format import human_age, human_bytes, safe_text, sparkline
from gpudeck.jobs.view import EngineView

HISTORY = 40          # samples kept per engine and number: 40 s at the default refresh
SPARK_WIDTH = 10


def _num(value: Any, fmt: str) -> str:
    return "—" if not isinstance(value, (int, float)) else format(value, fmt)


STATE_STYLES = {"ready": "bold $success", "running": "$success", "loading": "$warning", "starting": "$warning",
                "compiling": "$warning", "capturing": "$warning", "unhealthy": "bold $error", "failed": "bold $error",
                "lost": "bold $error", "exited": "$text-muted", "stopped": "$text-muted", "idle": "$text-muted"}


class EnginePanel(Widget):
    """Shows nothing (and takes no room) until there is an engine job or a foreign engine."""

    DEFAULT_CSS = """
    EnginePanel { height: auto; max-height: 12; padding: 0 1; border-top: solid $panel; display: none;
                  text-wrap: nowrap; text-overflow: ellipsis; }
    EnginePanel.-has-engines { display: block; }
    """

    def __init__(self, clock: Any = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        import time
        self.clock = clock or time.time
        self.rows: list[EngineView] = []
        self._history: dict[str, dict[str, deque]] = {}
        self._history_at: Optional[float] = None

    def update_engines(self, rows: list[EngineView], at: Optional[float] = None) -> None:
        """Show `rows`; their serving numbers join the graphs once per instant `at` (a paused
        replay republishes the same instant, which must not grow the graphs)."""
        self.rows = rows
        fresh = at is None or at != self._history_at
        self._history_at = at
        for row in rows if fresh else ():
            history = self._history.setdefault(row.name, {k: deque(maxlen=HISTORY)
                                                          for k in ("gen_tokens_per_s", "kv_cache_pct", "running")})
            serving = row.serving or {}
            for key, values in history.items():
                values.append(serving.get(key) if row.serving else None)
        for name in set(self._history) - {row.name for row in rows}:
            del self._history[name]
        self.set_class(bool(rows), "-has-engines")
        self.refresh(layout=True)

    def reset_history(self) -> None:
        """Forget the graphs (the engines shown are now others: a replay began or ended)."""
        self._history.clear()
        self._history_at = None

    def history(self, name: str, key: str) -> list[Optional[float]]:
        return list(self._history.get(name, {}).get(key, ()))

    def lines(self) -> list[Content]:
        now = self.clock()
        out: list[Content] = []
        for row in self.rows:
            if row.managed:
                parts: list = [(f"{safe_text(row.name, 24)} ", "bold"), f"{row.engine or '?'} ",
                               (row.state.upper(), STATE_STYLES.get(row.state, "$foreground"))]
            else:
                parts = [(" FOREIGN ", "bold reverse $warning"), " ", (safe_text(row.name, 24), "bold"),
                         (" orphan" if row.orphan else "", "$error")]
            if row.model:
                parts.append(f"  {safe_text(row.model, 40)}")
            if row.port is not None:
                shown = "open" if row.port_open else "shut"
                parts.append((f"  :{row.port} {shown}", "$success" if row.port_open else "$text-muted"))
            if row.started_at:
                parts.append(f"  up {human_age(now - row.started_at)}")
            if row.gpu_mem:
                parts.append(f"  {human_bytes(row.gpu_mem)} GPU")
            out.append(Content.assemble(*parts))
            if row.serving:
                s = row.serving
                gen = self.history(row.name, "gen_tokens_per_s")
                kv = self.history(row.name, "kv_cache_pct")
                peak = max([v for v in gen if isinstance(v, (int, float))] + [1.0])
                # Graphs grow with the history instead of padding a lone sample with blanks.
                width = min(SPARK_WIDTH, len(gen))
                serving: list = [
                    "   gen ", (_num(s.get("gen_tokens_per_s"), ".1f"), "bold"), " tok/s ",
                    (sparkline(gen, width, 0.0, peak), "$accent"),
                    f"  run {_num(s.get('running'), '.0f')} wait {_num(s.get('waiting'), '.0f')}",
                    f"  KV {_num(s.get('kv_cache_pct'), '.0f')}% ",
                    (sparkline(kv, min(5, len(kv)), 0.0, 100.0), "$accent"),
                ]
                if s.get("spec_accept_rate") is not None or s.get("spec_accept_len") is not None:
                    rate = s.get("spec_accept_rate")
                    serving.append(f"  spec accept {_num(rate * 100 if isinstance(rate, (int, float)) else None, '.0f')}%"
                                   f" len {_num(s.get('spec_accept_len'), '.2f')}")
                out.append(Content.assemble(*serving))
            elif not row.managed and row.cmdline:
                out.append(Content.styled(f"   {safe_text(row.cmdline, 200)}", "$text-muted"))
        return out

    def render(self) -> Content:
        return Content("\n").join(self.lines()) if self.rows else Content("")
