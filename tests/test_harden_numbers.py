"""Issue 9, numbers: nothing non-finite leaves the analyzer, and every JSON gpudeck writes or prints is strict."""
from __future__ import annotations

import json

from gpudeck.jobs.logs.analyze import analyze_bytes
from gpudeck.jobs.runs import latest_run

from runsupport import PY, cli, cli_env, wait_for, write_jobs

HUGE = "1" + "0" * 400
BARS = [f"step 1/{HUGE}", f"Processed prompts:   0%|          | 1/{HUGE} [00:01<?, ?it/s]",
        f"  1%|          | 5/{HUGE} [00:05<10:00,  1.00it/s]", "step 2/1e999", "loss nan step 3/10"]


def strict(text: str):
    def refuse(name):
        raise AssertionError(f"non-strict JSON constant {name}")
    return json.loads(text, parse_constant=refuse)


def test_the_analyzer_never_returns_a_non_finite_number():
    for bar in BARS:
        result = analyze_bytes((bar + "\n").encode() * 3).to_json()
        strict(json.dumps(result))                 # json.dumps writes Infinity if one is there
        json.dumps(result, allow_nan=False)


def test_an_endless_bar_leaves_jobs_analyze_and_health_json_strict(tmp_path, state):
    script = tmp_path / "bar.py"
    script.write_text("import sys, time\n"
                      f"for i in range(1, 4):\n    print('  1%|          | ' + str(i) + '/{HUGE} [00:05<10:00,  1.00it/s]', flush=True)\n"
                      "    time.sleep(0.4)\n"
                      "time.sleep(300)\n")
    jobs = write_jobs(tmp_path / "jobs.toml", {"bar": {"cmd": f"{PY} {script}"}})
    env = cli_env(state)
    assert cli(["--jobs", str(jobs), "start", "bar"], env).returncode == 0
    run = latest_run("bar", state)
    health = run.path / "health.json"
    wait_for(lambda: health.exists() and strict(health.read_text()).get("log_offset", 0) > 1000, what="health")
    for command in (["jobs"], ["jobs", "--json"], ["analyze", str(run.log_path)],
                    ["analyze", "--json", str(run.log_path)]):
        done = cli(["--jobs", str(jobs), *command], env)
        assert done.returncode == 0 and b"Traceback" not in done.stderr, (command, done.stderr)
        if "--json" in command:
            strict(done.stdout.decode())
    for line in run.events_path.read_text().splitlines() + run.samples_path.read_text().splitlines():
        strict(line)


def test_an_old_health_json_with_infinity_is_read_as_null(tmp_path, state):
    jobs = write_jobs(tmp_path / "jobs.toml", {"quick": {"cmd": "true"}})
    env = cli_env(state)
    assert cli(["--jobs", str(jobs), "start", "quick"], env).returncode == 0
    run = latest_run("quick", state)
    wait_for(lambda: run.exit_record(), what="exit")
    runner = run.runner_id()
    from gpudeck.jobs import procs
    wait_for(lambda: not procs.alive(runner), what="runner gone")
    # What an older runner wrote: Python's json emits these unless told not to.
    (run.path / "health.json").write_text(json.dumps({
        "phase": "loading", "progress": {"done": 8, "total": float("inf"), "eta_s": float("inf"),
                                         "rate": float("nan"), "label": "x"}, "alerts": []}))
    for command in (["jobs"], ["jobs", "--json"]):
        done = cli(["--jobs", str(jobs), *command], env)
        assert done.returncode == 0 and b"Traceback" not in done.stderr, done.stderr
        if "--json" in command:
            strict(done.stdout.decode())


