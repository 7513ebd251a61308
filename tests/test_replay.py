"""Replay of REAL recorded runs (jobs started through the supervisor, then played back), and of the bundled demo."""
from __future__ import annotations

import filecmp
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpudeck.jobs import replay as replay_mod
from gpudeck.jobs.logs.analyze import LogAnalyzer
from gpudeck.jobs.replay import (SPEEDS, ReplayError, ReplaySession, RunReplay, clock_text, demo_run_dirs,
                                 demo_session, position_bar)
from gpudeck.jobs.spec import load_jobs
from gpudeck.jobs.supervisor import Supervisor

from runsupport import oom_trainer, wait_for, write_jobs

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable

# `times` dates log bytes to the second: steps a second apart give the replay several distinct instants.
TRAINER = oom_trainer(steps=6, pause_s=1.0)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """Two real runs, recorded by the real runner: a trainer that dies of CUDA OOM, a job that goes silent and is stopped."""
    root = tmp_path_factory.mktemp("replay")
    script = root / "train.py"
    script.write_text(TRAINER)
    jobs = write_jobs(root / "jobs.toml", {
        "trainer": {"kind": "train", "cmd": [PY, str(script)]},
        "sleeper": {"kind": "stage", "stall_after": 2, "cmd": "echo warming up; exec sleep 120"},
    })
    sup = Supervisor(load_jobs(jobs), state_dir=root / "state")
    runs = {name: sup.start(name) for name in ("trainer", "sleeper")}
    try:
        assert sup.wait("trainer", timeout=60) is not None, "the trainer did not end"
        health = sup.latest("sleeper").path / "health.json"

        def stalled() -> bool:
            try:
                return any(a["code"] == "stalled" for a in json.loads(health.read_text())["alerts"])
            except (OSError, ValueError, KeyError):
                return False
        wait_for(stalled, timeout=40, what="the sleeper's stalled alert")
        time.sleep(1.2)        # a tick or two with the alert up, so the replay has an instant to show it
        sup.stop("sleeper", timeout=10)
        trainer_health = sup.latest("trainer").path / "health.json"
        wait_for(lambda: json.loads(trainer_health.read_text()).get("ended"), timeout=20,
                 what="the trainer's final health")
        wait_for(lambda: (sup.latest("sleeper").path / "exit.json").exists(), timeout=20, what="the sleeper's exit")
        # The runner writes exit.json first, then its health monitor's last tick (the stop clears the
        # stall: AlertCleared in events.jsonl). Under load that tick came after the recording was read.
        wait_for(lambda: json.loads(health.read_text()).get("ended"), timeout=20, what="the sleeper's final health")
    except BaseException:
        for name in runs:
            try:
                sup.stop(name, timeout=5)
            except Exception:
                pass
        raise
    return {"trainer": sup.latest("trainer").path, "sleeper": sup.latest("sleeper").path}


def frames(run: RunReplay, step: float = 0.25):
    t = run.start
    while True:
        yield run.frame(t)
        if t >= run.end:
            return
        t = min(run.end, t + step)


STATE_ORDER = ["idle", "starting", "running", "stopping", "exited", "stopped"]


