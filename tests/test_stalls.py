"""The health rules on synthetic timelines with an explicit clock: stalled, nccl_hang, crashed, oom_risk, pass-through."""
from __future__ import annotations

import pytest

from gpudeck.jobs.stalls import (GIB, GpuReading, HealthRules, Observation, RunEnd, default_stall_after,
                         suggest_max_jobs)

T0 = 1_700_000_000.0
QUIET = dict(alive=True, cpu_percent=0.0, disk_read_bps=0.0, log_grew=0)


def run(rules: HealthRules, seconds: int, start: float = 0.0, **fields):
    """Feed one observation per second for `seconds`; return every update."""
    updates = []
    for i in range(seconds):
        obs = Observation(time=T0 + start + i, **{**QUIET, **fields})
        updates.append(rules.observe(obs))
    return updates


def codes(alerts) -> set[str]:
    return {a.code for a in alerts}


def first_raised(updates, code):
    for i, u in enumerate(updates):
        if code in codes(u.raised):
            return i
    return None


# -- stalled -------------------------------------------------------------------

def test_quiet_tree_with_closed_port_is_stalled_after_the_window_and_not_before():
    rules = HealthRules(kind="engine", stall_after=10, job="sg", run_id="r1")
    ups = run(rules, 15, phase="loading", port_listening=False, gpus=(GpuReading(0, util=0.0),))
    at = first_raised(ups, "stalled")
    assert at == 10                                      # quiet from t=0, flagged once 10 s have passed
    alert = ups[at].raised[0]
    assert alert.since == T0
    assert alert.job == "sg" and alert.run_id == "r1" and alert.severity == "error"
    assert "port is not listening" in alert.message and "loading" in alert.message
    # raised once, then only kept
    assert sum(len(u.raised) for u in ups) == 1
    assert codes(ups[-1].active) == {"stalled"}


@pytest.mark.parametrize("life", [
    dict(cpu_percent=95.0),                              # silent but burning CPU
    dict(disk_read_bps=800e6),                           # weight load from disk, GPU idle
    dict(log_grew=120),                                  # log advancing
    dict(gpus=(GpuReading(0, util=80.0, power_w=500, power_limit_w=700),)),
    dict(cpu_percent=None),                              # CPU unknown: never guess a stall
])
def test_any_sign_of_life_prevents_a_stall(life):
    rules = HealthRules(kind="engine", stall_after=10)
    ups = run(rules, 60, phase="loading", port_listening=False, **life)
    assert all(not u.active for u in ups)


def test_stall_clears_when_life_returns_and_keeps_since_while_it_lasts():
    rules = HealthRules(stall_after=5)
    ups = run(rules, 12)
    assert codes(ups[-1].active) == {"stalled"}
    since = ups[-1].active[0].since
    assert since == T0
    back = rules.observe(Observation(time=T0 + 12, **{**QUIET, "log_grew": 10}))
    assert not back.active and codes(back.cleared) == {"stalled"}
    assert back.cleared[0].since == since and back.cleared[0].cleared == T0 + 12
    # a second stall is a new alert, with its own since
    again = run(rules, 8, start=13)
    assert first_raised(again, "stalled") is not None
    assert again[-1].active[0].since == T0 + 12
    assert [h.cleared for h in rules.history] == [T0 + 12, None]


def test_activity_in_the_middle_restarts_the_window():
    rules = HealthRules(stall_after=10)
    ups = run(rules, 8)
    ups += [rules.observe(Observation(time=T0 + 8, **{**QUIET, "cpu_percent": 50.0}))]
    ups += run(rules, 9, start=9)                        # t=9..17: only 9 s quiet since t=8
    assert all(not u.active for u in ups)
    assert codes(rules.observe(Observation(time=T0 + 18, **QUIET)).raised) == {"stalled"}


def test_listening_idle_server_is_healthy_however_quiet():
    rules = HealthRules(kind="engine", stall_after=5)
    ups = run(rules, 60, phase="ready", port_listening=True,
              serving={"running": 0, "waiting": 0, "gen_tps": 0.0})
    assert all(not u.active for u in ups)


def test_ready_server_with_waiting_requests_and_no_generation_is_stalled():
    rules = HealthRules(kind="engine", stall_after=10)
    ups = []
    # the stats line keeps coming (log grows) but reports 0 tok/s with work queued
    for i in range(15):
        ups.append(rules.observe(Observation(time=T0 + i, alive=True, cpu_percent=40.0, log_grew=200,
                                             port_listening=True, phase="ready",
                                             serving={"running": 4, "waiting": 12, "gen_tps": 0.0})))
    at = first_raised(ups, "stalled")
    assert at is not None and 10 <= at <= 11
    assert "4 running and 12 waiting" in ups[at].raised[0].message


