"""Serving numbers from /metrics (both engines' Prometheus formats) and from periodic log lines."""
from __future__ import annotations

from pathlib import Path

import pytest

from gpudeck.jobs.engines.metrics import (ServingTracker, Serving, parse_metrics, serving_from_log_line,
                                  spec_alert)

FIXTURES = Path(__file__).parent / "fixtures"


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_vllm_gauges_add_up_across_engines_and_fractions_average():
    values = parse_metrics("vllm", fixture("vllm_metrics_scrape1.prom"))
    assert values["running"] == 3.0 and values["waiting"] == 1.0
    assert values["kv_frac"] == pytest.approx(0.2)
    assert values["prompt_total"] == 1000.0 and values["gen_total"] == 5000.0
    # per-position counters and histograms are not mistaken for the totals
    assert values["spec_accepted_total"] == 60.0


def test_vllm_rates_come_from_counter_deltas_between_scrapes():
    clock = FakeClock()
    tracker = ServingTracker("vllm", clock=clock)
    first = tracker.update_from_metrics(fixture("vllm_metrics_scrape1.prom"))
    assert first.gen_tokens_per_s is None and first.spec_accept_rate is None   # one scrape: no rate
    assert first.running == 3 and first.kv_cache_pct == pytest.approx(20.0)
    clock.t += 10.0
    second = tracker.update_from_metrics(fixture("vllm_metrics_scrape2.prom"))
    assert second.prompt_tokens_per_s == pytest.approx(25.0)
    assert second.gen_tokens_per_s == pytest.approx(82.0)
    assert second.spec_accept_rate == pytest.approx(0.15)      # 135 accepted / 900 drafted
    assert second.spec_accept_len == pytest.approx(1.45)       # 1 + 135 / 300 drafts
    assert [a.kind for a in tracker.alerts] == ["spec_decode_ineffective"]
    assert "1.45" in tracker.alerts[0].detail


def test_vllm_healthy_speculation_raises_nothing():
    clock = FakeClock()
    tracker = ServingTracker("vllm", clock=clock)
    tracker.update_from_metrics(fixture("vllm_metrics_scrape1.prom"))
    clock.t += 10.0
    healthy = fixture("vllm_metrics_scrape2.prom").replace(
        'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="drafted-moe"} 195.0',
        'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="drafted-moe"} 600.0')
    s = tracker.update_from_metrics(healthy)
    assert s.spec_accept_len == pytest.approx(2.8) and tracker.alerts == []


def test_counter_reset_means_restart_not_negative_rate():
    clock = FakeClock()
    tracker = ServingTracker("vllm", clock=clock)
    tracker.update_from_metrics(fixture("vllm_metrics_scrape2.prom"))
    clock.t += 5
    s = tracker.update_from_metrics(fixture("vllm_metrics_scrape1.prom"))
    assert s.gen_tokens_per_s is None


def test_sglang_gauges_and_counter_rates():
    clock = FakeClock()
    tracker = ServingTracker("sglang", clock=clock)
    text = fixture("sglang_metrics.prom")
    s = tracker.update_from_metrics(text)
    assert (s.running, s.waiting) == (4.0, 2.0)
    assert s.kv_cache_pct == pytest.approx(35.0)
    assert s.gen_tokens_per_s == pytest.approx(165.4)          # SGLang's own gauge until two scrapes
    assert (s.spec_accept_len, s.spec_accept_rate) == (2.05, 0.51)
    assert tracker.alerts == []
    clock.t += 4
    later = text.replace("48000.0", "48800.0").replace("12000.0", "12100.0")
    s = tracker.update_from_metrics(later)
    assert s.gen_tokens_per_s == pytest.approx(200.0) and s.prompt_tokens_per_s == pytest.approx(25.0)


def test_sglang_low_acceptance_while_decoding_is_flagged():
    tracker = ServingTracker("sglang", clock=FakeClock())
    bad = fixture("sglang_metrics.prom").replace("} 2.05", "} 1.12").replace("} 0.51", "} 0.06")
    tracker.update_from_metrics(bad)
    assert [a.kind for a in tracker.alerts] == ["spec_decode_ineffective"]