def test_a_crashed_run_replays_as_it_was_lived(recorded):
    run = RunReplay(recorded["trainer"])
    log = (recorded["trainer"] / "output.log").read_bytes()
    crash_at = next(m.t for m in run.recording.marks if m.kind == "alert" and m.code == "crashed")
    seen_states, dones = [], []
    for frame in frames(run):
        job = frame.job
        assert job["replay"] is True and job["name"] == "trainer"
        if not seen_states or seen_states[-1] != job["state"]:
            seen_states.append(job["state"])
        progress = job["progress"]
        if progress:
            dones.append(progress["done"])
            assert progress["total"] == 6
        codes = [a["code"] for a in job["alerts"]]
        assert ("crashed" in codes) == (frame.t >= crash_at), (frame.t - run.start, codes)
        assert log[:frame.log_bytes].count(b"\n") <= log.count(b"\n")
    assert seen_states == sorted(seen_states, key=STATE_ORDER.index), seen_states
    assert seen_states[-1] == "exited" and "running" in seen_states
    assert dones == sorted(dones) and dones[-1] == 6 and len(set(dones)) >= 3, dones

    end = run.frame(run.end)
    assert end.log_bytes == len(log)
    assert end.job["exit_code"] == 1 and end.job["phase"] == "failed"
    [crash] = end.job["alerts"]
    assert crash["cause"] == "cuda_oom" and "status 1" in crash["message"]
    assert end.job["failure"]["cause"] == "cuda_oom"
    # the replay agrees with what the runner's monitor published at the end
    health = json.loads((recorded["trainer"] / "health.json").read_text())
    assert end.job["phase"] == health["phase"] and end.job["progress"]["done"] == health["progress"]["done"]
    assert [a["code"] for a in end.job["alerts"]] == [a["code"] for a in health["alerts"]]


def test_log_bytes_follow_the_arrival_index(recorded):
    run = RunReplay(recorded["trainer"])
    times = [line.split() for line in (recorded["trainer"] / "times").read_text().splitlines()]
    for offset, second in ((int(o), float(s)) for o, s in times):
        # every byte the runner noted by that second is shown at that second, never more than arrived by the next
        assert run.frame(second).log_bytes >= offset
    assert run.frame(run.start - 10).log_bytes == 0


def test_the_analysis_at_t_equals_the_analyzer_over_the_bytes_that_had_arrived(recorded):
    run = RunReplay(recorded["trainer"])
    log = (recorded["trainer"] / "output.log").read_bytes()
    for frame in frames(run, step=0.5):
        fresh = LogAnalyzer()
        fresh.feed(log[:frame.log_bytes])
        expect = fresh.result().to_json()
        assert frame.job["phase"] == (expect["phase"] if frame.job["state"] != "idle" else None)
        got = frame.job["progress"] or {}
        assert (got.get("done"), got.get("total")) == ((expect["progress"] or {}).get("done"),
                                                       (expect["progress"] or {}).get("total"))


def test_the_resource_sample_at_t_is_the_last_one_recorded_by_then(recorded):
    run = RunReplay(recorded["sleeper"])
    lines = [json.loads(line) for line in (recorded["sleeper"] / "samples.jsonl").read_text().splitlines()]
    assert len(lines) >= 3
    assert run.recording._samples is None                 # opening a replay does not parse the samples
    assert run.sample_at(lines[0]["t"] - 0.001) is None
    for before, after in zip(lines, lines[1:]):
        assert run.sample_at((before["t"] + after["t"]) / 2) == before
    assert run.sample_at(run.end + 100) == lines[-1]
    assert run.recording.first_sample_t == lines[0]["t"] and run.recording.last_sample_t == lines[-1]["t"]


def test_seeking_back_restores_a_checkpoint_instead_of_rereading_the_log(recorded, monkeypatch):
    monkeypatch.setattr(replay_mod, "CHECKPOINT_BYTES", 64)
    run = RunReplay(recorded["trainer"])
    size = (recorded["trainer"] / "output.log").stat().st_size
    for _ in frames(run, step=0.2):
        pass
    assert run.bytes_read == size            # played forward: every byte read exactly once
    checkpoints = run._track.checkpoints
    assert len(checkpoints) >= 3
    middle = run.start + (run.end - run.start) * 0.6
    before = run.bytes_read
    back = run.frame(middle)
    reread = run.bytes_read - before
    assert reread < 64 + max(b - a for a, b in zip(run.recording.point_offsets, run.recording.point_offsets[1:])), reread
    assert back.job == RunReplay(recorded["trainer"]).frame(middle).job     # same as a fresh replay at that instant
    # and forward again picks up from there
    assert run.frame(run.end).job["state"] == "exited"