def test_ready_server_generating_is_not_stalled_even_with_a_queue():
    rules = HealthRules(kind="engine", stall_after=5)
    ups = [rules.observe(Observation(time=T0 + i, alive=True, cpu_percent=40.0, log_grew=200,
                                     port_listening=True, phase="ready",
                                     serving={"running": 8, "waiting": 30, "gen_tps": 812.5}))
           for i in range(30)]
    assert all(not u.active for u in ups)


def test_ready_server_judged_by_counter_when_metrics_give_one():
    rules = HealthRules(kind="engine", stall_after=5)
    ups = [rules.observe(Observation(time=T0 + i, alive=True, cpu_percent=40.0, port_listening=True,
                                     phase="ready", serving={"running": 2, "waiting": 1,
                                                             "gen_tokens_total": 1000 + 50 * i}))
           for i in range(20)]
    assert all(not u.active for u in ups)
    frozen = [rules.observe(Observation(time=T0 + 20 + i, alive=True, cpu_percent=40.0, port_listening=True,
                                        phase="ready", serving={"running": 2, "waiting": 1,
                                                                "gen_tokens_total": 1950}))
              for i in range(10)]
    assert first_raised(frozen, "stalled") is not None


def test_ready_server_whose_stats_stopped_with_requests_in_flight_is_stalled():
    rules = HealthRules(kind="engine", stall_after=10)
    rules.observe(Observation(time=T0, alive=True, cpu_percent=10.0, log_grew=300, port_listening=True,
                              phase="ready", serving={"running": 3, "waiting": 0, "gen_tps": 55.0}))
    ups = run(rules, 14, start=1, port_listening=True, phase="ready",
              serving={"running": 3, "waiting": 0, "gen_tps": 55.0})
    assert first_raised(ups, "stalled") is not None


def test_default_windows_per_phase_and_kind():
    assert default_stall_after("engine", "loading") == 600
    assert default_stall_after("build", None) == 900
    assert default_stall_after("engine", "compiling") == 900
    assert default_stall_after("stage", "unknown") == 600
    rules = HealthRules(kind="build")
    ups = run(rules, 899, phase="building")
    assert all(not u.active for u in ups)
    assert codes(rules.observe(Observation(time=T0 + 900, **QUIET, phase="building")).raised) == {"stalled"}


def test_dead_tree_is_never_stalled():
    rules = HealthRules(stall_after=2)
    ups = run(rules, 10, alive=False)
    assert all(not u.active for u in ups)


# -- nccl_hang -------------------------------------------------------------------

PINNED = tuple(GpuReading(i, util=100.0, power_w=118.0, power_limit_w=700.0) for i in range(8))


def test_gpus_pinned_at_low_power_with_silent_log_is_an_nccl_hang():
    rules = HealthRules(kind="train", stall_after=600)
    ups = run(rules, 200, cpu_percent=100.0, gpus=PINNED, phase="training")
    at = first_raised(ups, "nccl_hang")
    assert at == 180
    alert = ups[at].raised[0]
    assert "NCCL" in alert.message and "118 W" in alert.message
    assert "stalled" not in codes(ups[-1].active)       # the GPU is "busy": a different alert


def test_pinned_gpus_drawing_real_power_are_working():
    busy = tuple(GpuReading(i, util=100.0, power_w=650.0, power_limit_w=700.0) for i in range(8))
    rules = HealthRules(kind="train", stall_after=60)
    assert all(not u.active for u in run(rules, 300, cpu_percent=100.0, gpus=busy))


def test_advancing_log_resets_the_nccl_window():
    rules = HealthRules(kind="train", stall_after=30)
    ups = []
    for i in range(100):
        ups.append(rules.observe(Observation(time=T0 + i, alive=True, cpu_percent=100.0, gpus=PINNED,
                                             log_grew=80 if i % 20 == 0 else 0)))
    assert all(not u.active for u in ups)


# -- crashed ---------------------------------------------------------------------

CUDA_OOM = {"cause": "cuda_oom", "line": 42, "message": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
            "hint": "lower --gpu-memory-utilization or the batch size"}


def test_failed_exit_raises_crashed_with_cause_and_hint():
    rules = HealthRules(job="train", run_id="r9")
    run(rules, 3, cpu_percent=50.0)
    up = rules.end(RunEnd(time=T0 + 3, exit_code=1, failure=CUDA_OOM))
    assert codes(up.raised) == {"crashed"}
    alert = up.raised[0]
    assert alert.cause == "cuda_oom" and alert.hint == CUDA_OOM["hint"]
    assert "CUDA out of memory" in alert.message and "status 1" in alert.message and "line 42" in alert.message
    assert alert.to_json()["cause"] == "cuda_oom"


def test_clean_exit_and_operator_stop_are_not_crashes():
    rules = HealthRules(stall_after=2)
    run(rules, 5)                                         # stalled first...
    up = rules.end(RunEnd(time=T0 + 5, exit_code=0))
    assert not up.active and codes(up.cleared) == {"stalled"}     # ...cleared by the end
    rules = HealthRules()
    run(rules, 2, cpu_percent=10.0)
    assert not rules.end(RunEnd(time=T0 + 2, exit_code=-15, signal=15, stopped=True)).active


