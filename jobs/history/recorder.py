"""The run's summary (summary.json), kept by the runner while the job runs: phase changes, a decimated resource/serving timeline, peaks, a sparse line index and the analyzer's final state.

Stdlib only: it runs inside the runner. It exists so that a post-mortem never
re-reads a 1 GB log or 86,400 samples: everything a report needs beyond
events.jsonl is here, in a file of a few hundred KB at most.
"""
from __future__ import annotations

import json
import os
import time
from array import array
from bisect import bisect_left
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional

from gpudeck.jobs.strictjson import number

SUMMARY = "summary.json"
SUMMARY_VERSION = 1
# A chart is a few hundred pixels wide: more points than this only cost bytes.
MAX_BUCKETS = 720
# A line checkpoint every few MB: finding any line then reads at most that much (plus one tick's read).
CHECKPOINT_EVERY = 4 * 1024 * 1024
# summary.json is rewritten this often while the run lives, so a SIGKILLed runner leaves a recent one.
FLUSH_EVERY_S = 60.0

# Series kept at their bucket's maximum (a peak must survive decimation); the others are averaged.
_MAX_SERIES_PREFIXES = ("rss", "mem", "running", "waiting", "kv_cache_pct")
SERVING_SERIES = ("gen_tokens_per_s", "prompt_tokens_per_s", "running", "waiting", "kv_cache_pct",
                  "spec_accept_rate")


def _is_max_series(name: str) -> bool:
    base = name.split(":", 1)[-1]
    return base.startswith(_MAX_SERIES_PREFIXES)


_num = number               # the one strict number rule (strictjson)