def test_a_stalled_then_stopped_run_shows_the_alert_and_the_stop(recorded):
    session = ReplaySession.open([recorded["sleeper"]])
    marks = session.marks
    stalled = next(m for m in marks if m.kind == "alert" and m.code == "stalled")
    assert session.frame().jobs[0]["alerts"] == []
    jumped = session.next_mark({"alert"})
    assert jumped == stalled and session.position == stalled.t
    job = session.frame().jobs[0]
    assert job["state"] == "running" and [a["code"] for a in job["alerts"]] == ["stalled"]
    assert "no sign of life" in job["alerts"][0]["message"]
    stop = next(m for m in marks if m.label == "stop requested")
    session.seek_to(stop.t)
    assert session.frame().jobs[0]["state"] == "stopping"
    session.seek_to(session.end)
    job = session.frame().jobs[0]
    assert job["state"] == "stopped" and job["ended_at"] is not None
    assert job["alerts"] == []              # a stop clears the stall; it is not a crash
    assert session.previous_mark() is not None and session.position < session.end


def test_player_speed_pause_seek_and_bounds(recorded):
    session = ReplaySession.open([recorded["trainer"]], speed=5)
    assert session.speed == 4.0              # snapped to the nearest speed offered
    for _ in range(10):
        session.faster()
    assert session.speed == SPEEDS[-1] == 64.0
    for _ in range(10):
        session.slower()
    assert session.speed == SPEEDS[0] == 1.0
    t0 = session.position
    session.advance(0.5)
    assert session.position == pytest.approx(t0 + 0.5)
    session.toggle_pause()
    session.advance(5)
    assert session.position == pytest.approx(t0 + 0.5)
    session.toggle_pause()
    session.seek(-60)
    assert session.position == session.start
    session.seek(+60)
    assert session.position == session.end and session.at_end
    session.advance(1)
    assert session.position == session.end   # stops at the end unless looping
    frame = session.frame()
    assert frame.fraction == 1.0
    bar = position_bar(frame, 20)
    assert len(bar) == 20 and bar.endswith("●") and bar.count("●") == 1 and set(bar[:-1]) <= {"━", "▲"}
    assert clock_text(3725) == "1:02:05" and clock_text(42) == "0:42"


def test_bad_inputs_are_one_line_errors_or_a_partial_replay(tmp_path, recorded):
    with pytest.raises(ReplayError, match="no such run directory"):
        RunReplay(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ReplayError, match="not a run directory"):
        RunReplay(tmp_path / "empty")
    # a copy with only meta.json and the log (no times, samples, events, exit): the log is shown from the start
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("meta.json", "output.log"):
        (bare / name).write_bytes((recorded["trainer"] / name).read_bytes())
    run = RunReplay(bare)
    frame = run.frame(run.start)
    assert frame.log_bytes == (bare / "output.log").stat().st_size
    assert frame.job["phase"] == "failed" and frame.job["alerts"] == []
    # torn and corrupt lines (a killed writer) are skipped, not fatal
    torn = tmp_path / "torn"
    torn.mkdir()
    for name in ("meta.json", "output.log", "times", "samples.jsonl", "events.jsonl"):
        (torn / name).write_bytes((recorded["trainer"] / name).read_bytes())
    with open(torn / "times", "ab") as fh:
        fh.write(b"12")
    with open(torn / "samples.jsonl", "ab") as fh:
        fh.write(b'{"t": 1')
    (torn / "meta.json").write_text('{"created_at": "yesterday", "spec": 7}')
    run = RunReplay(torn)
    assert run.frame(run.end).job["state"] in ("running", "lost")


