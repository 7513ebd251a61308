"""The byte passes spread over worker processes (parallel.py) give the one-process answer, line numbers included."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from gpudeck.jobs.logs.analyze import analyze_file, parallel, sparse
from runsupport import BOTH_READINGS, run_python_in_group

pytestmark = pytest.mark.skipif(not sparse.available(), reason="hyperscan is not installed: no sparse reading")

BANNER = ("INFO 05-07 10:00:00 [__init__.py:239] Automatically detected platform cuda.\n"
          "(APIServer pid=1) INFO 05-07 10:00:01 [api_server.py:1043] vLLM API server version 0.9.2\n"
          "(VllmWorker rank=0 pid=7) INFO 05-07 10:00:30 [gpu_model_runner.py:1600] Model loading took 15.2 GiB\n"
          "(APIServer pid=1) INFO 05-07 10:01:00 [launcher.py:28] Available routes are:\n"
          "(APIServer pid=1) INFO:     Application startup complete.\n")


def _serving(rng: random.Random, blocks: int) -> str:
    out = []
    for t in range(blocks):
        out += [f'(APIServer pid=1) INFO:     10.0.0.{rng.randint(1, 250)}:{rng.randint(30000, 60000)} - '
                f'"POST /v1/completions HTTP/1.1" 200 OK\n' for _ in range(60)]
        out.append(f"(APIServer pid=1) INFO 05-07 10:{t // 60 % 60:02d}:{t % 60:02d} [loggers.py:271] Engine 000: "
                   f"Avg prompt throughput: {rng.uniform(0, 900):.1f} tokens/s, Avg generation throughput: "
                   f"{rng.uniform(20, 300):.1f} tokens/s, Running: {rng.randint(0, 64)} reqs, Waiting: "
                   f"{rng.randint(0, 9)} reqs, GPU KV cache usage: {rng.uniform(0, 90):.1f}%, "
                   f"Prefix cache hit rate: {rng.uniform(0, 60):.1f}%\n")
    return "".join(out)


def _dense(rng: random.Random, lines: int) -> str:
    # Every line anchored (a stretch the workers hand back as dense): errors logged and recovered, bar redraws.
    return "".join(f"(APIServer pid=1) ERROR 05-07 11:00:{i % 60:02d} [serving_chat.py:300] Error in request {i}\n"
                   if i % 3 else f"Processing shards: {rng.randint(1, 99)}%|####      | {i}/{lines} [00:01<00:09]\r"
                   f"Processing shards: {rng.randint(1, 99)}%|#####     | {i}/{lines} [00:01<00:08]\n"
                   for i in range(lines))


CRASH = ("(EngineCore_0 pid=9) ERROR 05-07 12:00:00 [core.py:600] EngineCore encountered a fatal error.\n"
         "(EngineCore_0 pid=9) Traceback (most recent call last):\n"
         '(EngineCore_0 pid=9)   File "/venv/lib/python3.12/site-packages/vllm/v1/engine/core.py", line 590, in run\n'
         "(EngineCore_0 pid=9)     raise e\n"
         "(EngineCore_0 pid=9) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
         "total capacity of 79.19 GiB of which 1.06 GiB is free.\n")


# Run in a child process: a test worker of pytest-xdist has threads, and parallel.py forks only a
# process that has none (it falls back to one reader otherwise). The thresholds are made small
# enough for a few-MB file; the child reports the sizes the reader took mapped (from the workers).
CHILD = """
import json, sys
from dataclasses import asdict
from gpudeck.jobs.logs.analyze import LogAnalyzer, parallel
parallel.MIN_FILE = 1 << 20
parallel.TASK_BYTES = parallel.MIN_TASK_BYTES = 600 * 1024   # not a multiple of READ_CHUNK: pieces straddle tasks
taken = []
original = LogAnalyzer.feed_mapped
def counting(self, size, got):
    taken.append(size)
    if len(taken) == 1:
        open(sys.argv[1] + ".fed", "w").close()     # (the "kill" worker dies only after this)
    original(self, size, got)
