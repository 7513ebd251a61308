"""Serving numbers of an engine: scrape /metrics (Prometheus text), turn gauges and counter deltas into rates.

prometheus_client is imported here and only here: the runner side stays stdlib-only.
When /metrics is off (SGLang without --enable-metrics) the engine's periodic log
stats lines are the fallback.
"""
from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Callable, Mapping, Optional

# --------------------------------------------------------------------------- the numbers

SERVING_KEYS = ("running", "waiting", "kv_cache_pct", "gen_tokens_per_s", "prompt_tokens_per_s",
                "spec_accept_rate", "spec_accept_len")


@dataclass(frozen=True)
class Serving:
    running: Optional[float] = None
    waiting: Optional[float] = None
    kv_cache_pct: Optional[float] = None          # 0..100
    gen_tokens_per_s: Optional[float] = None
    prompt_tokens_per_s: Optional[float] = None
    spec_accept_rate: Optional[float] = None      # 0..1 (accepted / drafted tokens)
    spec_accept_len: Optional[float] = None       # mean tokens per step incl. the bonus token
    source: str = "metrics"                       # "metrics" | "log"
    at: float = 0.0                               # wall clock of the observation

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class EngineAlert:
    kind: str                                     # "spec_decode_ineffective"
    detail: str


# Mean acceptance length is the tokens one target-model step yields. Below ~1.5 the
# draft's own cost (and the verification of rejected tokens) outweighs the half token
# gained: the story's 15 % acceptance served at 0.66x the baseline. Rate alone is only
# used when the engine reports no length, since with many draft tokens a low rate can
# still pay.
SPEC_MIN_ACCEPT_LEN = 1.5
SPEC_MIN_ACCEPT_RATE = 0.2
SPEC_MIN_DRAFTS = 20          # evidence needed before judging (vLLM drafts counted)


def spec_alert(serving: Serving, *, min_len: float = SPEC_MIN_ACCEPT_LEN,
               min_rate: float = SPEC_MIN_ACCEPT_RATE) -> Optional[EngineAlert]:
    length, rate = serving.spec_accept_len, serving.spec_accept_rate
    rate_txt = f", acceptance rate {rate:.0%}" if rate is not None else ""
    if length is not None:
        if length < min_len:
            return EngineAlert("spec_decode_ineffective",
                               f"speculative decoding accepts too little: mean acceptance length "
                               f"{length:.2f} (< {min_len}){rate_txt}; it likely serves slower than "
                               f"without a draft model")
        return None
    if rate is not None and rate < min_rate:
        return EngineAlert("spec_decode_ineffective",
                           f"speculative decoding accepts too little: acceptance rate {rate:.0%} "
                           f"(< {min_rate:.0%}); it likely serves slower than without a draft model")
    return None


# --------------------------------------------------------------------------- /metrics parsing

# name -> (kind, how several label sets combine)
VLLM_METRICS = {
    "running": ("vllm:num_requests_running",),
    "waiting": ("vllm:num_requests_waiting",),
    # 0..1; older releases called it gpu_cache_usage_perc, the CPU build cpu_cache_usage_perc
    "kv_frac": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "vllm:cpu_cache_usage_perc"),
    "prompt_total": ("vllm:prompt_tokens_total",),
    "gen_total": ("vllm:generation_tokens_total",),
    "spec_drafts_total": ("vllm:spec_decode_num_drafts_total",),
    "spec_draft_tokens_total": ("vllm:spec_decode_num_draft_tokens_total",),
    "spec_accepted_total": ("vllm:spec_decode_num_accepted_tokens_total",),
}

SGLANG_METRICS = {
    "running": ("sglang:num_running_reqs",),
    "waiting": ("sglang:num_queue_reqs",),
    "kv_frac": ("sglang:token_usage",),
    "gen_throughput": ("sglang:gen_throughput",),
    "spec_accept_len": ("sglang:spec_accept_length",),
    "spec_accept_rate": ("sglang:spec_accept_rate",),
    "prompt_total": ("sglang:prompt_tokens_total",),
    "gen_total": ("sglang:generation_tokens_total",),
}

# Gauges that several ranks/engines report: fractions average, counts add up.
_AVERAGED = {"kv_frac", "gen_throughput", "spec_accept_len", "spec_accept_rate"}


def parse_metrics(engine: str, text: str) -> dict[str, float]:
    """The values gpudeck uses from one /metrics body; absent metrics are absent keys."""
    from prometheus_client.parser import text_string_to_metric_families

    table = VLLM_METRICS if engine == "vllm" else SGLANG_METRICS
    wanted: dict[str, str] = {}
    for key, names in table.items():
        for name in names:
            wanted.setdefault(name, key)
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            # Counter samples keep their `_total` name; `_created` timestamps are skipped.
            wanted_key = wanted.get(sample.name)
            if wanted_key is None or sample.value != sample.value:     # NaN
                continue
            if wanted_key in sums and wanted_key not in _AVERAGED and _is_alias(table, wanted_key, sample.name, sums):
                continue
            sums[wanted_key] = sums.get(wanted_key, 0.0) + float(sample.value)
            counts[wanted_key] = counts.get(wanted_key, 0) + 1
    return {k: (v / counts[k] if k in _AVERAGED else v) for k, v in sums.items()}


def _is_alias(table: Mapping[str, tuple[str, ...]], key: str, name: str, sums: dict[str, float]) -> bool:
    # Only the first spelling of a renamed metric counts (never old + new added up).
    return table[key].index(name) > 0 if name in table[key] else False


