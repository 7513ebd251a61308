"""HealthMonitor on real run directories and real on_alert processes, with an explicit clock."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpudeck.jobs.health import HealthMonitor, job_health, read_health
from runsupport import wait_for


class ScriptedAnalyzer:
    """Records every byte fed; answers whatever the test sets."""

    def __init__(self) -> None:
        self.fed = bytearray()
        self.feeds = 0
        self.answer: dict = {"phase": "loading", "progress": None, "failure": None, "warnings": []}

    def feed(self, data: bytes) -> None:
        self.fed += data
        self.feeds += 1

    def result(self) -> dict:
        return dict(self.answer)


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    d = tmp_path / "runs" / "sglang" / "20261129-120000-000ab"
    d.mkdir(parents=True)
    (d / "output.log").write_bytes(b"")
    return d


def append(path: Path, data: bytes) -> None:
    with open(path, "ab") as fh:
        fh.write(data)


def env_dump_command(out: Path) -> str:
    return f"env | grep ^GPUDECK_ALERT_ | sort > {out}.tmp && mv {out}.tmp {out}"


def read_env_file(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def test_quiet_run_raises_stalled_once_writes_health_and_fires_on_alert(run_dir, tmp_path):
    analyzer = ScriptedAnalyzer()
    hook_out = tmp_path / "alert.env"
    mon = HealthMonitor(run_dir, kind="engine", port=1, stall_after=5, on_alert=env_dump_command(hook_out),
                        analyzer=analyzer, listening=lambda port: False)
    t0 = 1_800_000_000.0
    append(run_dir / "output.log", b"Load weight begin. avail mem=70.00 GB\nLoading shards: 3/8\n")
    raised = []
    for i in range(9):
        up = mon.tick({"cpu_s": 12.5, "read_bytes": 4096, "rss": 10 ** 9}, alive=True, now=t0 + i)
        raised += [a.code for a in up.raised]
    assert raised == ["stalled"]
    health = read_health(run_dir)
    assert health["phase"] == "loading"
    [alert] = health["alerts"]
    assert alert["code"] == "stalled" and alert["since"] == t0 and alert["job"] == "sglang"
    assert "port is not listening" in alert["message"]
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events] == ["AlertRaised"] and events[0]["on_alert_pid"] > 0
    env = read_env_file(wait_for(lambda: hook_out.exists() and hook_out, what="on_alert output"))
    assert env["GPUDECK_ALERT_CODE"] == "stalled"
    assert env["GPUDECK_ALERT_JOB"] == "sglang"
    assert env["GPUDECK_ALERT_RUN_ID"] == "20261129-120000-000ab"
    assert float(env["GPUDECK_ALERT_SINCE"]) == t0
    assert "no sign of life" in env["GPUDECK_ALERT_MESSAGE"]


def test_only_new_log_bytes_are_fed_and_growth_is_life(run_dir):
    analyzer = ScriptedAnalyzer()
    mon = HealthMonitor(run_dir, stall_after=3, analyzer=analyzer, listening=lambda port: None)
    t0 = 1_800_000_000.0
    written = b""
    for i in range(20):
        chunk = f"step {i}/20 loss=0.{i}\r".encode() * (i % 3)   # some ticks write nothing
        append(run_dir / "output.log", chunk)
        written += chunk
        up = mon.tick({"cpu_s": 1.0}, alive=True, now=t0 + i)
        if i % 3:
            assert not up.active
    assert bytes(analyzer.fed) == written
    assert mon.log_offset == len(written)


def test_crash_at_the_end_carries_cause_and_hint_to_health_and_hook(run_dir, tmp_path):
    analyzer = ScriptedAnalyzer()
    hook_out = tmp_path / "crash.env"
    mon = HealthMonitor(run_dir, kind="train", on_alert=env_dump_command(hook_out), analyzer=analyzer)
    t0 = 1_800_000_000.0
    mon.tick({"cpu_s": 3.0}, alive=True, now=t0)
    analyzer.answer = {"phase": "failed", "failure": {
        "cause": "cuda_oom", "line": 7, "message": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB",
        "hint": "reduce the batch size or free the GPU"}}
    mon.tick({"cpu_s": 3.0}, alive=False, now=t0 + 1)
    up = mon.finish({"exit_code": 1, "signal": None, "ended_at": t0 + 1.2, "stopped_by_request": False},
                    now=t0 + 1.5)
    assert [a.code for a in up.raised] == ["crashed"]
    health = read_health(run_dir)
    assert health["ended"] is True
    [alert] = health["alerts"]
    assert alert["cause"] == "cuda_oom" and alert["hint"] == "reduce the batch size or free the GPU"
    env = read_env_file(wait_for(lambda: hook_out.exists() and hook_out, what="on_alert output"))
    assert env["GPUDECK_ALERT_CODE"] == "crashed" and env["GPUDECK_ALERT_CAUSE"] == "cuda_oom"


def test_a_broken_analyzer_never_raises_out_of_tick(run_dir):
    class Exploding(ScriptedAnalyzer):
        def result(self):
            raise RuntimeError("boom")

    mon = HealthMonitor(run_dir, analyzer=Exploding(), stall_after=2)
    append(run_dir / "output.log", b"hello\n")
    for i in range(4):
        mon.tick({"cpu_s": 0.0}, alive=True, now=100.0 + i)
    assert "boom" in read_health(run_dir)["error"]


def test_settings_come_from_meta_spec_with_file_default_on_alert(run_dir):
    (run_dir / "meta.json").write_text(json.dumps({
        "job": "sglang", "run_id": run_dir.name, "on_alert_default": "notify-send x",
        "spec": {"kind": "engine", "port": 30000, "stall_after": 42.0, "on_alert": None}}))
    mon = HealthMonitor.for_run(run_dir, analyzer=ScriptedAnalyzer())
    assert (mon.kind, mon.port, mon.rules.stall_after, mon.on_alert) == ("engine", 30000, 42.0, "notify-send x")


def test_jobs_health_without_health_json_judges_the_exit(run_dir):
    append(run_dir / "output.log", b"building...\n[12/480] nvcc ...\n")
    (run_dir / "exit.json").write_text(json.dumps({"exit_code": 137, "signal": "SIGKILL", "ended_at": 5.0,
                                                   "stopped_by_request": False}))
    health = job_health(run_dir)
    [alert] = health["alerts"]
    assert alert["code"] == "crashed" and alert["cause"] == "host_oom"
    assert job_health(None) == {"phase": None, "progress": None, "alerts": []}


# -- the stack dump a stall takes by itself: one per episode, bounded (py-spy stands in: a fake dumper) ----

class FakeDumper:
    """stacks.dump's stand-in: records each call, answers a numbered verdict at once."""

    def __init__(self) -> None:
        self.calls: list[list[int]] = []

    def __call__(self, procs, **_kw):
        from gpudeck.jobs import stacks
        self.calls.append([p.pid for p in procs])
        return stacks.StackDump(taken_at=0.0, native=False, verdict=f"dump {len(self.calls)}: 1 of 1 process idle")