LogAnalyzer.feed_mapped = counting
path, max_bytes = sys.argv[1], (int(sys.argv[2]) if sys.argv[2] != "-" else None)
if sys.argv[3:] == ["kill"]:             # the third task's worker dies as a worker killed by the OOM killer would
    import os
    mapping = parallel._map_task
    def dying(start, stop):
        if start > 2 * parallel.TASK_BYTES and start <= 3 * parallel.TASK_BYTES:
            # Once the reader has taken a mapped piece: a pool broken earlier loses the results its
            # manager thread had not yet delivered, and a loaded machine could then map nothing.
            import time
            deadline = time.monotonic() + 30
            while not os.path.exists(path + ".fed") and time.monotonic() < deadline:
                time.sleep(0.005)
            os._exit(137)
        return mapping(start, stop)
    parallel._map_task = dying
if sys.argv[3:] == ["truncate"]:         # the file cut, while the workers read it, at the start of the third task
    import os
    mapping = parallel._map_task
    def cutting(start, stop):
        if start > 2 * parallel.TASK_BYTES:
            try:
                os.close(os.open(path + ".cut", os.O_CREAT | os.O_EXCL))
                os.truncate(path, start)
            except FileExistsError:
                pass
        return mapping(start, stop)
    parallel._map_task = cutting
if sys.argv[3:] == ["reads"]:            # a worker's read larger than a piece is noted in a file
    import os
    parent, pread = os.getpid(), os.pread
    def noting(fd, size, at):
        if os.getpid() != parent and size > 2 * parallel.READ_CHUNK:
            with open(path + ".big", "a") as note:
                note.write(f"{size}\\n")
        return pread(fd, size, at)
    os.pread = noting
if sys.argv[3:] == ["nostdout"]:         # started with its stdout closed (sys.stdout None): print writes nothing
    sys.stdout = None
starts = []
if sys.argv[3:] == ["backoff"]:          # the reader's read after a dense task ends mid-stretch
    parallel.DENSE_BACKOFF_BYTES = 300_001
    spreading = parallel._spread
    parallel._spread = lambda analyzer, fd, start, *rest: starts.append(start) or spreading(analyzer, fd, start, *rest)
forks = []
if sys.argv[3:] == ["many"]:             # workers asked for: far more than the tasks
    import os
    fork = os.fork
    os.fork = lambda: forks.append(1) or fork()
workers = 64 if sys.argv[3:] == ["many"] else 2
""" + BOTH_READINGS + """out["mapped"] = taken
out["forks"] = len(forks)
out["starts"] = starts
sys.stdout = sys.__stdout__
print(json.dumps(out))
"""


def _child(path: Path, max_bytes: int | None = None, *extra: str, timeout: float = 120) -> dict:
    """The child's report; a child that does not come back in `timeout` is killed with its workers."""
    code, stdout, stderr = run_python_in_group(CHILD, [str(path), "-" if max_bytes is None else str(max_bytes), *extra],
                                               timeout, "the reading")
    assert code == 0, stderr[-2000:]
    return json.loads(stdout)


def _both(path: Path, max_bytes: int | None = None, *extra: str) -> tuple[list, list, list[int]]:
    """(the one-process reading, the spread one, the sizes read mapped), each [asdict, to_json, truncated]."""
    out = _child(path, max_bytes, *extra)
    return out["serial"], out["spread"], out["mapped"]


def test_a_serving_log_read_by_workers_gives_the_one_process_answer(tmp_path: Path) -> None:
    rng = random.Random(3)
    log = tmp_path / "serving.log"
    log.write_text(BANNER + _serving(rng, 1200) + CRASH, encoding="utf-8")
    serial, spread, mapped = _both(log)
    assert spread == serial
    assert sum(mapped) > log.stat().st_size // 2, "the workers' mapped pieces were not read"
    assert serial[1]["failure"]["cause"] == "cuda_oom"
    assert serial[1]["failure"]["line"] == log.read_text().count("\n")   # the OOM line, the file's last