def test_engines_without_speculation_report_none():
    text = "\n".join(line for line in fixture("vllm_metrics_scrape1.prom").splitlines()
                     if "spec_decode" not in line) + "\n"
    clock = FakeClock()
    tracker = ServingTracker("vllm", clock=clock)
    tracker.update_from_metrics(text)
    clock.t += 1
    s = tracker.update_from_metrics(text)
    assert s.spec_accept_len is None and s.spec_accept_rate is None and tracker.alerts == []


def test_spec_alert_uses_length_before_rate():
    # Five draft tokens at 22 % still yield 2.1 tokens a step: worth it.
    assert spec_alert(Serving(spec_accept_len=2.1, spec_accept_rate=0.22)) is None
    assert spec_alert(Serving(spec_accept_len=1.2, spec_accept_rate=0.1)).kind == "spec_decode_ineffective"
    assert spec_alert(Serving(spec_accept_rate=0.1)) is not None
    assert spec_alert(Serving()) is None


VLLM_STATS = ("(APIServer pid=71) INFO 11-29 10:00:07 [loggers.py:271] Engine 000: Avg prompt throughput: "
              "3.0 tokens/s, Avg generation throughput: 54.6 tokens/s, Running: 2 reqs, Waiting: 1 reqs, "
              "GPU KV cache usage: 7.5%, Prefix cache hit rate: 0.0%")
VLLM_SPEC = ("(APIServer pid=71) INFO 11-29 10:00:07 [metrics.py:101] SpecDecoding metrics: Mean acceptance "
             "length: 1.44, Accepted throughput: 8.20 tokens/s, Drafted throughput: 54.1 tokens/s, Accepted: "
             "82 tokens, Drafted: 541 tokens, Per-position acceptance rate: 0.301, 0.098, 0.041, "
             "Avg Draft acceptance rate: 15.2%")
SGLANG_DECODE = ("[2026-11-29 10:00:03 TP0] Decode batch. #running-req: 3, #token: 4410, token usage: 0.12, "
                 "accept len: 2.31, accept rate: 0.58, cuda graph: True, gen throughput (token/s): 211.70, "
                 "#queue-req: 5, ")


def test_log_fallback_vllm_stats_and_spec_lines_merge():
    tracker = ServingTracker("vllm", clock=FakeClock())
    assert tracker.update_from_log_line("INFO: 127.0.0.1 - \"GET /health HTTP/1.1\" 200 OK") is None
    s = tracker.update_from_log_line(VLLM_STATS)
    assert (s.running, s.waiting, s.kv_cache_pct, s.gen_tokens_per_s, s.prompt_tokens_per_s) == \
        (2, 1, 7.5, 54.6, 3.0)
    assert s.source == "log"
    s = tracker.update_from_log_line(VLLM_SPEC)
    assert s.spec_accept_len == 1.44 and s.spec_accept_rate == pytest.approx(0.152)
    assert s.running == 2                                       # the earlier line's numbers are kept
    assert [a.kind for a in tracker.alerts] == ["spec_decode_ineffective"]


def test_log_fallback_vllm_cpu_build_line():
    line = ("(APIServer pid=9) INFO 11-29 23:47:26 [loggers.py:335] Engine 000: Avg prompt throughput: "
            "1.5 tokens/s, Avg generation throughput: 21.3 tokens/s, Running: 0 reqs, Waiting: 0 reqs, "
            "CPU KV cache usage: 0.0%, Prefix cache hit rate: 0.0%")
    assert serving_from_log_line("vllm", line) == {
        "prompt_tokens_per_s": 1.5, "gen_tokens_per_s": 21.3, "running": 0.0, "waiting": 0.0,
        "kv_cache_pct": 0.0}


def test_log_fallback_sglang_decode_line():
    got = serving_from_log_line("sglang", SGLANG_DECODE)
    assert got == {"running": 3.0, "waiting": 5.0, "kv_cache_pct": 12.0, "gen_tokens_per_s": 211.7,
                   "spec_accept_len": 2.31, "spec_accept_rate": 0.58}
    assert serving_from_log_line("sglang", "[2026-11-29 10:00:03] INFO: 127.0.0.1 GET /health") is None
