"""`gpudeck stacks` on a REAL torch.distributed deadlock: two gloo ranks in an all-reduce the third never joins.

The job runs the CPU torch of the real-vLLM fixture's venv (its own Python, not the one gpudeck
runs from: py-spy reads the job's interpreter), and is dumped with the real CLI and the real py-spy.
"""
from __future__ import annotations

import json
import pytest

from gpudeck.jobs import procs, stacks
from gpudeck.jobs.runs import latest_run
from runsupport import cli, cli_env, free_port, wait_for, write_jobs

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(300),
              pytest.mark.skipif(stacks.find_py_spy() is None or stacks.ptrace_refusal() is not None,
                                 reason="py-spy missing or ptrace not permitted here")]

# Three ranks join the group (init returns only once all have); two enter the all-reduce, the
# third never does, so the two sit in gloo's allreduce until its 30-minute timeout.
GLOO = """
import datetime, multiprocessing as mp, sys, time
import torch, torch.distributed as dist

def rank(r, world, port):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=world, rank=r,
                            timeout=datetime.timedelta(minutes=30))
    if r == world - 1:
        print("rank", r, "joined the group and walks away", flush=True)
        time.sleep(3600)
    print("rank", r, "entering all_reduce", flush=True)
    dist.all_reduce(torch.ones(4))
    print("rank", r, "left all_reduce (never)", flush=True)

if __name__ == "__main__":
    port = int(sys.argv[1])
    ctx = mp.get_context("fork")        # torch is imported once, here; the parent never joins the group
    ranks = [ctx.Process(target=rank, args=(r, 3, port), name=f"rank{r}") for r in range(3)]
    for p in ranks:
        p.start()
    for p in ranks:
        p.join()
"""


def test_two_gloo_ranks_in_an_all_reduce_whose_third_rank_never_joins(vllm_env, tmp_path, state):
    script = tmp_path / "gloo_deadlock.py"
    script.write_text(GLOO)
    # GLOO_SOCKET_IFNAME: gloo's device otherwise binds what the hostname resolves to, which may not be loopback.
    jobs = write_jobs(tmp_path / "jobs.toml", {"gloo": {
        "cmd": [str(vllm_env.python), str(script), str(free_port())],
        "env": {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}}})
    env = cli_env(tmp_path / "state")
    started = cli(["--jobs", str(jobs), "start", "gloo"], env)
    assert started.returncode == 0, started.stderr
    run = latest_run("gloo")
    log = run.log_path
    try:
        wait_for(lambda: log.exists() and log.read_bytes().count(b"entering all_reduce") == 2, timeout=180,
                 what="two ranks in all_reduce", interval=0.3)
    except AssertionError:
        raise AssertionError(log.read_text(errors="replace")[-3000:]) from None
    seen: list[dict] = []

    def dumped():
        out = cli(["--jobs", str(jobs), "stacks", "gloo", "--json"], env, timeout=90)
        assert out.returncode in (0, 1), out.stderr
        data = json.loads(out.stdout) if out.returncode == 0 else {}
        seen[:] = [data]
        return data if sum((p["wait"] or {}).get("kind") == "collective"
                           for p in data.get("processes", [])) == 2 else None
    try:
        data = wait_for(dumped, timeout=90, interval=0.5, what="both ranks' stacks in the collective")
    except AssertionError:
        raise AssertionError(f"last dump: {json.dumps(seen[:1])[:4000]}") from None

    # The job's interpreter is the fixture venv's, not ours: py-spy read it all the same.
    assert len(data["processes"]) == 4, data["verdict"]
    assert all(str(vllm_env.python) in p["command"] or "gloo_deadlock.py" in p["command"] for p in data["processes"])
    # The verdict names the collective and where the job's code called it, for both ranks at once.
    assert data["verdict"] == (
        "2 of 4 processes in a collective (torch.distributed.all_reduce) at gloo_deadlock.py:12 (rank); "
        "1 sleeping (time.sleep) at gloo_deadlock.py:10 (rank); "
        "1 waiting for child processes to exit (Process.join) at gloo_deadlock.py:22 (<module>)")
    # The two ranks fold into one group: one stack, two processes, torch's own all_reduce innermost.
    [ranks] = [g for g in data["groups"] if not g["helper"] and g["wait"]["kind"] == "collective"]
    assert len(ranks["pids"]) == 2 and ranks["threads"] == 2
    frames = [(f["name"], f["path"]) for f in ranks["frames"] if not f["native"]]
    assert frames[0][0] == "all_reduce" and frames[0][1].endswith("/site-packages/torch/distributed/distributed_c10d.py")
    assert frames[0][1].startswith(str(vllm_env.venv)) and ("rank", str(script)) in frames
    assert ranks["wait"]["label"] == "torch.distributed.all_reduce" and ranks["wait"]["source"] == "python"
    # The grouped text says the same for a person.
    text = cli(["--jobs", str(jobs), "stacks", "gloo"], env, timeout=90).stdout.decode()
    assert text.startswith("verdict: 2 of 4 processes in a collective (torch.distributed.all_reduce)")
    assert "2 of 4 processes [MainThread] — in a collective (torch.distributed.all_reduce)" in text
    # With C frames the same wait is still named by torch's Python frame, above c10d's own C++ wait.
    # (A native dump reads libtorch's symbols: on a loaded box one may miss py-spy's 10 s; try again.)
    def native_dump():
        out = cli(["--jobs", str(jobs), "stacks", "gloo", "--json", "--native"], env, timeout=120)
        data = json.loads(out.stdout) if out.returncode == 0 else {}
        seen[:] = [data]
        return data if data and not data["skipped"] else None
    try:
        native = wait_for(native_dump, timeout=150, interval=1.0, what="a native dump of every process")
    except AssertionError:
        raise AssertionError(f"last native dump skipped: {seen[0].get('skipped') if seen else None}") from None
    assert native["native"] and native["verdict"].startswith(
        "2 of 4 processes in a collective (torch.distributed.all_reduce) at gloo_deadlock.py:12 (rank)")
    [ranks] = [g for g in native["groups"] if not g["helper"] and g["wait"]["kind"] == "collective"]
    assert len(ranks["pids"]) == 2
    assert any(f["native"] and f["name"].startswith("c10d::") for f in ranks["frames"]), \
        [f["name"] for f in ranks["frames"]][:12]
    # Dumping left the ranks where they were: still alive, still in the collective.
    assert all(procs.read_stat(p["pid"]) is not None for p in data["processes"])
    stop = cli(["--jobs", str(jobs), "stop", "gloo"], env, timeout=60)
    assert stop.returncode == 0, stop.stderr