@pytest.fixture
def dumper(monkeypatch) -> FakeDumper:
    from gpudeck.jobs import stacks
    fake = FakeDumper()
    monkeypatch.setattr(stacks, "dump", fake)
    monkeypatch.setattr(stacks, "find_py_spy", lambda: "/usr/bin/py-spy")
    monkeypatch.setattr(stacks, "ptrace_refusal", lambda: None)
    return fake


class StuckServer:
    """An engine run the rules see as stuck two ways: requests in flight whose generation does not advance
    (`stalled`) and its GPU pinned at 100 % on idle power with the log silent (`nccl_hang`)."""

    def __init__(self, run_dir: Path, t0: float) -> None:
        import os
        self.analyzer = ScriptedAnalyzer()
        self.analyzer.answer = {"phase": "ready", "warnings": [],
                                "serving": {"running": 2, "waiting": 1, "gen_tokens_total": 1000}}
        self.mon = HealthMonitor(run_dir, kind="engine", port=8000, stall_after=10, dump_on_stall=True,
                                 analyzer=self.analyzer, listening=lambda port: True)
        self.run_dir, self.t, self.pid = run_dir, t0, os.getpid()     # a Python process py-spy could read

    def tick(self, *, pinned: bool = True, progress: bool = False) -> list[str]:
        if progress:
            # Tokens flow and the log grows: both rules clear.
            self.analyzer.answer["serving"]["gen_tokens_total"] += 50
            append(self.run_dir / "output.log", b"Decode batch. #running-req: 2, gen throughput (token/s): 50\n")
        gpu = {"util": {"0": 100 if pinned else 0}, "power_w": {"0": 90.0}, "power_limit_w": {"0": 700.0}}
        up = self.mon.tick({"pids": [self.pid], "gpu": gpu}, alive=True, now=self.t)
        for dump in list(self.mon._dumps):         # the dump's thread: the fake answers at once
            dump.thread.join(10)
        self.t += 1
        return [a.code for a in up.raised]

    def events(self, name: str) -> list[dict]:
        return [e for e in (json.loads(line) for line in (self.run_dir / "events.jsonl").read_text().splitlines())
                if e["event"] == name]