class Timeline:
    """Fixed-size bucketed series: when there are too many buckets, the bucket width doubles."""

    def __init__(self, width_s: float = 1.0, max_buckets: int = MAX_BUCKETS) -> None:
        self.width = float(width_s)
        self.max_buckets = max_buckets
        self.origin: Optional[float] = None
        self.buckets: list[tuple[int, dict[str, list[float]]]] = []   # (index, {series: [value, n]})

    def add(self, t: float, values: Mapping[str, Optional[float]]) -> None:
        if self.origin is None:
            self.origin = t
        idx = max(0, int((t - self.origin) // self.width))
        if self.buckets and self.buckets[-1][0] == idx:
            cells = self.buckets[-1][1]
        elif self.buckets and idx < self.buckets[-1][0]:
            cells = self.buckets[-1][1]            # a clock step backwards: fold into the last bucket
        else:
            cells = {}
            self.buckets.append((idx, cells))
        for name, value in values.items():
            if value is None:
                continue
            _merge_cell(cells, name, value, 1)
        while len(self.buckets) > self.max_buckets:
            self._coarsen()

    def _coarsen(self) -> None:
        self.width *= 2
        merged: list[tuple[int, dict[str, list[float]]]] = []
        for idx, cells in self.buckets:
            new = idx // 2
            if merged and merged[-1][0] == new:
                target = merged[-1][1]
                for name, (value, n) in cells.items():
                    _merge_cell(target, name, value, n)
            else:
                merged.append((new, {k: list(v) for k, v in cells.items()}))
        self.buckets = merged

    def to_json(self) -> dict:
        names = sorted({name for _, cells in self.buckets for name in cells})
        origin = self.origin or 0.0
        series: dict[str, list[Optional[float]]] = {name: [] for name in names}
        times = []
        for idx, cells in self.buckets:
            times.append(round(origin + idx * self.width, 3))
            for name in names:
                cell = cells.get(name)
                if cell is None:
                    series[name].append(None)
                elif _is_max_series(name):
                    series[name].append(round(cell[0], 3))
                else:
                    series[name].append(round(cell[0] / cell[1], 3))
        return {"width_s": self.width, "t": times, "series": series}


def _merge_cell(cells: dict[str, list[float]], name: str, value: float, n: float) -> None:
    """Fold `n` samples summing (or peaking at) `value` into cells[name], a [value, n] pair (n a count)."""
    cell = cells.get(name)
    if cell is None:
        cells[name] = [value, n]
    elif _is_max_series(name):
        if value > cell[0]:
            cell[0] = value
        cell[1] += n
    else:
        cell[0] += value
        cell[1] += n


class SampleRates:
    """Cumulative counters of consecutive samples (cpu seconds, bytes read, log bytes) turned into rates."""

    def __init__(self) -> None:
        self.prev: Optional[tuple[float, Optional[float], Optional[float], Optional[float]]] = None

    def values(self, sample: Mapping[str, Any]) -> dict[str, Optional[float]]:
        """One sample as chart values: CPU %, RSS, disk read rate, log rate, GPU memory/util/power per GPU."""
        t = _num(sample.get("t"))
        cpu_s, read_b, log_b = _num(sample.get("cpu_s")), _num(sample.get("read_bytes")), _num(sample.get("log_bytes"))
        out: dict[str, Optional[float]] = {"rss": _num(sample.get("rss"))}
        prev, self.prev = self.prev, (t or 0.0, cpu_s, read_b, log_b)
        if prev is not None and t is not None and t > prev[0]:
            dt = t - prev[0]
            # A child that exited takes its counters with it: a negative delta is unknown, not zero.
            for key, now_v, prev_v, scale in (("cpu_pct", cpu_s, prev[1], 100.0), ("read_bps", read_b, prev[2], 1.0),
                                              ("log_bps", log_b, prev[3], 1.0)):
                if now_v is not None and prev_v is not None and now_v >= prev_v:
                    out[key] = (now_v - prev_v) / dt * scale
        gpu = sample.get("gpu")
        if isinstance(gpu, Mapping):
            mem: dict[str, float] = {}
            for holder in gpu.get("mem_by_pid") or ():
                if isinstance(holder, Mapping) and _num(holder.get("mem")) is not None:
                    key = str(holder.get("gpu"))
                    mem[key] = mem.get(key, 0.0) + float(holder["mem"])
            for key in (gpu.get("util") or {}) if isinstance(gpu.get("util"), Mapping) else ():
                mem.setdefault(str(key), 0.0)
            for key, value in mem.items():
                out[f"gpu{key}:mem"] = value
            for field, name in (("util", "util"), ("power_w", "power_w")):
                values = gpu.get(field)
                if isinstance(values, Mapping):
                    for key, value in values.items():
                        out[f"gpu{key}:{name}"] = _num(value)
        return out


class RunRecorder:
    """Fed once a tick by the runner (through runner_monitors); writes <run>/summary.json."""

    def __init__(self, run_dir: Path, *, clock: Callable[[], float] = time.time) -> None:
        self.run_dir = Path(run_dir)
        self.clock = clock
        self.timeline = Timeline()
        self.rates = SampleRates()
        self.phases: list[dict] = []
        self.checkpoints: list[list[int]] = [[0, 0]]      # [offset, newlines before it]
        self.peak_rss: Optional[float] = None
        self.peak_gpu_mem: dict[str, float] = {}
        self.peak_cpu_pct: Optional[float] = None
        self.peak_read_bps: Optional[float] = None
        self.samples = 0
        self.first_t: Optional[float] = None
        self.last_t: Optional[float] = None
        self.analysis: dict = {}
        self.log_offset = 0
        self.lines = 0
        self._arrival_sizes = array("q")
        self._arrival_times = array("d")
        self._last_flush = 0.0

    # -- each tick ------------------------------------------------------------
    def observe(self, now: float, sample: Mapping[str, Any], *, log_size: Optional[int] = None,
                analysis: Optional[Mapping[str, Any]] = None, log_offset: Optional[int] = None,
                line: Optional[int] = None) -> None:
        if log_size is not None and (not self._arrival_sizes or log_size > self._arrival_sizes[-1]):
            self._arrival_sizes.append(int(log_size))
            self._arrival_times.append(float(now))
        values = self.rates.values(sample)
        t = _num(sample.get("t")) or now
        if analysis:
            serving = analysis.get("serving")
            if isinstance(serving, Mapping) and analysis.get("phase") == "ready":
                for key in SERVING_SERIES:
                    values[f"serving:{key}"] = _num(serving.get(key))
        self._peaks(values)
        self.timeline.add(t, values)
        self.samples += 1
        self.first_t = t if self.first_t is None else self.first_t
        self.last_t = t
        self.observe_log(now, analysis, log_offset, line)
        if now - self._last_flush >= FLUSH_EVERY_S:
            self.flush(final=False, now=now)

    def observe_log(self, now: float, analysis: Optional[Mapping[str, Any]], log_offset: Optional[int],
                    line: Optional[int]) -> None:
        """The analyzer's state after reading up to `log_offset`: keep it, note a phase change."""
        if analysis:
            self.analysis = dict(analysis)
        if log_offset is not None:
            self._log_position(int(log_offset), line)
        phase = analysis.get("phase") if analysis else None
        if isinstance(phase, str) and (not self.phases or self.phases[-1]["phase"] != phase):
            # The analyzer saw the change somewhere in the bytes read up to log_offset: date it
            # by when those bytes arrived, not by when this tick read them.
            at = self.arrival_time(self.log_offset) if log_offset is not None else None
            self.phases.append({"phase": phase, "t": round(at if at is not None else now, 3),
                                "offset": self.log_offset, "line": max(1, self.lines - 1) if self.lines else None})

    def _peaks(self, values: Mapping[str, Optional[float]]) -> None:
        for key, value in values.items():
            if value is None:
                continue
            if key == "rss":
                self.peak_rss = value if self.peak_rss is None else max(self.peak_rss, value)
            elif key == "cpu_pct":
                self.peak_cpu_pct = value if self.peak_cpu_pct is None else max(self.peak_cpu_pct, value)
            elif key == "read_bps":
                self.peak_read_bps = value if self.peak_read_bps is None else max(self.peak_read_bps, value)
            elif key.startswith("gpu") and key.endswith(":mem"):
                gpu = key[3:-4]
                self.peak_gpu_mem[gpu] = max(self.peak_gpu_mem.get(gpu, 0.0), value)

    def _log_position(self, offset: int, line: Optional[int]) -> None:
        self.log_offset = offset
        if line is not None:
            self.lines = int(line)
            # `line` is the 1-based line the next byte belongs to: line-1 newlines precede `offset`.
            if offset - self.checkpoints[-1][0] >= CHECKPOINT_EVERY:
                self.checkpoints.append([offset, max(0, int(line) - 1)])

    def arrival_time(self, offset: int) -> Optional[float]:
        """When the byte at `offset` had arrived (the first recorded size past it)."""
        i = bisect_left(self._arrival_sizes, offset + 1) if offset >= 0 else 0
        if i < len(self._arrival_times):
            return self._arrival_times[i]
        return self._arrival_times[-1] if self._arrival_times else None

    # -- output ---------------------------------------------------------------
    def to_json(self, final: bool, now: Optional[float] = None) -> dict:
        return {
            "version": SUMMARY_VERSION, "final": final, "written_at": round(now or self.clock(), 3),
            "analysis": self.analysis, "phases": self.phases,
            "log": {"bytes": self.log_offset, "lines": self.lines, "checkpoints": self.checkpoints},
            "timeline": self.timeline.to_json(),
            "samples": {"count": self.samples, "first_t": self.first_t, "last_t": self.last_t},
            "peaks": {"rss": self.peak_rss, "gpu_mem": self.peak_gpu_mem, "cpu_pct": self.peak_cpu_pct,
                      "read_bps": self.peak_read_bps},
        }

    def flush(self, final: bool, now: Optional[float] = None) -> None:
        now = self.clock() if now is None else now
        self._last_flush = now
        path = self.run_dir / SUMMARY
        tmp = path.with_name(f".{SUMMARY}.{os.getpid()}.tmp")
        try:
            from gpudeck.jobs.runs import open_private
            try:
                os.unlink(tmp)                 # a stale (or planted) tmp is replaced, never followed
            except FileNotFoundError:
                pass
            with open(open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL), "w", encoding="utf-8") as fh:
                json.dump(self.to_json(final, now), fh, separators=(",", ":"), default=str)
            os.replace(tmp, path)
        except OSError:
            pass            # a full disk costs the summary, never the run


def timeline_from_samples(samples: Iterable[Mapping[str, Any]]) -> tuple[dict, dict]:
    """(timeline, peaks) from raw samples, for runs whose runner left no summary.json."""
    rec = RunRecorder(Path("."))
    for sample in samples:
        t = _num(sample.get("t"))
        if t is None:
            continue
        values = rec.rates.values(sample)
        rec._peaks(values)
        rec.timeline.add(t, values)
        rec.samples += 1
        rec.first_t = t if rec.first_t is None else rec.first_t
        rec.last_t = t
    data = rec.to_json(final=False)
    return data["timeline"], data["peaks"]


def read_summary(run_dir: Path, notes: Optional[list] = None) -> Optional[dict]:
    """summary.json through the strict, bounded loader; None when missing, unreadable (a note) or of another version."""
    from gpudeck.jobs.runs import read_json
    data = read_json(Path(run_dir) / SUMMARY, notes)
    return data if data is not None and data.get("version") == SUMMARY_VERSION else None