def test_the_demo_shows_loading_with_eta_an_oom_heading_build_a_crash_and_a_stall_within_seconds():
    session = demo_session()
    assert session.simulated and session.loop and session.speed == replay_mod.DEMO_SPEED
    seen: dict[str, set] = {}
    wall = 0.0
    while wall <= 15.0:                        # 15 s of the newcomer's time at the demo's speed
        for job in session.frame().jobs:
            assert job["simulated"] is True
            got = seen.setdefault(job["name"], set())
            got.update(a["code"] for a in job["alerts"])
            if job["phase"] == "loading" and (job["progress"] or {}).get("eta_s"):
                got.add("loading-with-eta")
        session.advance(0.5)
        wall += 0.5
    assert "loading-with-eta" in seen["vllm-k2"]
    assert "oom_risk" in seen["sgl-kernel-build"]
    assert "crashed" in seen["vllm-eagle3"]
    assert "stalled" in seen["sglang-k2"]
    # and it loops to where it began
    session.seek_to(session.end)
    session.advance(0.5)
    assert session.position == session.loop_start


def test_the_bundled_demo_recordings_are_what_the_generator_makes(tmp_path):
    out = tmp_path / "demo_runs"
    done = subprocess.run([PY, str(REPO / "docs" / "make_demo_runs.py"), "--out", str(out)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    bundled = demo_run_dirs()
    assert len(bundled) == 4
    for run_dir in bundled:
        fresh = out / run_dir.parent.name / run_dir.name
        names = sorted(p.name for p in run_dir.iterdir())
        assert names == sorted(p.name for p in fresh.iterdir())
        # What the generator writes (the log, its arrival index, the samples, the exit) must match byte for
        # byte. What the core judged of it (events, health, the spec snapshot in meta) grows fields and
        # rewords messages as the rules improve: compared by what the demo shows — which alerts were raised
        # and cleared when, the final phase and failure cause.
        strict = [n for n in names if n in ("output.log", "times", "samples.jsonl", "exit.json")]
        match, mismatch, errors = filecmp.cmpfiles(run_dir, fresh, strict, shallow=False)
        if (run_dir / "stacks").is_dir():           # the recorded stack dump, simulated frames and all
            dumps = sorted(p.name for p in (run_dir / "stacks").iterdir())
            assert dumps == sorted(p.name for p in (fresh / "stacks").iterdir())
            _, differ, missing = filecmp.cmpfiles(run_dir / "stacks", fresh / "stacks", dumps, shallow=False)
            mismatch, errors = mismatch + differ, errors + missing
        assert not mismatch and not errors, (
            f"{run_dir.name}: {mismatch or errors} differ from the generator's output — "
            f"run docs/make_demo_runs.py and commit jobs/demo_runs/")

        def judged(d):
            events = [(e["event"], e.get("code"), e["t"]) for e in map(json.loads, (d / "events.jsonl").read_text().splitlines())]
            health = json.loads((d / "health.json").read_text())
            meta = json.loads((d / "meta.json").read_text())
            meta.pop("spec")
            return (events, health.get("phase"), (health.get("failure") or {}).get("cause"),
                    [a["code"] for a in health.get("history") or []], meta)
        assert judged(run_dir) == judged(fresh), (
            f"{run_dir.name}: the rules now judge the demo differently — run docs/make_demo_runs.py and commit "
            f"jobs/demo_runs/")


def test_a_recorded_stack_dump_appears_only_once_the_replay_passes_it(tmp_path):
    run_dir = tmp_path / "quiet" / "20270115-080000-00000"
    (run_dir / "stacks").mkdir(parents=True)
    (run_dir / "output.log").write_text("quiet now\n")
    (run_dir / "times").write_text("10 100\n")
    (run_dir / "meta.json").write_text(json.dumps({"job": "quiet", "run_id": run_dir.name, "created_at": 100.0,
                                                   "started_at": 100.1, "job_process": {"pid": 7, "start": 1}}))
    verdict = "2 of 3 processes waiting on a multiprocessing.Barrier at quiet.py:5 (party)"
    events = [{"t": 100.1, "event": "JobStarted", "pid": 7},
              {"t": 105.0, "event": "AlertRaised", "code": "stalled", "since": 103.0, "message": "no sign of life",
               "severity": "warning", "stacks_pending": True},
              {"t": 106.5, "event": "StacksDumped", "code": "stalled", "since": 103.0, "verdict": verdict,
               "path": "stacks/20270115-080006-500.json"},
              {"t": 110.0, "event": "AlertCleared", "code": "stalled", "since": 103.0, "cleared": 110.0}]
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    run = RunReplay(run_dir)

    def stalled(t: float) -> dict:
        [alert] = [a for a in run.frame(t).job["alerts"] if a["code"] == "stalled"]
        return alert
    # Raised, the dump still under way: the alert as it went out, without a verdict.
    before = stalled(106.0)
    assert before["message"] == "no sign of life" and "stacks" not in before and "stacks_pending" not in before
    assert run.recording.stacks_at(106.0) is None
    # Past the dump: its verdict is on the alert, as the live health.json carried it.
    after = stalled(106.5)
    assert after["message"] == f"no sign of life — stacks: {verdict}"
    assert after["stacks"] == {"verdict": verdict, "path": "stacks/20270115-080006-500.json"}
    assert run.recording.stacks_at(108.0) == {"t": 106.5, "code": "stalled", "verdict": verdict,
                                              "path": "stacks/20270115-080006-500.json"}
    # Cleared, the alert goes; the dump stays the run's latest.
    assert run.frame(111.0).job["alerts"] == [] and run.recording.stacks_at(111.0)["verdict"] == verdict
    # The dump is a mark of its own: the player jumps to it, and back before it nothing is shown.
    session = ReplaySession([run], position=100.0)
    mark = session.next_mark({"stacks"})
    assert (mark.t, mark.kind, mark.label, mark.code) == (106.5, "stacks", f"stacks: {verdict}", "stalled")
    assert [m.kind for m in session.marks] == ["event", "alert", "stacks", "cleared"]
    session.seek_to(105.5)
    assert "stacks" not in session.frame().runs[0].job["alerts"][0]


def test_the_demos_deadlock_carries_its_recorded_stack_dump_from_the_moment_it_was_taken():
    from gpudeck.jobs.stacks import SIMULATED_LINE, read_stored_dump
    session = demo_session()
    [run] = [r for r in session.runs if r.recording.job == "sglang-k2"]
    [raised] = [e for e in run.recording.events if e.get("event") == "AlertRaised"]
    [dumped] = [e for e in run.recording.events if e.get("event") == "StacksDumped"]
    assert raised["t"] < dumped["t"] <= raised["t"] + 2
    verdict = dumped["verdict"]
    assert verdict.startswith("4 of 6 processes in a collective (torch.distributed.all_reduce) at "
                              "parallel_state.py:412 (GroupCoordinator.all_reduce); ")

    def stalled(t: float) -> dict:
        return next(a for a in run.frame(t).job["alerts"] if a["code"] == "stalled")
    assert "stacks" not in stalled(raised["t"]) and run.recording.stacks_at(raised["t"]) is None
    assert stalled(dumped["t"])["message"].endswith(f" — stacks: {verdict}")
    # The stored dump: the runner's shape, SIMULATED, the four ranks folded into one group.
    stored = read_stored_dump(run.recording.path, run.recording.stacks_at(dumped["t"])["path"])
    assert stored.simulated and stored.verdict == verdict and stored.lines[0] == f"verdict: {verdict}"
    assert SIMULATED_LINE in stored.lines
    data = json.loads(stored.path.read_text())
    assert data["simulated"] is True and data["run_id"] == run.recording.run_id and data["job"] == "sglang-k2"
    assert [len(g["pids"]) for g in data["groups"]] == [4, 1, 1]
    assert all("frames" not in t for p in data["processes"] for t in p["threads"])
    # The demo reaches it within seconds of the stall at its own speed, and `n` stops on it.
    session.seek_to(raised["t"])
    assert session.next_mark({"stacks"}).t == dumped["t"]