def test_one_stall_raising_stalled_and_nccl_hang_at_once_takes_one_dump(run_dir, dumper):
    t0 = 1_800_000_000.0
    server = StuckServer(run_dir, t0)
    raised = [server.tick() for _ in range(12)]
    assert raised[10] == ["stalled", "nccl_hang"]            # the same tick, the same since
    assert len(dumper.calls) == 1 and dumper.calls[0] == [server.pid]
    [dumped] = server.events("StacksDumped")
    assert (dumped["code"], dumped["since"], dumped["verdict"]) == ("stalled", t0, "dump 1: 1 of 1 process idle")
    assert len(list((run_dir / "stacks").glob("*.json"))) == 1
    # The first code's alert waited for the verdict; the second went out at once, without a dump of its own.
    pending = {e["code"]: e.get("stacks_pending", False) for e in server.events("AlertRaised")}
    assert pending == {"stalled": True, "nccl_hang": False}
    assert not server.events("StacksUnavailable")
    alerts = {a["code"]: a for a in read_health(run_dir)["alerts"]}
    # One stall, one dump: both of its alerts carry the verdict (the second's published once it is in).
    assert alerts["stalled"]["stacks"] == alerts["nccl_hang"]["stacks"] == {"verdict": "dump 1: 1 of 1 process idle",
                                                                             "path": dumped["path"]}
    assert alerts["nccl_hang"]["message"].endswith(" — stacks: dump 1: 1 of 1 process idle")
    # The post-mortem puts the one verdict on both stalls too.
    from gpudeck.jobs.history.postmortem import build_run
    stalls = {st["code"]: st for st in build_run(run_dir)["stalls"]}
    assert stalls["stalled"]["stacks"] == stalls["nccl_hang"]["stacks"] == "dump 1: 1 of 1 process idle"


def test_a_second_rule_raised_later_in_the_same_stall_takes_no_dump_and_a_stall_that_comes_back_does(run_dir,
                                                                                                      dumper):
    t0 = 1_800_000_000.0
    server = StuckServer(run_dir, t0)
    raised = [server.tick(pinned=i >= 5) for i in range(17)]
    assert raised[10] == ["stalled"] and raised[15] == ["nccl_hang"]     # stalled still up: the same episode
    assert len(dumper.calls) == 1
    alerts = {a["code"]: a for a in read_health(run_dir)["alerts"]}
    assert alerts["nccl_hang"]["stacks"] == alerts["stalled"]["stacks"]  # raised after the verdict: it has it at once
    # Generation advances, the log grows: both clear; then the server wedges again.
    assert server.tick(progress=True) == []
    assert not read_health(run_dir)["alerts"]
    again = [server.tick() for _ in range(12)]
    assert ["stalled"] in again and ["nccl_hang"] in again
    assert len(dumper.calls) == 2
    first, second = server.events("StacksDumped")
    assert first["since"] == t0 and second["since"] > first["since"] and second["verdict"].startswith("dump 2:")
    assert len(list((run_dir / "stacks").glob("*.json"))) == 2