def test_the_job_view_shows_non_finite_numbers_as_nothing():
    """The jobs screen (key 2) and `gpudeck jobs` build rows here: inf/nan/huge ints must not crash them."""
    from gpudeck.jobs.view import JobView
    for progress in ({"done": 8, "total": float("inf"), "eta_s": float("inf")},
                     {"done": float("nan"), "total": 10 ** 400, "eta_s": 10 ** 400, "rate": float("-inf")}):
        view = JobView.from_payload({"name": "j", "kind": "stage", "state": "running", "phase": "loading",
                                     "started_at": float("inf"), "progress": progress})
        cells = view.cells(1000.0)
        assert "inf" not in cells["phase"].lower() and "nan" not in cells["phase"].lower(), cells


def test_one_strict_number_rule_for_every_reader():
    """strictjson's number/integer/parse_* are the rule; the core's readers are those functions, not copies."""
    from gpudeck.jobs import health, replay, slurm, stalls, view
    from gpudeck.jobs import strictjson as sj
    from gpudeck.jobs.engines import profiles
    from gpudeck.jobs.history import index, phases, recorder
    from gpudeck.jobs.telemetry import history
    from gpudeck.jobs.telemetry.gpu import nvidia_smi
    assert history._num is sj.number and phases._num is sj.number
    assert replay._number(1e308) is None and replay._number(1.7e9) == sj.timestamp(1.7e9)   # times: stricter
    assert recorder._num is sj.number and view._num is sj.number
    assert index._int is sj.integer and view._int is sj.integer and index.number is sj.number
    assert stalls._num is sj.first_number and health._num is sj.first_number
    assert slurm._int is sj.parse_integer and profiles._int is sj.parse_integer
    assert nvidia_smi.smi_number is sj.parse_number
    for bad in (True, float("inf"), float("nan"), 2 ** 70, "3", None):
        assert sj.number(bad) is None, bad
    assert sj.number(3) == 3.0 and sj.integer(3) == 3 and sj.integer(3.0) is None and sj.integer(-2 ** 70) is None
    assert sj.parse_number("1e5") == 100000.0 and sj.parse_number("29/1e5") is None
    assert sj.parse_number("1e400") is None and sj.parse_number("[N/A]") is None
    assert sj.parse_integer(" 12 ") == 12 and sj.parse_integer("1e3") is None and sj.parse_integer("9" * 40) is None
    assert sj.first_number({"a": "x", "b": float("inf"), "c": 7}, "a", "b", "c") == 7.0


def test_a_number_in_scientific_notation_is_never_read_as_its_first_digits():
    """Issue harden 17: `29/1e5` was progress 29/1 (2900%), `1e400 tokens/s` was 1.0 tok/s, `1.5e3` was 1.5."""
    def analysed(line: str) -> dict:
        return analyze_bytes((line + "\n").encode() * 3).to_json()
    bar = analysed("Processed prompts:  29%|###  | 29/1e5 [00:10<00:20, 2.9it/s]")
    assert bar["progress"] is None, bar["progress"]             # never 29 of 1
    assert analysed("Processed prompts:  29%|###  | 29/100 [00:10<00:20, 2.9it/s]")["progress"]["total"] == 100
    assert analysed("Epoch 1/3e2")["progress"] is None
    vllm = analysed("Avg prompt throughput: 1e400 tokens/s, Avg generation throughput: 1.5e3 tokens/s, "
                    "Running: 1e1 reqs, Waiting: 0 reqs, GPU KV cache usage: 5.0%")["serving"] or {}
    assert vllm.get("prompt_tokens_per_s") is None and vllm.get("gen_tokens_per_s") is None, vllm
    assert vllm.get("running") is None, vllm
    sglang = analysed("Decode batch. #running-req: 3, #token: 10, token usage: 0.5, "
                      "gen throughput (token/s): 1.5e3, #queue-req: 0")["serving"]
    assert sglang["running"] == 3 and sglang["gen_tokens_per_s"] is None, sglang
    plain = analysed("Avg prompt throughput: 2.0 tokens/s, Avg generation throughput: 3.5 tokens/s, Running: 3 reqs, "
                     "Waiting: 0 reqs, GPU KV cache usage: 5.0%")["serving"]
    assert plain["gen_tokens_per_s"] == 3.5 and plain["running"] == 3, plain