def test_dense_stretches_a_cut_line_and_max_bytes_give_the_one_process_answer(tmp_path: Path) -> None:
    rng = random.Random(5)
    log = tmp_path / "mixed.log"
    text = BANNER + _serving(rng, 400) + _dense(rng, 20000) + _serving(rng, 400) + CRASH + "a last line, unended"
    log.write_text(text, encoding="utf-8")
    serial, spread, mapped = _both(log)
    assert spread == serial and serial[1]["failure"]["cause"] == "cuda_oom"
    assert mapped and sum(mapped) < len(text) * 3 // 4, "no piece, or every piece, was read mapped"
    for cut in (len(text) // 2 + 17, len(text) - 40):          # mid-line, mid-file and in the crash
        serial, spread, _ = _both(log, max_bytes=cut)
        assert spread == serial and serial[2] is True


def test_a_worker_that_dies_leaves_its_bytes_to_the_reader(tmp_path: Path) -> None:
    log = tmp_path / "serving.log"
    log.write_text(BANNER + _serving(random.Random(9), 1200) + CRASH, encoding="utf-8")
    serial, spread, mapped = _both(log, None, "kill")
    assert spread == serial and serial[1]["failure"]["cause"] == "cuda_oom"
    assert 0 < sum(mapped) < log.stat().st_size * 2 // 3, "the dead worker's stretch was not read by the reader"


def test_a_spread_after_a_dense_stretch_starts_just_after_a_newline(tmp_path: Path) -> None:
    # The reader's read between spreads stopped at its byte count, mid-line, and the next spread began
    # there: right only because the reader refuses mapped pieces while it holds a partial line.
    rng = random.Random(7)
    log = tmp_path / "mixed.log"
    log.write_text(BANNER + _serving(rng, 200) + _dense(rng, 20000) + _serving(rng, 1200) + CRASH, encoding="utf-8")
    out = _child(log, None, "backoff")
    assert out["spread"] == out["serial"] and out["serial"][1]["failure"]["cause"] == "cuda_oom"
    assert sum(out["mapped"]) > 0 and len(out["starts"]) >= 3, out["starts"]   # (spread, backoffs, spread)
    data = log.read_bytes()
    assert [start for start in out["starts"] if data[start - 1:start] != b"\n"] == []


def test_a_log_that_names_no_engine_is_read_in_one_process(tmp_path: Path) -> None:
    log = tmp_path / "build.log"
    # (long paths: over the child's 1 MB threshold in few lines, each of which the reader examines)
    src = "csrc/quantization/fused_kernels/layernorm_quant_kernels_for_every_dtype"
    log.write_text("".join(f"[{i}/12000] Building CUDA object {src}/k{i}.cu.o\n" for i in range(1, 12001))
                   + f"FAILED: {src}/k12000.cu.o\nninja: build stopped: subcommand failed.\n", encoding="utf-8")
    assert log.stat().st_size > 1 << 20
    serial, spread, mapped = _both(log)
    assert spread == serial and serial[1]["failure"]["cause"] == "build_failed"
    assert mapped == []


def test_a_small_file_or_one_worker_is_not_spread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(parallel, "_spread", lambda *args: calls.append(1) or (args[3], True))   # (read to the limit)
    monkeypatch.setattr(parallel.threading, "active_count", lambda: 1)   # (a test worker has threads)
    log = tmp_path / "serving.log"
    log.write_text(BANNER + _serving(random.Random(1), 300), encoding="utf-8")
    with log.open("rb") as fh:
        parallel.analyze_regular(fh, workers=8)                # under MIN_FILE
    monkeypatch.setattr(parallel, "MIN_FILE", 1 << 10)
    with log.open("rb") as fh:
        parallel.analyze_regular(fh, workers=1)
    assert calls == []
    with log.open("rb") as fh:
        parallel.analyze_regular(fh, workers=2)
    assert calls == [1]
    assert analyze_file(log).phase == "ready"


def test_a_file_cut_while_the_workers_read_it_still_gives_an_answer(tmp_path: Path) -> None:
    # Cut at a task's start (just after a newline): that task's worker read nothing there and looped.
    log = tmp_path / "serving.log"
    log.write_text(BANNER + _serving(random.Random(11), 1200) + CRASH, encoding="utf-8")
    out = _child(log, None, "truncate", timeout=30)
    assert (tmp_path / "serving.log.cut").exists() and 2 * 600 * 1024 < log.stat().st_size < 3 * 1024 * 1024
    assert out["serial"][1]["failure"]["cause"] == "cuda_oom"      # (read whole, before the cut)
    # The spread read the bytes before the cut, and only those: its answer is the one a reader of the
    # file as it was left gives (where it was cut, at which of two tasks' start, is up to the workers).
    with log.open("rb") as fh:
        analysis, truncated = parallel.analyze_stream(fh)
    assert out["spread"] == json.loads(json.dumps([asdict(analysis), analysis.to_json(), truncated]))
    assert out["spread"][1]["failure"] is None and out["spread"][1]["phase"] == "ready"   # (the crash was cut)


def test_a_workers_reads_stay_within_a_piece_on_a_line_of_megabytes(tmp_path: Path) -> None:
    # A bar redrawn with \r only for MBs, then a newline: a worker's reads must not grow with the line.
    rng = random.Random(13)
    log = tmp_path / "bar.log"
    bar = "".join(f"Loading weights {j % 100}/100 [00:0{j % 10}<00:09]\r" for j in range(120000))
    log.write_text(BANNER + _serving(rng, 300) + bar + "\n" + _serving(rng, 300) + CRASH, encoding="utf-8")
    serial, spread, _ = _both(log, None, "reads")
    assert spread == serial and serial[1]["failure"]["cause"] == "cuda_oom"
    big = tmp_path / "bar.log.big"
    assert not big.exists(), f"a worker read {big.read_text().split()} bytes at once"


def test_a_process_whose_stdout_is_closed_is_still_spread(tmp_path: Path) -> None:
    log = tmp_path / "serving.log"
    log.write_text(BANNER + _serving(random.Random(15), 1200) + CRASH, encoding="utf-8")
    serial, spread, mapped = _both(log, None, "nostdout")
    assert spread == serial and sum(mapped) > log.stat().st_size // 2


def test_workers_beyond_the_tasks_are_not_forked(tmp_path: Path) -> None:
    log = tmp_path / "serving.log"
    log.write_text(BANNER + _serving(random.Random(17), 1200) + CRASH, encoding="utf-8")
    out = _child(log, None, "many")
    assert out["spread"] == out["serial"]
    assert 0 < out["forks"] <= log.stat().st_size // (600 * 1024) + 1, f"{out['forks']} workers forked"


def test_a_piece_whose_kept_lines_are_most_of_it_comes_back_dense(tmp_path: Path) -> None:
    # One 60 KB anchored line in each 256 KB piece: few lines (sparse by count), most bytes kept. Handed
    # back mapped, every worker's results in flight would be as large as its tasks.
    rng = random.Random(2)
    text = BANNER + "".join(_serving(rng, 30) + "(APIServer pid=1) ERROR 05-07 11:00:00 [x.py:1] Error in request "
                            + "x" * 60_000 + "\n" for _ in range(60))
    log = tmp_path / "long_errors.log"
    log.write_text(text, encoding="utf-8")
    serial, spread, mapped = _both(log)
    assert spread == serial
    assert mapped == [], "pieces whose kept lines are most of their bytes were handed back mapped"
    plain = tmp_path / "serving.log"                       # the control: a serving log is handed back mapped
    plain.write_text(BANNER + _serving(rng, 1200), encoding="utf-8")
    assert sum(_both(plain)[2]) > plain.stat().st_size // 2



# Both scripts take SIGINT as a terminal's process does: a test run started in the background (`cmd &`
# in a script) inherits it ignored, and Python then raises no KeyboardInterrupt at all.
INTERRUPTED = """
import json, os, signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
from gpudeck.jobs.logs.analyze import LogAnalyzer, parallel
parallel.MIN_FILE = 1 << 20
parallel.TASK_BYTES = parallel.MIN_TASK_BYTES = 600 * 1024
feed_mapped = LogAnalyzer.feed_mapped
def slow(self, size, got):                             # a slow reader: the workers wait for tasks, idle
    open(sys.argv[2], "a").close()                    # the spread has begun
    time.sleep(0.1)
    feed_mapped(self, size, got)
LogAnalyzer.feed_mapped = slow
t = time.monotonic()
try:
    with open(sys.argv[1], "rb") as fh:
        parallel.analyze_regular(fh, workers=2)
    print(json.dumps({"interrupted": False}))
except KeyboardInterrupt:
    print(json.dumps({"interrupted": True}))
"""


def test_ctrl_c_stops_the_spread_without_the_workers_tracebacks(tmp_path: Path) -> None:
    # Before: the workers took the Ctrl-C too, one could die holding the task queue's lock, and the
    # reader's pool then waited for it forever (the CLI hung after ^C).
    log = tmp_path / "serving.log"
    log.write_text(BANNER + _serving(random.Random(19), 2400) + CRASH, encoding="utf-8")
    begun = tmp_path / "begun"
    child = subprocess.Popen([sys.executable, "-c", INTERRUPTED, str(log), str(begun)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not begun.exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert begun.exists(), "the spread never began"
        os.killpg(child.pid, signal.SIGINT)               # ^C: the terminal signals the whole group
        stdout, stderr = child.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.communicate()
        raise AssertionError("the interrupted reading did not stop in 30 s") from None
    assert json.loads(stdout) == {"interrupted": True}
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr[-2000:]
    with pytest.raises(ProcessLookupError):           # no worker left behind in its group
        os.killpg(child.pid, 0)


# Ctrl-C while the workers are forked. "raise": a KeyboardInterrupt raised in the second fork's place,
# the first worker already forked. "signal": the process group signalled there, the first worker not
# yet in _adopt (so still with SIGINT blocked, as forked).
FORKING = """
import json, os, signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
from gpudeck.jobs.logs.analyze import parallel
parallel.MIN_FILE = 1 << 20
parallel.TASK_BYTES = parallel.MIN_TASK_BYTES = 600 * 1024
path, mode = sys.argv[1], sys.argv[2]
fork, adopt, spawned, parent = os.fork, parallel._adopt, [], os.getpid()
def wait(done):
    deadline = time.monotonic() + 10
    while not done() and time.monotonic() < deadline:
        time.sleep(0.005)
def forking():
    if os.getpid() != parent:
        return fork()
    spawned.append(1)
    if len(spawned) == 2 and mode == "raise":
        raise KeyboardInterrupt
    if len(spawned) == 2 and mode == "signal":
        wait(lambda: os.path.exists(path + ".adopting"))
        try:
            os.killpg(0, signal.SIGINT)                 # ^C: the terminal signals the whole group
        finally:                                        # (the first worker's answer to it awaited)
            open(path + ".signalled", "w").close()
            wait(lambda: os.path.exists(path + ".adopted"))
    return fork()
def adopting(fd):                                      # the first worker, running, adopts once signalled
    open(path + ".adopting", "w").close()
    wait(lambda: os.path.exists(path + ".signalled"))
    adopt(fd)
    open(path + ".adopted", "w").close()
os.fork = forking
if mode == "signal":
    parallel._adopt = adopting
try:
    with open(path, "rb") as fh:
        parallel.analyze_regular(fh, workers=2)
    print(json.dumps({"interrupted": False, "spawned": len(spawned)}))
except KeyboardInterrupt:
    print(json.dumps({"interrupted": True, "spawned": len(spawned)}))
"""


@pytest.mark.parametrize("mode", ["raise", "signal"])
def test_ctrl_c_while_the_workers_are_forked_neither_hangs_nor_prints_tracebacks(tmp_path: Path, mode: str) -> None:
    # Before (a concurrent.futures pool): the forked workers (SIGINT ignored) waited for tasks that no
    # manager thread would hand out or tell them to stop, and the process hung at exit joining them;
    # a worker not yet in _adopt printed the KeyboardInterrupt's traceback.
    log = tmp_path / "serving.log"
    log.write_text(BANNER + _serving(random.Random(23), 2400) + CRASH, encoding="utf-8")
    child = subprocess.Popen([sys.executable, "-c", FORKING, str(log), mode], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = child.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.communicate()
        raise AssertionError("the process interrupted while forking did not exit in 30 s") from None
    assert child.returncode == 0, stderr[-2000:]
    assert json.loads(stdout) == {"interrupted": True, "spawned": 2}
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr[-2000:]
    with pytest.raises(ProcessLookupError):           # no worker left behind in its group
        os.killpg(child.pid, 0)