def many_stacks(threads: int, depth: int = 128, name: str = "step") -> "object":
    """A dump of one process whose `threads` threads each have their own `depth`-frame stack (one group each)."""
    from gpudeck.jobs import procs, stacks
    raw = [{"thread_id": i, "os_thread_id": 10_000 + i, "thread_name": f"worker-{i}", "active": False,
            "frames": [{"name": f"{name}_{i}_{d}", "filename": f"/very/long/path/to/the/package/module_{d}.py",
                        "short_filename": f"module_{d}.py", "line": d + 1, "module": None} for d in range(depth)]}
           for i in range(threads)]
    result = stacks.StackDump(taken_at=1_800_000_000.0, native=False,
                              processes=[stacks.build_process(procs.ProcessId(4242, 1), "python serve.py", raw, None)])
    result.groups = stacks.group(result.processes)
    result.verdict = stacks.verdict(result)
    return result


def test_a_stored_dump_near_the_size_cap_stays_whole_enough_to_read_back(run_dir):
    from gpudeck.jobs import health, strictjson
    from gpudeck.jobs.stacks import read_stored_dump
    result = many_stacks(100)
    # Under the cap as compact JSON, over it as the run dir writes it (indented): it must still read back.
    data = result.to_jsonable(frames=False)
    written = len(strictjson.dumps(data, indent=1, sort_keys=True, default=str))     # as write_json_atomic does
    assert len(strictjson.dumps(data)) < health.MAX_STORED_DUMP_BYTES < written
    mon = HealthMonitor(run_dir, analyzer=ScriptedAnalyzer())
    rel = mon.store_dump(result, 1_800_000_000.0)
    path = run_dir / rel
    assert path.stat().st_size <= health.MAX_STORED_DUMP_BYTES
    stored = read_stored_dump(run_dir, rel)                  # what the post-mortem and replay read
    assert stored.verdict == result.verdict and stored.taken_at == result.taken_at
    data = json.loads(path.read_text())
    assert data["truncated"] is True and data["processes"] == []
    kept = len(data["groups"])
    assert 0 < kept < len(result.groups) and data["groups_left_out"] == len(result.groups) - kept
    assert data["groups"] == [g.to_jsonable() for g in result.groups[:kept]]     # the first ones, whole
    # A dump well under the cap is stored as it is.
    small = many_stacks(3)
    rel = mon.store_dump(small, 1_800_000_001.0)
    assert json.loads((run_dir / rel).read_text()) == json.loads(strictjson.dumps(small.to_jsonable(frames=False)))


def test_a_stored_dumps_text_is_cut_at_the_cap_in_bytes_on_a_character(run_dir, monkeypatch):
    from gpudeck.jobs import health
    from gpudeck.jobs.stacks import read_stored_dump
    monkeypatch.setattr(health, "MAX_STORED_DUMP_BYTES", 20_000)
    # Frame names of two-byte characters: 20,000 characters would be about twice the cap in bytes.
    result = many_stacks(12, depth=64, name="étape_ünd_größe")
    mon = HealthMonitor(run_dir, analyzer=ScriptedAnalyzer())
    rel = mon.store_dump(result, 1_800_000_000.0)
    txt = (run_dir / rel).with_suffix(".txt").read_bytes()
    assert len(txt) <= 20_000 and len(txt) > 19_000
    assert txt.decode("utf-8").startswith(f"verdict: {result.verdict}\n")     # strict: no half a character
    assert (run_dir / rel).stat().st_size <= 20_000
    assert read_stored_dump(run_dir, rel).verdict == result.verdict


def test_a_run_takes_at_most_max_dumps_per_run_then_says_why_once_an_episode(run_dir, dumper, monkeypatch):
    from gpudeck.jobs import health
    monkeypatch.setattr(health, "MAX_DUMPS_PER_RUN", 2)
    server = StuckServer(run_dir, 1_800_000_000.0)
    for episode in range(3):
        for _ in range(12):
            server.tick()
        server.tick(progress=True)               # clears: the next quiet spell is a new episode
    assert len(dumper.calls) == 2 and len(server.events("StacksDumped")) == 2
    [refused] = server.events("StacksUnavailable")       # the third episode: once, not once per code
    assert refused["code"] == "stalled" and refused["reason"] == "this run already took 2 stack dumps"
    third = [e for e in server.events("AlertRaised") if e["code"] == "stalled"][2]
    assert "stacks_pending" not in third                 # its alert went out at once, without a dump