def test_sigkill_without_a_logged_error_reads_as_host_oom():
    rules = HealthRules(kind="build")
    up = rules.end(RunEnd(time=T0, exit_code=137))
    assert up.raised[0].cause == "host_oom" and "OOM" in up.raised[0].hint


def test_live_failure_with_lingering_tree_is_a_crash_already():
    rules = HealthRules(kind="engine")
    ups = run(rules, 8, cpu_percent=20.0, phase="failed", failure=CUDA_OOM)
    assert first_raised(ups, "crashed") == 5                 # after the grace period
    assert "still alive" in ups[5].raised[0].message
    assert ups[5].raised[0].since == T0
    # the operator then stops it: the crash stays, with its first since
    up = rules.end(RunEnd(time=T0 + 10, exit_code=-15, signal=15, stopped=True, failure=CUDA_OOM))
    assert codes(up.active) == {"crashed"} and up.active[0].since == T0 and not up.raised


# -- oom_risk --------------------------------------------------------------------

def test_build_eating_the_last_ram_raises_oom_risk_with_a_max_jobs_suggestion():
    rules = HealthRules(kind="build")
    total = 64 * GIB
    ups = []
    for i in range(40):
        avail = int((20 - 0.5 * i) * GIB)                   # 20 GiB -> 0.5 GiB, falling
        ups.append(rules.observe(Observation(time=T0 + i, alive=True, cpu_percent=3000.0, log_grew=100,
                                             mem_available=avail, mem_total=total, cpu_count=64,
                                             tree_rss=40 * GIB, phase="building")))
    at = first_raised(ups, "oom_risk")
    assert at is not None
    assert ups[at].raised[0].severity == "warning"
    assert "MAX_JOBS=" in ups[at].raised[0].message
    # recovered memory clears it
    up = rules.observe(Observation(time=T0 + 41, alive=True, cpu_percent=10.0, log_grew=10,
                                   mem_available=30 * GIB, mem_total=total, phase="building"))
    assert codes(up.cleared) == {"oom_risk"}


def test_low_but_steady_memory_is_not_oom_risk_and_non_builds_are_ignored():
    rules = HealthRules(kind="build")
    steady = run(rules, 60, cpu_percent=800.0, mem_available=2 * GIB, mem_total=64 * GIB)
    assert all(not u.active for u in steady)
    rules = HealthRules(kind="engine")
    falling = [rules.observe(Observation(time=T0 + i, alive=True, cpu_percent=90.0, log_grew=1,
                                         mem_available=int((5 - 0.1 * i) * GIB), mem_total=64 * GIB))
               for i in range(40)]
    assert all(not u.active for u in falling)


def test_max_jobs_suggestion_fits_ram_and_cores():
    assert suggest_max_jobs(10 * GIB, 50 * GIB, 128) == 8     # 60 GiB * 0.8 / 6 GiB
    assert suggest_max_jobs(1 * GIB, None, 4) == 1
    assert suggest_max_jobs(500 * GIB, 0, 16) == 16


# -- pass-through ----------------------------------------------------------------

def test_spec_decode_warning_passes_through_and_clears_when_gone():
    rules = HealthRules(kind="engine")
    warn = {"code": "spec_decode_ineffective", "line": 300,
            "message": "speculative decoding accepts 1.1 tokens per step (acceptance 4%): slower than none"}
    up = rules.observe(Observation(time=T0, alive=True, cpu_percent=50.0, port_listening=True, phase="ready",
                                   warnings=(warn,)))
    assert codes(up.raised) == {"spec_decode_ineffective"}
    assert up.raised[0].message.startswith("speculative decoding accepts")
    up = rules.observe(Observation(time=T0 + 1, alive=True, cpu_percent=50.0, port_listening=True,
                                   phase="ready", warnings=(warn,)))
    assert not up.raised and up.active[0].since == T0
    up = rules.observe(Observation(time=T0 + 2, alive=True, cpu_percent=50.0, port_listening=True, phase="ready"))
    assert codes(up.cleared) == {"spec_decode_ineffective"}


def test_observe_after_end_changes_nothing():
    rules = HealthRules(stall_after=1)
    rules.end(RunEnd(time=T0, exit_code=2, failure={"cause": "bad_arguments", "message": "unrecognized arguments: --tp"}))
    up = rules.observe(Observation(time=T0 + 50, **QUIET))
    assert codes(up.active) == {"crashed"} and not up.raised


def test_traceback_then_prompt_exit_is_reported_once_by_the_exit():
    rules = HealthRules(kind="train")
    ups = run(rules, 2, cpu_percent=20.0, phase="failed", failure=CUDA_OOM)
    assert not any(u.raised for u in ups)
    up = rules.end(RunEnd(time=T0 + 2, exit_code=1, failure=CUDA_OOM))
    assert codes(up.raised) == {"crashed"} and "still alive" not in up.raised[0].message