# --------------------------------------------------------------------------- log fallback

# Any KV-cache spelling: vLLM's CUDA build says "GPU KV cache usage", the CPU build "CPU KV cache usage".
_KV_ANY = re.compile(r"KV cache usage:\s*([-+]?\d+(?:\.\d+)?)\s*%")


def serving_from_log_line(engine: str, line: str) -> Optional[dict[str, float]]:
    """Serving fields one periodic stats line carries (a partial dict), or None for other lines.

    The parsing is the log analyzer's (gpudeck.jobs.logs.analyze), shared with post-mortems.
    """
    from gpudeck.jobs.logs.analyze import parse_serving_stats_line
    out = parse_serving_stats_line(line)
    if out is None:
        return None
    if "kv_cache_pct" not in out:
        m = _KV_ANY.search(line)
        if m:
            out["kv_cache_pct"] = float(m.group(1))
    return out


# --------------------------------------------------------------------------- the tracker

@dataclass
class _Baseline:
    at: float
    values: dict[str, float]


@dataclass
class ServingTracker:
    """Turns successive scrapes (or stats lines) of one engine into `Serving` numbers."""

    engine: str
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    _prev: Optional[_Baseline] = None
    _first: Optional[_Baseline] = None
    _log_state: dict[str, float] = field(default_factory=dict)
    latest: Optional[Serving] = None
    alerts: list[EngineAlert] = field(default_factory=list)

    def update_from_metrics(self, text: str) -> Serving:
        values = parse_metrics(self.engine, text)
        now = self.clock()
        prev = self._prev
        if prev is not None and any(values.get(k, 0.0) < prev.values.get(k, 0.0)
                                    for k in ("gen_total", "prompt_total")):
            prev = self._first = None          # counters went back: the engine restarted
        serving = Serving(
            running=values.get("running"), waiting=values.get("waiting"),
            kv_cache_pct=None if "kv_frac" not in values else round(values["kv_frac"] * 100.0, 2),
            source="metrics", at=self.wall())
        if prev is not None and now > prev.at:
            dt = now - prev.at
            serving = replace(serving,
                              gen_tokens_per_s=_rate(values, prev.values, "gen_total", dt),
                              prompt_tokens_per_s=_rate(values, prev.values, "prompt_total", dt))
        if self.engine == "sglang":
            # SGLang reports throughput and acceptance as gauges of its own.
            if serving.gen_tokens_per_s is None and "gen_throughput" in values:
                serving = replace(serving, gen_tokens_per_s=values["gen_throughput"])
            serving = replace(serving, spec_accept_len=values.get("spec_accept_len"),
                              spec_accept_rate=values.get("spec_accept_rate"))
        elif prev is not None:
            rate, length = _vllm_spec(values, prev.values)
            serving = replace(serving, spec_accept_rate=rate, spec_accept_len=length)
        self._prev = _Baseline(now, values)
        if self._first is None:
            self._first = _Baseline(now, values)
        self.latest = serving
        self.alerts = self._judge(values)
        return serving

    def update_from_log_line(self, line: str) -> Optional[Serving]:
        fields = serving_from_log_line(self.engine, line)
        if fields is None:
            return None
        self._log_state.update(fields)
        serving = Serving(source="log", at=self.wall(),
                          **{k: v for k, v in self._log_state.items() if k in SERVING_KEYS})
        self.latest = serving
        alert = spec_alert(serving) if serving.spec_accept_len is not None or \
            serving.spec_accept_rate is not None else None
        self.alerts = [alert] if alert else []
        return serving

    def _judge(self, values: dict[str, float]) -> list[EngineAlert]:
        if self.latest is None:
            return []
        if self.engine == "vllm":
            # Judge on everything since the first scrape: one 10-draft interval is noise.
            first = self._first.values if self._first else {}
            drafts = values.get("spec_drafts_total", 0.0) - first.get("spec_drafts_total", 0.0)
            if drafts < SPEC_MIN_DRAFTS:
                return []
            rate, length = _vllm_spec(values, first)
            overall = Serving(spec_accept_rate=rate, spec_accept_len=length)
            alert = spec_alert(overall)
        else:
            if not (self.latest.gen_tokens_per_s or 0) > 0:
                return []          # SGLang keeps the last gauges when idle: judge while decoding
            alert = spec_alert(self.latest)
        return [alert] if alert else []


def _rate(now: dict[str, float], before: dict[str, float], key: str, dt: float) -> Optional[float]:
    if key not in now or key not in before:
        return None
    return round(max(0.0, now[key] - before[key]) / dt, 3)


def _vllm_spec(now: dict[str, float], before: dict[str, float]) -> tuple[Optional[float], Optional[float]]:
    """(acceptance rate, mean acceptance length) between two scrapes; None where nothing was drafted."""
    d_drafts = now.get("spec_drafts_total", 0.0) - before.get("spec_drafts_total", 0.0)
    d_tokens = now.get("spec_draft_tokens_total", 0.0) - before.get("spec_draft_tokens_total", 0.0)
    d_acc = now.get("spec_accepted_total", 0.0) - before.get("spec_accepted_total", 0.0)
    rate = round(d_acc / d_tokens, 4) if d_tokens > 0 else None
    length = round(1.0 + d_acc / d_drafts, 3) if d_drafts > 0 else None
    return rate, length


def scrape(url: str, timeout: float = 2.0) -> tuple[Optional[int], str]:
    """GET a /metrics URL: (status, body)."""
    from gpudeck.jobs.engines.readiness import http_get
    return http_get(url, timeout=timeout)
