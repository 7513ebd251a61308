"""The SIMULATED box: shaped like the story's box, plausible, labelled, deterministic."""
from __future__ import annotations

import json

from gpudeck.jobs.telemetry.sampler import make_sampler
from gpudeck.jobs.telemetry.simulated import GPU_MEM_TOTAL, SimulatedBox
from gpudeck.jobs.telemetry.status import status_payload

GiB = 1024 ** 3


def run(seed: int, steps: int, start: float = 1000.0):
    ticks = iter(range(10 ** 6))
    sampler = make_sampler(demo=True, seed=seed, clock=lambda: start + next(ticks))
    try:
        return [sampler.sample() for _ in range(steps)]
    finally:
        sampler.close()


def test_shape_of_the_story_box():
    snap = run(0, 1)[0]
    assert snap.simulated is True
    assert len(snap.gpus) == 8 and snap.gpu_error is None
    assert all(g.simulated for g in snap.gpus)
    assert {g.name for g in snap.gpus} == {"NVIDIA H200"}
    assert all(g.mem_total == GPU_MEM_TOTAL for g in snap.gpus)
    assert 140 * GiB < GPU_MEM_TOTAL < 141 * GiB
    workers = [p for g in snap.gpus for p in g.processes if p.proc.known]
    assert [p.proc.name for p in workers] == [f"VLLM::Worker_TP{i}" for i in range(8)]
    for g in snap.gpus:
        # The engine holds most of each GPU's memory.
        assert g.mem_used > 0.85 * g.mem_total
        assert g.mem_used <= g.mem_total
    assert snap.host.cpu_count == 192 and snap.host.mem_total == 2 * 1024 ** 4
    assert len(snap.host.cpu_per_core) == 192
    ports = {(p.port, p.process) for p in snap.ports}
    assert (8000, "python3") in ports and (22, "sshd") in ports
    api = next(p for p in snap.ports if p.port == 8000)
    assert "--tensor-parallel-size 8" in api.proc.cmdline


def test_same_seed_and_step_give_the_same_snapshot():
    a = run(7, 40)
    b = run(7, 40)
    assert [json.dumps(s.to_json(), sort_keys=True) for s in a] == [json.dumps(s.to_json(), sort_keys=True) for s in b]
    # And it is a function of (seed, step), not of how the sampler got there.
    box = SimulatedBox(7)
    assert box.snapshot(39, now=a[39].time) == a[39]


def test_different_seeds_differ_and_values_move():
    a, b = run(1, 30), run(2, 30)
    assert [g.util for g in a[-1].gpus] != [g.util for g in b[-1].gpus]
    utils = {s.gpus[0].util for s in a}
    temps = {s.gpus[0].temp for s in a}
    assert len(utils) > 10 and len(temps) > 10


def test_values_stay_plausible_over_a_long_run():
    box = SimulatedBox(3)
    idle_seen = busy_seen = False
    for step in range(0, 1300, 7):
        snap = box.snapshot(step)
        for g in snap.gpus:
            assert 0 <= g.util <= 100
            assert 25 <= g.temp <= 90
            assert 50 <= g.power_w <= g.power_limit_w
            if g.util == 0:
                idle_seen = True
                assert g.throttle_reasons == ("gpu_idle",)
            if g.util > 60:
                busy_seen = True
        assert 0 <= snap.host.cpu_percent <= 100
        assert snap.host.mem_used < snap.host.mem_total
    assert idle_seen and busy_seen       # the 1-minute lull every 10 minutes, and real load


def test_status_payload_is_json_and_labelled():
    payload = status_payload(run(0, 1)[0])
    text = json.dumps(payload)
    assert json.loads(text)["simulated"] is True
    assert all(g["simulated"] for g in payload["gpus"])
    first = payload["gpus"][0]["processes"][0]
    assert first["pid"] == 48502 and first["mem_used"] > 100 * GiB and first["name"] == "VLLM::Worker_TP0"
    foreign = payload["gpus"][7]["processes"][-1]
    assert foreign["known"] is False and foreign["cmdline"] is None
