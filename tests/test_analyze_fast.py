"""The fast (template) scanner of the log analyzer gives exactly the answer of the exhaustive one, on any mix and any chunking."""
from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analyze_reference import ReferenceAnalyzer
from gpudeck.jobs.logs import analyze as an
from gpudeck.jobs.logs.analyze import LogAnalyzer, generic, patterns, scanner, templates

FIXTURES = Path(__file__).parent / "fixtures" / "logs"
FIXTURE_LINES = [ln for p in sorted(FIXTURES.glob("*.log")) for ln in p.read_bytes().split(b"\n")]


def _n(r: random.Random) -> int:
    return r.choice([0, 1, 7, 9, 12, 95, 99, 100, 137, 512, 4096, r.randint(0, 99999)])


def _f(r: random.Random) -> str:
    return r.choice(["0.0", "0.5", "0.94", "0.95", "0.99", "1.0", "1.2", "12.3", "94.9", "95.0", "99.9", "100.0",
                     f"{r.uniform(0, 100):.{r.randint(0, 3)}f}"])


def _bar(r: random.Random, label: str, total: int) -> str:
    done = r.randint(0, total)
    pct = done * 100 // max(total, 1)
    fill = "#" * (pct // 10)
    rate = r.choice([f"{r.uniform(0.1, 9):.2f}it/s", f"{r.uniform(0.1, 9):.2f}s/it", "?it/s"])
    return f"{label}{pct:3d}%|{fill:10s}| {done}/{total} [00:{r.randint(0, 59):02d}<00:{r.randint(0, 59):02d}, {rate}]"


# Each maker returns text for one or more physical lines (no trailing newline); numbers vary so
# that many lines share a template.
MAKERS = [
    # one phase marker repeated on consecutive lines (every rank prints it): the first and the last count
    lambda r: "\n".join(r.choice(["[2025-10-22 10:00:0{k} TP{k}] The server is fired up and ready to roll!",
                                   "[2025-10-22 10:00:0{k} TP{k}] Memory pool end. avail mem={k}.5 GB",
                                   "(APIServer pid=1{k}) INFO:     Application startup complete.",
                                   "[2025-10-22 10:00:0{k} TP{k}] Load weight begin. avail mem=7{k}.1 GB"]).format(k=k)
                         for k in range(r.randint(1, 4))),
    lambda r: "\r".join(_bar(r, r.choice(["", "Loading safetensors checkpoint shards: ", "Capturing batches: ",
                                          "Training: ", "Epoch 1: ", "(Worker pid=3) Compiling: "]), 50)
                        for _ in range(r.randint(1, 30))),
    lambda r: "\r" + "\r".join(_bar(r, "", 20000) for _ in range(r.randint(1, 20)))
    + r.choice(["", "{'loss': 0.5, 'grad_norm': 1.0, 'learning_rate': 1e-05, 'epoch': 0.%d}" % r.randint(1, 9),
                "ERROR 05-07 10:00:00 [x.py:1] boom", "   "]),
    lambda r: f"Loading safetensors checkpoint shards: {_n(r) % 101}% Completed | {r.randint(0, 9)}/9 [00:01<00:02,  1.50s/it]",
    lambda r: f"[{r.randint(1, 500)}/{r.choice([500, 1000])}] /usr/bin/nvcc -c /src/{r.choice(['vllm', 'x'])}/k{_n(r)}.cu",
    lambda r: f"[{r.randint(0, 100):3d}%] Building CXX object k{_n(r)}.o",
    lambda r: f"#12 {r.uniform(1, 99):.2f} [{r.randint(1, 9)}/9] c++ -c a.cpp",
    lambda r: f"(APIServer pid=1) INFO 05-07 10:{r.randint(0, 59):02d}:00 [loggers.py:1] Engine 000: Avg prompt throughput: "
              f"{_f(r)} tokens/s, Avg generation throughput: {_f(r)} tokens/s, Running: {_n(r) % 70} reqs, "
              f"Waiting: {r.choice([0, 0, 3])} reqs, GPU KV cache usage: {_f(r)}%, Prefix cache hit rate: 1.0%",
    lambda r: f"INFO 05-07 10:00:00 [metrics.py:1] SpecDecoding metrics: Mean acceptance length: "
              f"{r.choice(['1.01', '1.05', '2.50', '3.1'])}, Accepted: 7 tokens, Drafted: 9 tokens, "
              f"Avg Draft acceptance rate: {r.choice(['1.2', '35.0', '4.0'])}%",
    lambda r: "INFO 05-07 10:00:00 [metrics.py:1] Speculative metrics: Draft acceptance rate: 0.%d, "
              "System efficiency: 0.5, Number of speculative tokens: 3, Number of accepted tokens: 9, "
              "Number of draft tokens: %d, Number of emitted tokens: %d." % (r.randint(0, 9), r.choice([0, 30]), _n(r)),
    lambda r: f"[2025-10-22 10:00:{r.randint(10, 59)} TP{r.randint(0, 7)}] Decode batch. #running-req: {_n(r)}, "
              f"#token: {_n(r)}, token usage: {_f(r)}, accept len: {r.choice(['1.01', '2.5'])}, "
              f"gen throughput (token/s): {_f(r)}, #queue-req: {r.choice([0, 2])}, ",
    lambda r: f"[2025-10-22 10:00:00 TP0] Prefill batch. #new-seq: 1, #new-token: {_n(r)}, full token usage: {_f(r)}, "
              f"#running-req: {_n(r)}, #queue-req: 0, ",
    lambda r: f"node-{r.randint(0, 7)}:{_n(r)}:{_n(r)} [{r.randint(0, 7)}] NCCL INFO Channel {r.randint(0, 31):02d}/0 : "
              f"via P2P/CUMEM/read",
    lambda r: r.choice(["NCCL WARN NCCL error: unhandled system error", "[E ProcessGroupNCCL.cpp:563] timeout",
                        "NCCL communicator was aborted on rank 1."]),
    lambda r: f"NVRM: Xid (PCI:0000:{r.randint(10, 99)}:00): {r.choice([13, 31, 43, 45, 79, 94])}, pid={_n(r)}, name=python",
    lambda r: f"Process exited with {r.choice(['exit code 137', 'exit code 1', 'exit code 0'])}",
    lambda r: f"worker died due to signal {r.choice([9, 11, 6])}",
    lambda r: r.choice(["Killed", "Traceback (most recent call last):", '  File "/a/b.py", line %d, in f' % _n(r),
                        '    raise RuntimeError("CUDA error: x")', "RuntimeError: CUDA error: an illegal memory access",
                        "ValueError: bad value %d" % _n(r), "torch.OutOfMemoryError: CUDA out of memory.",
                        "usage: vllm serve [-h]", "vllm: error: unrecognized arguments: --x",
                        "ERROR 05-07 10:00:00 [core.py:1] EngineCore failed to start.",
                        "WARNING 05-07 10:00:00 [x.py:1] Error %d ignored" % _n(r), "    ^^^^^", "KeyboardInterrupt",
                        "ERROR:    Exception in ASGI application",
                        "slurmstepd: error: *** JOB %d ON node-1 CANCELLED AT 2026-12-07T17:00:01 ***" % _n(r),
                        "bash: line 1:  %d Killed                  sleep 0.2" % _n(r),
                        "CRITICAL 05-07 10:00:00 [core_client.py:359] Got fatal signal from worker processes, shutting "
                        "down. See stack trace above for root cause issue.",
                        "(APIServer pid=1) ERROR 05-07 10:00:00 [serving_chat.py:246] Error in preprocessing prompt inputs",
                        "      ModuleNotFoundError: No module named 'torch'",
                        "/usr/bin/ld: cannot find -laio: No such file or directory",
                        "gpu-1:40:40 [0] NCCL INFO NET/Plugin: Plugin load returned 2 : libnccl-net.so: cannot open "
                        "shared object file: No such file or directory"]),
    lambda r: r.choice(["(Worker_TP0 pid=30) INFO 05-07 10:00:00 [m.py:1] Starting to load model /m",
                        "(Worker_TP0 pid=30) INFO 05-07 10:00:00 [m.py:1] Loading weights took %d.5 seconds" % _n(r),
                        "(APIServer pid=1) INFO:     Application startup complete.",
                        "[2025-10-22 10:00:00] The server is fired up and ready to roll!",
                        "Capturing batches (bs=%d avail_mem=%d.1 GB)" % (_n(r), _n(r)),
                        "-- The CXX compiler identification is GNU 11.4.0", "***** Running training *****",
                        "  Num Epochs = %d" % r.randint(1, 9), "  Total optimization steps = %d" % _n(r),
                        "step %d/%d loss=0.5" % (_n(r), _n(r)), "Epoch %d/%d" % (r.randint(0, 9), r.randint(1, 9)),
                        "global_step=%d loss: 1.5" % _n(r), "Allowing ninja to set a default number of workers",
                        "Prebuilt kernels not found, using JIT backend",
                        "KV cache pool is full. Retract requests. #retracted_reqs: %d" % _n(r),
                        "{'train_runtime': %d.5}" % _n(r), "flashinfer.jit: compiling", "from /src/sglang/srt/x.py"]),
    lambda r: f'(APIServer pid=1) INFO:     10.1.{r.randint(0, 255)}.{r.randint(1, 254)}:{_n(r)} - "POST /v1/chat HTTP/1.1" 200 OK',
    lambda r: r.choice(["", "   ", "\x1b[32mINFO\x1b[0m Loading weights took 1.0 seconds", "\xff\xfe broken \xc3",
                        "usage: %s" % _f(r), "GPU KV cache usage:  97.0%", "token usage: 0.97, #queue-req: 3, "]),
    lambda r: r.choice(FIXTURE_LINES).decode("utf-8", "replace"),
    # buildkit steps carry a timestamp, so their rate comes from the first step of a series
    lambda r: "\n".join(f"#12 {10 + 3 * k + r.random():.2f} [{k}/{r.choice([9, 9, 12])}] c++ -c a{k}.cpp"
                        for k in range(r.randint(1, 4), r.randint(5, 9))),
    # a stretch of phase markers of several kinds and templates (folded by the scanner: only the
    # last one and the last that names the phase are read)
    lambda r: "\n".join(r.choice([
        "[2025-10-22 10:00:0{k} TP{k}] Load weight begin. avail mem=7{k}.1 GB",
        "INFO 05-07 10:00:0{k} [loader.py:1] Loading weights took {k}.5 seconds",
        "INFO 05-07 10:00:0{k} [backends.py:1] Dynamo bytecode transform time: {k}.1 s",
        "INFO 05-07 10:00:0{k} [monitor.py:1] torch.compile takes {k}.5 s in total",
        "[2025-10-22 10:00:0{k} TP{k}] Capture cuda graph begin. This can take up to several minutes.",
        "[2025-10-22 10:00:0{k} TP{k}] Capture cuda graph end. Time elapsed: {k}.1 s",
        "INFO 05-07 10:00:0{k} [gpu_worker.py:1] Available KV cache memory: {k}.5 GiB",
        "-- The CXX compiler identification is GNU 11.4.{k}", "***** Running training *****",
        "(APIServer pid=1{k}) INFO:     Started server process [1{k}]",
        "(APIServer pid=1{k}) INFO:     Application startup complete.",
        "Allowing ninja to set a default number of workers"]).format(k=r.randint(0, 9))
        for _ in range(r.randint(2, 9))),
    # a loading bar that completes (and may restart) before unlabeled bars: those become capture
    lambda r: "\r".join(f"Loading weights: {d * 100 // 4:3d}%|{'#' * d:4s}| {d}/4 [00:01<00:01, 1.00it/s]"
                        for d in r.choice([[1, 4, 2], [1, 2, 4], [4, 4], [0, 1, 2], [4, 0]]))
    + "\n" + "\r".join(_bar(r, "", 9) for _ in range(r.randint(1, 4))),
    # the generic layer: wrappers' prefixes, watchdog families, build tools' exits, envelopes,
    # labelled counters anywhere, numbers that are no whole token
    lambda r: r.choice(["", "[build] ", "web-1  | ", "  | ", "pod/x-7f9 ", "[1830] "]) + r.choice([
        f"[{r.randint(1, 230)}/230] Building CUDA object k{_n(r)}.o",
        f"[2026-05-02 10:06:0{r.randint(0, 9)} PP1 TP1] Scheduler watchdog timeout (self.watchdog_timeout=300, self.soft=False)",
        "subprocess.CalledProcessError: Command '['ninja', '-v']' returned non-zero exit status %d." % r.choice([1, 2, -9]),
        "  \u00d7 Building wheel for vllm (pyproject.toml) did not run successfully.",
        f"x.py:{_n(r)}: UserWarning: Failed to initialize NumPy: No module named 'numpy'",
        f"rank0: Loading checkpoint shard [{r.randint(0, 8)}/8]",
        f"rank0: Loading checkpoint {r.randint(0, 12)}/{r.choice([0, 8, 10])} from /m",
        f">>> [{r.randint(1, 230)}/230] Building CUDA object k{_n(r)}.o",
        f"step {r.randint(1, 99)}/1e{r.randint(2, 400)} loss 1.{r.randint(0, 9)}",
        f"Engine 000: Avg prompt throughput: 1e{r.randint(1, 400)} tokens/s, Avg generation throughput: 2.0 tokens/s",
        f"      CMake Error at CMakeLists.txt:{_n(r)} (find_package):"]),
]


def _log(seed: int, n_lines: int) -> bytes:
    r = random.Random(seed)
    # Favour a few makers per log so that runs of one kind form, as in real logs.
    favourites = r.sample(range(len(MAKERS)), 4)
    parts = []
    for _ in range(n_lines):
        k = r.choice(favourites) if r.random() < 0.8 else r.randrange(len(MAKERS))
        for _ in range(r.choice([1, 1, 1, 5])):
            part = MAKERS[k](r)
            if r.random() < 0.05:
                part = f"\x1b[3{r.randint(0, 7)}m{part}\x1b[0m"   # coloured (ANSI stripped before reading)
            parts.append(part)
    text = r.choice(["\n", "\n", "\r\n"]).join(parts) + r.choice(["\n", "", "\r"])
    data = text.encode("utf-8", "surrogateescape").replace("\xff\xfe".encode(), b"\xff\xfe")
    if r.random() < 0.1:
        cut = r.randrange(len(data) + 1)
        data = data[:cut] + b"Z" * (an.GIANT_SEGMENT + 10) + b" CUDA error: at the end\n" + data[cut:]
    return data


def _run(data: bytes, cuts: list[int], nows: list, exhaustive: bool) -> list:
    a = ReferenceAnalyzer() if exhaustive else LogAnalyzer()
    seen, prev = [], 0
    for cut, now in zip(sorted(set(cuts)) + [len(data)], nows):
        a.feed(data[prev:cut], now=now)
        prev = cut
        seen.append((a.line, a.result()))
    a.finish()
    seen.append((a.line, a.result()))
    return seen


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**9), n_lines=st.integers(1, 120), data=st.data())
def test_fast_scanner_equals_exhaustive_scanner(seed: int, n_lines: int, data: st.DataObject) -> None:
    log = _log(seed, n_lines)
    # Many cuts: the answer is compared after every feed, so transient differences show too.
    cuts = data.draw(st.lists(st.integers(0, len(log)), max_size=40))
    clock = data.draw(st.sampled_from(["none", "live"]))
    nows = [None if clock == "none" else 1000.0 + 7 * k for k in range(len(cuts) + 1)]
    # Small limits reach the one-off batch, cache clearing and unremembered long templates.
    limits = data.draw(st.sampled_from([None, (2, 4096, 64)]))
    # Feeds this small are joined to their tail; 1: their first segment is scanned on its own (big feeds).
    split = data.draw(st.sampled_from([scanner.SPLIT_FEED, 1]))
    # The prebuilt segment indexes cover small chunks only: 3 sends most chunks to range().
    indexes = data.draw(st.sampled_from([scanner.INDEXES, tuple(range(3))]))
    saved = (scanner.TEMPLATE_ONE_OFFS_MAX, scanner.TEMPLATE_CACHE_BYTES, scanner.TEMPLATE_KEY_MAX, scanner.SPLIT_FEED,
             scanner.INDEXES)
    if limits:
        scanner.TEMPLATE_ONE_OFFS_MAX, scanner.TEMPLATE_CACHE_BYTES, scanner.TEMPLATE_KEY_MAX = limits
    scanner.SPLIT_FEED, scanner.INDEXES = split, indexes
    try:
        fast = _run(log, cuts, nows, exhaustive=False)
    finally:
        (scanner.TEMPLATE_ONE_OFFS_MAX, scanner.TEMPLATE_CACHE_BYTES, scanner.TEMPLATE_KEY_MAX,
         scanner.SPLIT_FEED, scanner.INDEXES) = saved
    assert fast == _run(log, cuts, nows, exhaustive=True)


def test_fast_scanner_skips_work_on_repetitive_logs() -> None:
    """A run of redraws and stats lines costs a handful of examinations, not one per line."""
    r = random.Random(3)
    stats = ("(APIServer pid=1) INFO 05-07 10:00:00 [loggers.py:1] Engine 000: Avg prompt throughput: {:.1f} tokens/s, "
             "Avg generation throughput: {:.1f} tokens/s, Running: {} reqs, Waiting: 0 reqs, GPU KV cache usage: {:.1f}%")
    spec = "INFO 05-07 10:00:00 [metrics.py:1] SpecDecoding metrics: Mean acceptance length: {:.2f}, Avg Draft acceptance rate: {:.1f}%"
    data = ("\n".join(stats.format(r.uniform(0, 999), r.uniform(0, 999), r.randint(0, 64), r.uniform(0, 90)) + "\n"
                      + spec.format(r.uniform(1, 3), r.uniform(10, 60)) for _ in range(2000)) + "\n"
            + "\r".join(_bar(r, "Training: ", 50000) for _ in range(3000)) + "\n").encode()
    calls = []
    fast = LogAnalyzer()
    original = fast._state.examine
    fast._state.examine = lambda raw, line, fams=0: (calls.append(line), original(raw, line, fams))
    fast.feed(data)
    fast.finish()
    full = ReferenceAnalyzer()
    full.feed(data)
    full.finish()
    assert fast.result() == full.result()
    assert len(calls) < 20, len(calls)


def test_only_known_patterns_name_digit_values() -> None:
    """Templates map every digit to 0; that is sound only while no pattern tests a digit's value
    outside the contexts the fast scanner always examines in full (_DIGIT_VALUE_WORDS)."""
    import re

    allowed = {"BUILD_SPECIFIC", "HOST_OOM", "_KV_UNSAFE_USAGE",   # the last one reads raw bytes, not templates
               "BUILD_TOOL_EXIT", "KILLED_EXIT"}                     # generic.py's exit codes
    offenders = {}
    for name, value in [*vars(patterns).items(), *vars(templates).items(), *vars(generic).items()]:
        if not isinstance(value, re.Pattern):
            continue
        pat = value.pattern if isinstance(value.pattern, str) else value.pattern.decode("latin-1")
        pat = re.sub(r"\(\?P<\w+>", "(", pat)                 # group names
        pat = re.sub(r"\{\d*,?\d*\}", "", pat)                # quantifiers
        pat = re.sub(r"\\x[0-9a-fA-F]{2}", "", pat)             # byte escapes
        pat = re.sub(r"\\[dDwWsSbB]", "", pat)                # classes
        pat = re.sub(r"\[[^\]]*0-9[^\]]*\]|\[0-\?\]", "", pat)  # classes with every digit
        for m in re.finditer(r"\d", pat):
            context = pat[max(0, m.start() - 60):m.start()]
            if name not in allowed or not (name == "_KV_UNSAFE_USAGE"
                                           or any(w in context for w in templates._DIGIT_VALUE_WORDS)):
                offenders.setdefault(name, []).append(pat[max(0, m.start() - 20):m.start() + 5])
    assert not offenders, offenders


def test_digit_value_lines_are_judged_per_segment() -> None:
    lines = [b"collect2: error: ld failed", b"collect0: error: ld failed", b"worker died due to signal 9",
             b"worker died due to signal 1", b"Process exited with exit code 137", b"Process exited with exit code 100",
             b"NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus", b"NVRM: Xid (PCI:0000:3b:00): 43, pid=1",
             b"Exit code: 137", b"Exit code: 100", b"worker done, returncode=-9", b"worker done, returncode=-1",
             b"Failed core proc(s): {'EngineCore_DP0': -9}", b"Failed core proc(s): {'EngineCore_DP0': 1}"]
    for line in lines:
        for other in lines:
            data = line + b"\n" + other + b"\n"
            fast, full = LogAnalyzer(), ReferenceAnalyzer()
            for a in (fast, full):
                a.feed(data)
                a.finish()
            assert fast.result() == full.result(), data


def test_slurm_oom_after_a_kill_is_read_per_segment() -> None:
    """Slurm's OOM line replaces a held host_oom of the same rank (a better hint): repeated, so its
    template is planned, each one must still move the root cause to its line."""
    block = (b"(APIServer pid=1) INFO 05-07 08:00:00 [api_server.py:1800] vLLM API server version 0.11.0\n"
             b"Killed\nslurmstepd: error: Detected 1 oom_kill event in StepId=12.batch. Some of the step tasks "
             b"have been OOM Killed.\nKilled\nslurmstepd: error: Exceeded job memory limit at some point.\n")
    fast, full = LogAnalyzer(), ReferenceAnalyzer()
    for a in (fast, full):
        a.feed(block * 6)
        a.finish()
    assert full.result().failure.line == 30
    assert fast.result() == full.result()


def test_fast_scanner_equals_reference_on_dense_repeated_logs() -> None:
    """Every fixture log, concatenated and repeated (so that every template is planned and
    read through its plan), cut at random points: the answers agree after every feed."""
    blob = b"".join(p.read_bytes().rstrip(b"\n") + b"\n" for p in sorted(FIXTURES.glob("*.log")))
    data = blob * 4
    r = random.Random(10)
    for _ in range(3):
        cuts = sorted(r.randrange(len(data)) for _ in range(30)) + [len(data)]
        fast, full = LogAnalyzer(), ReferenceAnalyzer()
        prev = 0
        for cut in cuts:
            fast.feed(data[prev:cut])
            full.feed(data[prev:cut])
            prev = cut
            assert fast.result() == full.result(), cut
        fast.finish()
        full.finish()
        assert fast.result() == full.result()


def test_unlabeled_full_bar_then_glued_bar_agree() -> None:
    """A run of unlabeled bars keeps its phase fixed: a full one must not end 'capturing' for its
    successor (found by a soak of reference-log mixes)."""
    data = (b"[2025-11-10 19:59:09 TP0] Capture cuda graph num tokens [4, 8, 12]\r\n"
            b" 99%|##########| 377/324 [94:95:57<86:19:70, 102.49s/it]\r\n"
            b" 14%|#4        | 378/2724 [13:58:09<86:18:35, 132.44s/it][2023-06-07 22:16:00,018] [INFO] "
            b"[loss_scaler.py:181:update_scale] [deepspeed] OVERFLOW! Rank 0 Skipping step.\r\n")
    fast, full = LogAnalyzer(), ReferenceAnalyzer()
    for a in (fast, full):
        a.feed(data)
        a.finish()
    assert fast.result() == full.result()


def test_a_folded_stretch_of_markers_keeps_the_marker_that_named_the_phase() -> None:
    # Once planned, "Running training" then "Started server process" form one stretch of markers:
    # the second leaves the phase at training, so why["phase"] must still name the first one.
    block = (b"(APIServer pid=1) INFO 05-07 10:00:00 [api_server.py:1] vLLM API server version 0.9.0\n"
             + b"(APIServer pid=1) INFO:     Started server process [1]\n" * 3
             + b"***** Running training *****\n(APIServer pid=1) INFO:     Started server process [12]\n")
    log = block * 4
    fast, ref = LogAnalyzer(), ReferenceAnalyzer()
    for a in (fast, ref):
        a.feed(log)
        a.finish()
    assert dict(fast.result().decided_by)["phase"] == dict(ref.result().decided_by)["phase"]
    assert "(line 23)" in dict(fast.result().decided_by)["phase"]
    assert fast.result() == ref.result()


def test_planned_numbers_are_read_from_each_segment() -> None:
    """Progress records, bars and stats lines read through a plan (every template repeated,
    numbers varying) take their values from each segment: every branch of _progress_record,
    units, rates, ETAs, timestamps, each stats format; compared with the reference scanner
    after every line."""
    r = random.Random(7)
    shapes = [
        lambda: "Epoch %d/%d" % (r.randint(0, 12), r.randint(1, 9)),
        lambda: "step %d/%d loss=0.5" % (r.randint(0, 150), r.choice([0, 100])),
        lambda: "step %d/%d" % (r.randint(0, 150), 100),
        lambda: "global_step=%d loss: 1.5" % r.randint(1, 99),
        lambda: "epoch %d loss %d.3" % (r.randint(1, 9), r.randint(0, 9)),
        lambda: "Iter %d: epoch %d/%d" % (r.randint(1, 99), r.randint(1, 9), r.randint(1, 9)),
        lambda: "epoch %d/%d | batch %d/%d | loss 0.%d" % (r.randint(0, 9), r.randint(1, 9), r.randint(0, 500),
                                                       r.choice([0, 400]), r.randint(0, 9)),
        lambda: "train_inner | epoch %03d:    %d / %d loss=3.%d, lr=0.0004" % (r.randint(0, 9), r.randint(0, 2300),
                                                                          r.choice([0, 2211]), r.randint(0, 9)),
        lambda: "Total training steps: %d" % r.choice([0, 934]),
        lambda: "  Total optimization steps = %d,%03d" % (r.randint(1, 9), r.randint(0, 999)),
        lambda: "  Num Epochs = %d" % r.randint(1, 9),
        lambda: "{'loss': 0.%d, 'learning_rate': 1e-05, 'epoch': %d.%d}" % (r.randint(1, 9), r.randint(0, 3), r.randint(0, 9)),
        lambda: "{'loss': 0.%d, 'epoch': %d.5, 'step': %d}" % (r.randint(1, 9), r.randint(0, 3), r.randint(1, 999)),
        lambda: "[%d/%d] c++ -c a.cpp" % (r.randint(1, 12), r.randint(12, 20)),
        lambda: "[ %2d%%] Building CXX object x.o" % r.randint(0, 99),
        lambda: "#12 %d.%02d [%d/9] c++ -c a.cpp" % (r.randint(10, 99), r.randint(0, 99), r.randint(1, 9)),
        lambda: "[2025-10-22 10:00:%02d] [%d/9] c++ -c b.cpp" % (r.randint(0, 59), r.randint(1, 9)),
        lambda: "Downloading: %2d%%|#####     | %d.%02dk/%d.0k [00:%02d<00:%02d, %d.%dkB/s]" % (
            r.randint(0, 99), r.randint(1, 9), r.randint(0, 99), r.randint(1, 9), r.randint(0, 59),
            r.randint(0, 59), r.randint(0, 9), r.randint(0, 9)),
        lambda: "Training: %2d%%|###   | %d/%d [0%d:10<0%d:20, %d.%02ds/it]" % (
            r.randint(0, 99), r.randint(0, 99), r.randint(1, 99), r.randint(0, 9), r.randint(0, 9),
            r.randint(0, 9), r.randint(0, 99)),
        lambda: " %2d%%|##  | %d/%d [00:0%d<?, ?it/s]{'loss': 0.%d, 'epoch': 0.%d}" % (
            r.randint(0, 99), r.randint(0, 9), r.randint(1, 9), r.randint(0, 9), r.randint(1, 9), r.randint(1, 9)),
        # stats lines (their numbers are read at planned spans too)
        lambda: "INFO 05-07 10:00:00 [loggers.py:1] Engine 000: Avg prompt throughput: %d.%d tokens/s, Avg "
                "generation throughput: %d.0 tokens/s, Running: %d reqs, Waiting: %d reqs, GPU KV cache usage: "
                "%d.%d%%, Prefix cache hit rate: 0.0%%" % (r.randint(0, 999), r.randint(0, 9), r.randint(0, 999),
                                                          r.randint(0, 9), r.randint(0, 3), r.randint(90, 99),
                                                          r.randint(0, 9)),
        lambda: "INFO 05-07 10:00:00 [metrics.py:1] SpecDecoding metrics: Mean acceptance length: %d.%02d, "
                "Draft acceptance rate: %d.%d%%" % (r.randint(1, 3), r.randint(0, 99), r.randint(0, 99), r.randint(0, 9)),
        # vLLM V0: the rate a fraction; the length from token counts when all three are there
        lambda: "INFO 07-24 04:00:31 metrics.py:316] Speculative metrics: Draft acceptance rate: %d.%03d, System "
                "efficiency: 0.059, Number of speculative tokens: %d, Number of accepted tokens: 0, Number of draft "
                "tokens%s: %d, Number of emitted tokens tokens: %d." % (
                    r.randint(0, 1), r.randint(0, 999), r.randint(1, 16), r.choice(["", " tokens"]),
                    r.randint(0, 60000), r.randint(0, 9999)),
        lambda: "INFO 07-24 04:00:31 metrics.py:316] Speculative metrics: Draft acceptance rate: 0.%03d, Number of "
                "speculative tokens: %d, Number of draft tokens: %d, Number of emitted tokens: %d." % (
                    r.randint(0, 999), r.randint(0, 16), r.randint(0, 60000), r.randint(0, 9999)),
        lambda: "[2025-10-22 10:00:00 TP0] Decode batch. #running-req: %d, #token: %d, token usage: 0.%02d, "
                "accept len: %d.%02d, gen throughput (token/s): %d.%02d, #queue-req: %d, full token usage: 0.%d" % (
                    r.randint(0, 64), r.randint(0, 9999), r.randint(0, 99), r.randint(1, 4), r.randint(0, 99),
                    r.randint(0, 999), r.randint(0, 99), r.randint(0, 3), r.randint(0, 9)),   # the first usage counts
        lambda: "[2025-10-22 10:00:00 TP0] Prefill batch. #new-seq: %d, #new-token: %d, token usage: 0.%02d, "
                "gen throughput (token/s): %d.0, #running-req: %d, #queue-req: %d" % (
                    r.randint(1, 9), r.randint(0, 9999), r.randint(0, 99), r.randint(0, 999), r.randint(0, 64),
                    r.randint(0, 3)),
    ]
    lines = [b"(APIServer pid=1) INFO 05-07 10:00:00 [api_server.py:1] vLLM API server version 0.9.0\n"]
    for _ in range(150):
        shape = r.choice(shapes)
        lines.extend(shape().encode() + b"\n" for _ in range(r.choice([1, 1, 3, 5])))   # runs: a series' rates
    fast, ref = LogAnalyzer(), ReferenceAnalyzer()
    for n, line in enumerate(lines):
        fast.feed(line)
        ref.feed(line)
        assert fast.result() == ref.result(), (n, line)


@pytest.mark.parametrize("eol", [b"\n", b"\r\n"])
def test_frames_left_to_the_c_passes_still_guard_the_quoted_source_after_them(eol: bytes) -> None:
    """Once a frame template is planned, its segments are no longer visited (their only effect is
    "the last frame line"); an indented source line quoting an error right after one, in the same
    feed or the next, must still be read as quoted source."""
    r = random.Random(3)
    head = b"(APIServer pid=1) INFO 05-07 10:00:00 [api_server.py:1] vLLM API server version 0.9.0\n"
    fast, ref = LogAnalyzer(), ReferenceAnalyzer()
    for a in (fast, ref):
        a.feed(head)
    for k in range(12):
        filler = (b"step %d/100 loss=0.5\n" % k if k % 3 else b"") + b"".join(
            b"INFO 05-07 10:00:%02d [x.py:1] nothing to see %d\n" % (r.randint(0, 59), n) for n in range(60))
        frame = b'  File "/src/vllm/worker.py", line %d, in run\n' % r.randint(1, 999)
        # (not a `raise` line: that is source wherever it stands, cause.py rule 1)
        quoted = b'    self._abort("NCCL error: unhandled system error %d")\n' % r.randint(1, 9)
        # the quoted line in the same feed as its frame or in the next one (after a feed with or
        # without other lines to examine), 40 lines after the frame: the edge of "right after"; the
        # last one 41 lines after (the first failure candidate, which would hide later differences)
        gap = b"INFO 05-07 10:00:00 [x.py:1] nothing\n" * (39 if k < 11 else 40)
        for part in ((filler + frame + gap + quoted,) if k % 3 == 1 else (filler + frame, gap + quoted)):
            fast.feed(part.replace(b"\n", eol))
            ref.feed(part.replace(b"\n", eol))
            assert fast.result() == ref.result(), k
    assert fast.result().failure is not None      # the last quoted line counts


def test_signal_digit_lines_are_planned_per_prefilter_families() -> None:
    """Segments of a "signal 0" template are planned per the families their own prefilter finds
    ("signal 9" is an anchor, "signal 1" is not): a plan made for one must not serve the other."""
    head = b"(APIServer pid=1) INFO 05-07 10:00:00 [api_server.py:1] vLLM API server version 0.9.0\n"
    shapes = [b"[%d/9] c++ -c a.cpp: worker received signal %d\n",
              b"Loading weights took %d.5 seconds; worker received signal %d\n",
              b"#12 %d.25 nvcc error   : 'cudafe++' died due to signal %d (Kill signal)\n"]
    for shape in shapes:
        fast, ref = LogAnalyzer(), ReferenceAnalyzer()
        lines = [head] + [shape % (k, sig) for k, sig in enumerate([1, 1, 9, 1, 9, 9, 2], start=1)]
        for line in lines:
            fast.feed(line)
            ref.feed(line)
            assert fast.result() == ref.result(), line


def test_a_run_of_loading_bars_that_fills_then_restarts_completes_the_load() -> None:
    """A run of loading-bar redraws is cut to its last member, but a full member in the middle
    still completes the load (later unlabeled bars are capture); read from the planned bytes."""
    head = b"(APIServer pid=1) INFO 05-07 10:00:00 [api_server.py:1] vLLM API server version 0.9.0\n"
    fast, ref = LogAnalyzer(), ReferenceAnalyzer()
    for a in (fast, ref):
        a.feed(head)
    # (a full bar ends the first runs, so its template is planned before it lies mid-run)
    for k, seq in enumerate([[1, 4], [2, 4], [1, 2], [1, 4, 2], [4, 4], [1, 4, 2], [0, 1], [2, 4, 1], [4, 2]]):
        block = (b"\r".join(("Loading weights: %3d%%|%s| %d/4 [00:0%d<00:01, 1.00it/s]" % (
            d * 25, "\u2588" * d + " " * (4 - d), d, k)).encode() for d in seq)     # blocks: bytes != characters
                 + b"\n 50%%|##  | %d/9 [00:01<00:01, 1.00it/s]\n" % (k + 1)
                 + b"(Worker_TP0 pid=30) INFO 05-07 10:00:00 [m.py:1] Starting to load model /m\n")
        fast.feed(block)
        ref.feed(block)
        assert fast.result() == ref.result(), k


def test_templates_of_small_feeds_are_remembered_once_they_come_back() -> None:
    """A feed small enough to hold each template once (the runner's 64 KiB pieces of a dense log)
    sends them to the one-off batch; one that comes back in a later feed is remembered, else
    every feed would pay the batch again (it ran 10x slower)."""
    r = random.Random(5)
    words = ["alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "theta"]
    block = b"".join(("step %s %s %s: %d items\n" % (r.choice(words), r.choice(words), "".join(
        r.choice("abcdefgh") for _ in range(8)), n)).encode() for n in range(400))
    fast, ref = LogAnalyzer(), ReferenceAnalyzer()
    for k in range(3):
        fast.feed(block)
        ref.feed(block)
        assert fast.result() == ref.result()
        remembered = sum(len(cache) for cache in fast._templates)
        assert (remembered == 0) if k == 0 else (remembered >= 400)


@pytest.mark.parametrize("glued", ["rkerProc pid=65043) ", "[2023-06-07 22:16:00,018] [INFO] [deepspeed] OVERFLOW! Skipping step.",
                                   "ERROR 05-07 10:00:00 [core.py:1] EngineCore failed to start.",
                                   "{'loss': 0.5, 'grad_norm': 1.0, 'learning_rate': 1e-05, 'epoch': 0.3}",
                                   "[2025-10-22 10:00:00 TP0] Capture cuda graph end. Time elapsed: 1.1 s",
                                   "Traceback (most recent call last):", " 50%|#####     | 5/10 [00:01<00:01, 1.00it/s]"])
def test_bars_glued_to_a_record_collapse_only_when_the_record_is_inert(glued: str) -> None:
    """A bar with an inert record glued on is a plain redraw (it joins the runs of its phase's
    bars); one glued to a record that does something is examined, with its record, each time."""
    r = random.Random(glued)
    lines = ["(Worker pid=3) INFO 05-07 10:00:00 [m.py:1] Starting to load model /m",
             "RuntimeError: CUDA error: an illegal memory access"]
    for k in range(60):
        bar = _bar(r, r.choice(["Capturing CUDA graphs (PIECEWISE): ", "Loading safetensors checkpoint shards: "]), 51)
        lines.append(bar + glued if k % 2 else bar)
        if k % 17 == 16:
            lines.append("(APIServer pid=1) INFO:     Application startup complete.")
    data = ("\n".join(lines) + "\n").encode() * 3
    assert templates.classify_template(data.split(b"\n")[3].translate(templates.NORMALIZE), True).kind == (
        templates.K_BAR if glued.startswith(("rker", "[2023")) else templates.K_BAR_GLUED)
    for cuts in ([], sorted(r.randrange(len(data)) for _ in range(25))):
        assert _run(data, cuts, [None] * (len(cuts) + 1), False) == _run(data, cuts, [None] * (len(cuts) + 1), True)


def test_a_stretch_of_loss_dicts_reduces_to_its_last_unless_an_error_waits_on_it() -> None:
    """Loss dicts of many templates (no timestamp, no clock) overwrite each other's hint: only the
    last of a stretch is read — except while an error waits on a hint series, whose advances
    prove the job carried on (each one counts)."""
    r = random.Random(7)
    lines = []
    for k in range(400):
        pick = r.random()
        if pick < 0.75:
            step = f", 'step': {k}" if r.random() < 0.3 else ""
            ts = "INFO 05-07 10:%02d:%02d [x.py:1] " % (k // 60, k % 60) if k // 25 % 3 == 1 else ""   # a clock: rates
            lines.append(ts + "{'loss': %s, 'grad_norm': %s, 'learning_rate': %se-0%d, 'epoch': %s%s}"
                         % (_f(r), r.uniform(0, 200), r.uniform(1, 9), r.randint(5, 6),
                            (k % 7) / 10 if ts else round(k / 97, r.randint(1, 3)), step))   # restarts: series reset
        elif pick < 0.8:
            lines.append("RuntimeError: CUDA error: an illegal memory access")
        elif pick < 0.85:
            lines.append(r.choice(["  Total optimization steps = %d" % _n(r), "  Num Epochs = %d" % r.randint(1, 9),
                                   "(APIServer pid=1) INFO:     Application startup complete.",
                                   "step %d/%d loss=0.5" % (_n(r), _n(r))]))
        elif pick < 0.9:
            lines.append("")
        else:
            lines.append(_bar(r, "Loading weights: ", 50))
    data = ("\n".join(lines) + "\n").encode() * 2
    for cuts in ([], sorted(r.randrange(len(data)) for _ in range(30))):
        for nows in ([None] * (len(cuts) + 1), [1000.0 + 7 * k for k in range(len(cuts) + 1)]):
            assert _run(data, cuts, nows, False) == _run(data, cuts, nows, True)


def test_failure_lines_of_unknown_rank_and_stall_notices_are_skipped_only_when_a_no_op() -> None:
    """A failure line whose rank depends on its digits or on the usage line is skipped only
    once every rank is held (and an error waits on progress); a stall notice only once
    STALL_REPEATS of them are counted. Anything else (a ready mark, progress, a slurm OOM that
    replaces a held host OOM) must still see each of them."""
    r = random.Random(11)
    pool = [
        lambda: "ERROR 05-07 10:00:00 [core.py:1] worker exit code %d" % r.choice([0, 1, 137]),
        lambda: "Process exited with exit code %d" % r.choice([0, 1, 137]),
        lambda: "worker died due to signal %d" % r.choice([9, 11, 6]),
        lambda: "vllm: error: unrecognized arguments: --x%d" % _n(r),
        lambda: "myprog: error: argument --tp: invalid int value: '%d'" % _n(r),
        lambda: "usage: vllm serve [-h]",
        lambda: "Traceback (most recent call last):",
        lambda: "RuntimeError: CUDA error: an illegal memory access",
        lambda: "ValueError: bad value %d" % _n(r),
        lambda: "ERROR 05-07 10:00:00 [core.py:1] EngineCore failed to start.",
        lambda: "(EngineCore_DP0 pid=3) INFO 12-09 11:%02d:53 [shm_broadcast.py:466] No available shared memory "
                "broadcast block found in 60 seconds." % r.randint(10, 59),
        lambda: "step %d/%d loss=0.5" % (r.randint(0, 50), 50),
        lambda: "(APIServer pid=1) INFO:     Application startup complete.",
        lambda: "Killed",
        lambda: "slurmstepd: error: Detected %d oom_kill event in StepId=%d.batch. Some of the step tasks have been "
                "OOM Killed." % (r.randint(1, 3), _n(r)),
        lambda: "collect2: error: ld returned %d exit status" % r.randint(1, 2),
        # a slurm OOM line with a digit-valued word: its rank is not known from its template, and
        # it replaces a held host OOM of its rank, so it is never skipped
        lambda: "slurmstepd: error: Detected %d oom_kill event in StepId=%d.batch. Some of the step tasks have "
                "been OOM Killed; exit code 137" % (r.randint(1, 3), _n(r)),
    ]
    # rounds over every kind, then rounds that hold no SPECIFIC candidate (stall notices count)
    for only in [range(len(pool))] * 4 + [(8, 10, 10, 10, 11, 12)] * 2 + [(13, 16, 11)] * 2:
        weights = [r.random() if k in only else 0 for k in range(len(pool))]
        lines = [r.choices(pool, weights)[0]() for _ in range(300)]
        data = ("\n".join(lines) + "\n").encode() * 2
        for cuts in ([], sorted(r.randrange(len(data)) for _ in range(20))):
            assert _run(data, cuts, [None] * (len(cuts) + 1), False) == _run(data, cuts, [None] * (len(cuts) + 1), True)


@pytest.mark.parametrize("eol", [b"\n", b"\r\n"])
def test_a_stretch_of_timed_build_steps_keeps_the_series_start_of_its_rate(eol: bytes) -> None:
    """Timestamped make/ninja steps (many templates) overwrite each other except for the series'
    start, which the last one's rate is computed from: a restart (done going back, another
    ninja total) inside a stretch moves it. An error waiting on a build series sees each step."""
    r = random.Random(eol)
    lines, clock = ["(APIServer pid=1) INFO 05-07 10:00:00 [api_server.py:1] vLLM API server version 0.9.0"], 10.0

    def stamp() -> str:
        return r.choice([f"{clock:.2f} ", f"#{r.randint(1, 20)} {clock:.2f} ",
                         "[10:%02d:%02d] " % (int(clock) // 60 % 60, int(clock) % 60)])

    for _ in range(120):
        pick = r.random()
        n = r.randint(1, 12)
        if pick < 0.35:                                 # make steps, mostly rising, sometimes restarting
            pct = r.randint(0, 60)
            for _ in range(n):
                clock += r.uniform(0.01, 3)
                pct = r.randint(0, 20) if r.random() < 0.1 else min(100, pct + r.randint(0, 5))
                kind = r.choice(["Building CXX object k%d.o" % _n(r), "Building CUDA object k%d.o" % _n(r),
                                 "Built target t%d" % _n(r), "Linking CXX shared library libk.so"])
                lines.append(stamp() + f"[{pct:3d}%] {kind}")
        elif pick < 0.65:                               # ninja steps of one or two totals
            totals = r.choice([[40], [40, 300]])
            done = {t: r.randint(1, 10) for t in totals}
            for _ in range(n):
                clock += r.uniform(0.01, 3)
                t = r.choice(totals)
                done[t] = r.randint(1, 5) if r.random() < 0.1 else min(t, done[t] + r.randint(0, 3))
                lines.append(stamp() + f"[{done[t]}/{t}] c++ -c a{_n(r)}.cpp")
        elif pick < 0.8:
            lines.append(r.choice(["c++: fatal error: Killed signal terminated program cc1plus",
                                   "ERROR 05-07 10:00:00 [core.py:1] EngineCore failed to start.",
                                   "RuntimeError: CUDA error: an illegal memory access",
                                   "(APIServer pid=1) INFO:     Application startup complete."]))
        elif pick < 0.9:
            lines.append(_bar(r, "Loading weights: ", 9))
        else:
            lines.append(r.choice(["", "-- Configuring done", "[2025-10-22 10:00:00 TP0] Load weight begin. avail mem=7.1 GB"]))
    data = eol.join(line.encode() for line in lines) * 2 + eol
    for cuts in ([], sorted(r.randrange(len(data)) for _ in range(30))):
        assert _run(data, cuts, [None] * (len(cuts) + 1), False) == _run(data, cuts, [None] * (len(cuts) + 1), True)
    # an error logged mid-build waits on the build's series: each later step is an advance (3 recover)
    block = eol.join(b"%d.5 [%3d%%] Building CXX object k%d.o" % (10 + k, k, k) for k in range(1, 6)) + eol
    block += b"c++: fatal error: Killed signal terminated program cc1plus" + eol
    block += eol.join(b"%d.5 [%3d%%] Building CXX object k%d.o" % (20 + k, 10 + k, k) for k in range(1, 12)) + eol
    engine = b"(APIServer pid=1) INFO 05-07 10:00:00 [api_server.py:1] vLLM API server version 0.9.0" + eol
    data = engine + block * 2 + b"-- Configuring done" + eol + block
    cuts = [len(engine) + len(block) * 2]
    fast = _run(data, cuts, [None, None], False)
    assert fast == _run(data, cuts, [None, None], True)
    assert fast[0][1].failure is None and "error_recovered" in [w.code for w in fast[0][1].warnings]


@pytest.mark.parametrize("eol", ["\n", "\r\n"])
def test_driver_lines_are_skipped_only_while_a_specific_failure_is_held(eol: str) -> None:
    """NVRM lines join the driver window that a later fault line's message walks back over
    (consecutive lines): skipped only while a SPECIFIC candidate is held, since the recovery
    that clears it takes a line of its own — not where a \\r puts it on an NVRM line's line."""
    r = random.Random(eol)
    plain = [lambda: "[ %d.%06d] NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  570.158.01" % (_n(r), _n(r)),
             lambda: "NVRM: GPU at PCI:0000:%02x:00: GPU-%d" % (r.randint(0, 255), _n(r)),
             lambda: "[ %d.5] NVRM: The NVIDIA GPU 0000:%02x:00.0" % (_n(r), r.randint(0, 255)),
             lambda: "               NVRM: (PCI ID: 10de:26b5) installed in this system has"]
    fault = [lambda: "               NVRM: fallen off the bus and is not responding to commands.",
             lambda: "[ %d.5] NVRM: Xid (PCI:0000:%02x:00): %d, pid=1, name=python" % (_n(r), r.randint(0, 255),
                                                                                    r.choice([13, 31, 79, 94]))]
    other = [lambda: "ValueError: bad value %d" % _n(r), lambda: "RuntimeError: CUDA error: an illegal memory access",
             lambda: "(APIServer pid=1) INFO:     Application startup complete.",
             lambda: "step %d/%d loss=0.5" % (r.randint(0, 50), 50), lambda: "Killed",
             lambda: '  File "/a/b.py", line %d, in f' % _n(r)]
    lines = ["(APIServer pid=1) INFO 05-07 10:00:00 [api_server.py:1] vLLM API server version 0.9.0"]
    for _ in range(300):
        pick = r.random()
        if pick < 0.45:                                   # a chain of driver lines
            lines += [r.choice(plain + fault)() for _ in range(r.randint(1, 7))]
        elif pick < 0.5:                                  # a recovery on a driver line's line (\r)
            lines.append(r.choice(plain)() + "\r" + "(APIServer pid=1) INFO:     Application startup complete.")
        else:
            lines.append(r.choice(other)())
    lines += ["RuntimeError: CUDA error: an illegal memory access",      # held, then recovered on a driver line's line
              "[ 1843.5] NVRM: The NVIDIA GPU 0000:b3:00.0\r(APIServer pid=1) INFO:     Application startup complete.",
              "[ 1843.6] NVRM: fallen off the bus and is not responding to commands."] * 3
    data = (eol.join(lines) + eol).encode() * 2
    for cuts in ([], sorted(r.randrange(len(data)) for _ in range(20))):
        assert _run(data, cuts, [None] * (len(cuts) + 1), False) == _run(data, cuts, [None] * (len(cuts) + 1), True)


def test_a_stretch_of_step_records_keeps_the_series_start_and_each_source() -> None:
    """Step/epoch records of many templates (nemo's 'epoch=0 step=260 loss=…' with a timestamp)
    reduce to their last when all report one source: the series' start (rates, restarts, an
    unparsable date) is kept; mixed bar/hint stretches are read one by one; an error waiting on a
    training series sees each record."""
    r = random.Random(3)
    lines = ["(APIServer pid=1) INFO 05-07 10:00:00 [api_server.py:1] vLLM API server version 0.9.0"]
    for _ in range(150):
        pick = r.random()
        n = r.randint(1, 9)
        if pick < 0.6:
            step, epoch = r.randint(0, 50), r.randint(0, 2)
            shapes = r.choice([[0], [1], [2], [3], [0, 1], [0, 2], [2, 3]])   # one source, or mixed
            for _ in range(n):
                step = r.randint(0, 9) if r.random() < 0.1 else step + r.randint(0, 20)
                month = r.choice(["07"] * 9 + ["13"])             # 13: no date, no rate
                stamp = "2026-%s-26 19:%02d:%02d | INFO | train | " % (month, r.randint(0, 59), r.randint(0, 59))
                body = ["epoch=%d step=%d loss=%.4f acc=0.%d" % (epoch, step, r.uniform(0, 3), _n(r)),
                        "epoch=%d step=%d loss=%.4f" % (epoch, step, r.uniform(0, 3)),
                        "step %d/%d loss=%.3f" % (step, r.choice([500, 1000]), r.uniform(0, 3)),
                        # the finer count after the epoch is the step; not a rank's
                        "epoch %d/3 | %s %d/%d | loss %.4f" % (epoch, r.choice(["batch", "batch", "rank"]), step,
                                                             r.choice([40, 1563]), r.uniform(0, 3))][r.choice(shapes)]
                lines.append(r.choice([stamp, stamp, stamp, ""]) + body)
        elif pick < 0.7:
            lines.append(r.choice(["  Total optimization steps = %d" % r.choice([500, 1000]), "  Num Epochs = 3"]))
        elif pick < 0.85:
            lines.append(r.choice(["RuntimeError: CUDA error: an illegal memory access", "ValueError: bad value %d" % _n(r),
                                   "(APIServer pid=1) INFO:     Application startup complete."]))
        else:
            lines.append(r.choice(["", "-- Configuring done", _bar(r, "Loading weights: ", 50)]))
    data = ("\n".join(lines) + "\n").encode() * 2
    for cuts in ([], sorted(r.randrange(len(data)) for _ in range(400))):   # a rate shows only at a cut
        assert _run(data, cuts, [None] * (len(cuts) + 1), False) == _run(data, cuts, [None] * (len(cuts) + 1), True)


def test_a_stretch_of_planned_markers_of_many_templates_folds_every_member() -> None:
    """Planned phase markers of any templates form one group: the fold must read every member
    (a middle 'loaded' leaves load_done, which makes a later unlabeled bar a capture bar)."""
    r = random.Random(5)
    pool = ["[2025-10-22 10:00:0{k} TP{k}] Load weight begin. avail mem={w}.1 GB",
            "INFO 05-07 10:00:0{k} [loader.py:1] Loading weights took {w}.5 seconds",
            "INFO 05-07 10:00:0{k} [monitor.py:1] torch.compile takes {w}.5 s in total",
            "[2025-10-22 10:00:0{k} TP{k}] Capture cuda graph end. Time elapsed: {w}.1 s",
            "[2025-10-22 10:00:0{k} TP{k}] Capture cuda graph begin. This can take up to several minutes.",
            "***** Running training *****", "-- The CXX compiler identification is GNU 11.4.{w}",
            "(APIServer pid=1{w}) INFO:     Started server process [1{w}]"]
    lines = ["(APIServer pid=1) INFO 05-07 10:00:00 [api_server.py:1] vLLM API server version 0.9.0"]
    for _ in range(120):
        for _ in range(r.randint(1, 6)):
            lines.append(r.choice(pool).format(k=r.randint(0, 9), w=r.choice([1, 12, 123, 1234])))
        lines.append(r.choice([_bar(r, "", 20), "", "ValueError: bad value %d" % _n(r),
                               "(APIServer pid=1) INFO:     Application startup complete."]))
    data = ("\n".join(lines) + "\n").encode() * 3
    for cuts in ([], sorted(r.randrange(len(data)) for _ in range(300))):
        assert _run(data, cuts, [None] * (len(cuts) + 1), False) == _run(data, cuts, [None] * (len(cuts) + 1), True)


def test_a_run_of_named_bars_met_at_once_by_another_named_run_is_overwritten() -> None:
    """A pending run of named bars followed directly by a run of another named phase is not read
    (the new run overwrites what it leaves) — not when the new run is unlabeled (its phase is read
    from the state the pending run leaves); errors (progress waiting on them) and hints between."""
    r = random.Random(11)
    labels = ["Capturing CUDA graphs: ", "Loading safetensors checkpoint shards: ", "Training: ",
              "Compiling kernels: ", ""]
    lines = ["(APIServer pid=1) INFO 05-07 10:00:00 [api_server.py:1] vLLM API server version 0.9.0"]
    for k in range(300):
        label = r.choice(labels)
        total = r.choice([4, 20, 50])
        lines += [_bar(r, label, total) for _ in range(r.randint(1, 4))]
        pick = r.random()
        if pick < 0.08:
            lines.append(r.choice(["RuntimeError: CUDA error: an illegal memory access", "ValueError: bad value %d" % _n(r)]))
        elif pick < 0.14:
            lines.append("{'loss': %s, 'grad_norm': 1.5, 'learning_rate': 2e-05, 'epoch': %s}" % (_f(r), k / 50))
        elif pick < 0.18:
            lines.append(r.choice(["(APIServer pid=1) INFO:     Application startup complete.",
                                   "INFO 05-07 10:00:0%d [loader.py:1] Loading weights took 1.5 seconds" % (k % 10)]))
    data = ("\n".join(lines) + "\n").encode() * 2
    for cuts in ([], sorted(r.randrange(len(data)) for _ in range(200))):
        for nows in ([None] * (len(cuts) + 1), [1000.0 + 7 * k for k in range(len(cuts) + 1)]):
            assert _run(data, cuts, nows, False) == _run(data, cuts, nows, True)


@pytest.mark.parametrize("glued", ["", " [rank0]: x"])
def test_a_planned_capture_bar_that_fills_ends_the_capture(glued: str) -> None:
    """A full bar whose label names capture moves the phase to starting, read through its plan too
    (State._tqdm_planned has _bar inline) — alone, at the end of a run, and with a record glued on."""
    head = "(APIServer pid=1) INFO 05-07 10:00:00 [api_server.py:1] vLLM API server version 0.9.0\n"
    # (the last capture bar vLLM V1 draws: a full PIECEWISE one leaves its FULL one to come)
    bar = "Capturing CUDA graphs (decode, FULL): {p:3d}%|#         | {n}/51 [00:0{k}<00:09, 5.{k}it/s]" + glued + "\n"
    loss = "{{'loss': 0.{k}, 'grad_norm': 1.0, 'learning_rate': 1e-05, 'epoch': 0.{k}}}\n"
    for last in ([51], [17, 51], [51, 17]):
        lines = [head]
        for k in range(5):                    # the full bar's template examined, then planned (a hint between)
            lines += [bar.format(p=100, n=51, k=k), loss.format(k=k)]
        lines += [bar.format(p=n * 100 // 51, n=n, k=7) for n in last]
        data = "".join(lines).encode()
        fast, ref = _run(data, [], [None], False), _run(data, [], [None], True)
        assert fast == ref
        assert ref[-1][1].phase == ("starting" if last[-1] == 51 else "capturing")


@pytest.mark.parametrize("now", [None, 1000.0])
def test_a_planned_loading_bar_that_fills_completes_the_load(now) -> None:
    """A full loading bar read through its plan completes the load (State._tqdm_planned has _bar
    inline): an unlabeled bar after it is then the capture — with a clock each bar is read."""
    head = "[2025-10-22 10:00:00 TP0] SGLang server args: tp_size=1\n"
    bar = "Loading safetensors checkpoint shards: {p:3d}% Completed | {n}/9 [00:0{k}<00:00,  1.{k}it/s]{glued}\n"
    begin = "[2025-10-22 10:00:0{k} TP0] Load weight begin. avail mem=7{k}.1 GB\n"   # the load starts again
    unlabeled = " 10%|#         | 5/50 [00:01<00:09, 5.00it/s]\n"
    for glued in ("", " [rank0]: x"):
        for n in (9, 4):
            lines = [head]
            for k in range(5):                # the bar's template examined, then planned (a new load between)
                lines += [begin.format(k=k), bar.format(p=n * 100 // 9, n=n, k=k, glued=glued)]
            lines += [begin.format(k=7), bar.format(p=n * 100 // 9, n=n, k=7, glued=glued), unlabeled]
            data = "".join(lines).encode()
            fast, ref = _run(data, [], [now], False), _run(data, [], [now], True)
            assert fast == ref
            assert ref[-1][1].phase == ("capturing" if n == 9 else "loading")


@pytest.mark.parametrize("rem", ["00:0{k}", "00:", ":", "?"])
def test_a_planned_bar_reads_its_remaining_time_as_in_full(rem: str) -> None:
    """A planned bar keeps its remaining time's text, read when a result is made, only where clock()
    reads it for sure (the template says: an empty part fails on it as on every segment); else the
    eta comes from the rate at once, as in full. Labels with digits are read from each segment."""
    lines = ["(APIServer pid=1) INFO 05-07 10:00:00 [api_server.py:1] vLLM API server version 0.9.0"]
    for k in range(1, 9):
        lines.append(f"Capturing batches (bs={k} avail_mem={k}.5 GB): {k * 10:3d}%|#         | {k}/10 "
                     f"[00:0{k}<{rem.format(k=k)}, {k}.00it/s]")
    data = ("\n".join(lines) + "\n").encode()
    for nows in ([None], [1000.0]):            # with a clock, every bar is read (and planned from the second)
        fast, ref = _run(data, [], nows, False), _run(data, [], nows, True)
        assert fast == ref
        assert ref[-1][1].progress.eta_s is not None and ref[-1][1].progress.label == "Capturing batches (bs=8 avail_mem=8.5 GB)"


def test_a_run_of_bars_collapses_while_an_error_waits_on_another_series_of_their_phase() -> None:
    """An error waits on the progress of one loading series (label and total): a run of loading bars
    of the same label but another total cannot advance it, so it reduces to its last member; one of
    the same series is read bar by bar (each advance counts towards the error's recovery)."""
    head = "(APIServer pid=1) INFO 05-07 10:00:00 [api_server.py:1] vLLM API server version 0.9.0\n"
    bar = "Loading safetensors checkpoint shards: {p:3d}% Completed | {n}/{t} [00:0{k}<00:09,  1.{k}it/s]\n"
    error = "ValueError: bad shard index\n"      # a candidate: the progress before it waits for advances
    for total, read in ((49, [22, 25]), (17, [22, 23, 24, 25])):
        lines = [head]
        for k in range(3):                    # the templates planned (their labels, their totals' bytes)
            lines += [bar.format(p=n * 100 // 17, n=n, t=17, k=k) for n in (12, 13)] + [error]
            lines += [bar.format(p=n * 100 // total, n=n, t=total, k=k) for n in (14, 15)]
            lines += ["(APIServer pid=1) INFO:     Application startup complete.\n"]
        lines += [bar.format(p=n * 100 // 17, n=n, t=17, k=9) for n in (12, 13)] + [error]
        lines += [bar.format(p=n * 100 // total, n=n, t=total, k=9) for n in (14, 15, 16)]
        data = "".join(lines).encode()
        fast, ref = LogAnalyzer(), ReferenceAnalyzer()
        seen: list[int] = []
        cut = data.rindex(error.encode())
        fast.feed(data[:cut])
        apply_plan = fast._state._apply_plan
        fast._state._apply_plan = lambda text, line, plan: (seen.append(line), apply_plan(text, line, plan))
        fast.feed(data[cut:])
        ref.feed(data)
        assert fast.result() == ref.result()
        assert seen == read                   # the error line, then the bars read


def test_a_kv_unsafe_run_is_applied_at_once_only_when_its_last_line_raises_the_pressure() -> None:
    """A run of stats lines that may raise kv_cache_pressure is applied like a KV-safe one (its last
    numbers, the spec window) when its last line raises the warning itself; else line by line, as
    the warning keeps the line of the last line that raised it."""
    stats = ("(APIServer pid=1) INFO 05-07 10:00:{s:02d} [loggers.py:1] Engine 000: Avg prompt throughput: {p}.0 tokens/s, "
             "Avg generation throughput: 9{k}.5 tokens/s, Running: 1{k} reqs, Waiting: {w} reqs, {pre}GPU KV cache usage: "
             "{kv}%, Prefix cache hit rate: 1.0%")
    spec = ("(APIServer pid=1) INFO 05-07 10:00:{s:02d} [metrics.py:1] SpecDecoding metrics: Mean acceptance length: "
            "{a}, Accepted: 7 tokens, Drafted: 9 tokens, Avg Draft acceptance rate: 3.{k}%")
    lines = ["(APIServer pid=1) INFO 05-07 10:00:00 [api_server.py:1] vLLM API server version 0.9.0"]
    r = random.Random(5)
    runs = []
    for k in range(40):
        run = []
        for _ in range(r.randint(1, 5)):
            run.append(stats.format(s=k % 60, p=r.randint(1, 9), k=k % 10, w=r.choice([0, 3, 12]),
                                    kv=r.choice(["50.0", "94.9", "95.0", "96.1", "99.9", "12.5"]),
                                    pre=r.choice(["", "", "", "Preemptions: 4, ", "Preemptions: 17, "])))
            if r.random() < 0.3:
                run.append(spec.format(s=k % 60, a=r.choice(["1.01", "2.50"]), k=k % 10))
        runs.append(run)
    for run in runs:
        lines += run + ["(APIServer pid=1) INFO:     Application startup complete."]
    # the last line raises or not (by its KV use and waiting requests, or by its preemptions: V1 0.10+)
    for pairs in ([], [("96.1", 3, ""), ("99.9", 0, "")], [("96.1", 3, ""), ("50.0", 3, "")],
                  [("50.0", 3, ""), ("96.1", 12, "")], [("96.1", 3, ""), ("50.0", 0, "Preemptions: 2, ")],
                  [("50.0", 0, "Preemptions: 2, "), ("60.0", 0, "")]):
        last = [stats.format(s=0, p=1, k=0, w=w, kv=kv, pre=pre) for kv, w, pre in pairs]
        data = ("\n".join(lines + last) + "\n").encode()
        for cuts in ([], sorted(r.randrange(len(data)) for _ in range(30))):
            assert _run(data, cuts, [None] * (len(cuts) + 1), False) == _run(data, cuts, [None] * (len(cuts) + 1), True)


def test_a_request_errors_traceback_ends_on_its_exception_unless_chained_in_both_scanners() -> None:
    """cause.py rule 6: the traceback a request-error line announces is the request's up to its exception
    line, and on through a chain's joint; an engine's traceback after it, within 40 lines, is the run's."""
    asgi = [b"ERROR:    Exception in ASGI application", b"Traceback (most recent call last):",
            b'  File "/venv/lib/python3.10/site-packages/h11/_writers.py", line 86, in send_data',
            b"h11._util.LocalProtocolError: Too much data for declared Content-Length"]
    chain = [b"", b"The above exception was the direct cause of the following exception:", b"",
             b"Traceback (most recent call last):",
             b'  File "/venv/lib/python3.10/site-packages/starlette/middleware/errors.py", line 165, in __call__',
             b"RuntimeError: response already started"]
    engine = [b"ERROR 07-31 14:54:38 async_llm_engine.py:55] Engine background task failed",
              b"ERROR 07-31 14:54:38 async_llm_engine.py:55] Traceback (most recent call last):",
              b'ERROR 07-31 14:54:38 async_llm_engine.py:55]   File "/venv/vllm/lora/models.py", line 412, in _create',
              b"ERROR 07-31 14:54:38 async_llm_engine.py:55] TypeError: 'NoneType' object does not support item assignment"]
    serving = [b"INFO 07-31 14:52:10 metrics.py:396] Avg prompt throughput: 812.4 tokens/s, Avg generation "
               b"throughput: 402.3 tokens/s, Running: 14 reqs, Swapped: 0 reqs, Pending: 0 reqs, GPU KV cache usage: 9.1%"]
    for body, failed in ((asgi + chain, False), (asgi + engine, True), (asgi + chain + engine, True)):
        data = b"\n".join((serving + body) * 2 + serving + body) + b"\n"     # the templates planned at last
        ref = _run(data, [], [None], True)
        assert _run(data, [], [None], False) == ref
        got = ref[-1][1]
        assert "request_error" in {w.code for w in got.warnings}
        assert (got.failure is not None) == failed, got.failure
        if failed:
            assert got.failure.message.startswith("TypeError")


def test_sglangs_warmup_prefill_proves_no_serving_in_either_scanner() -> None:
    """While SGLang warms up (uvicorn up, no `fired up`), a Prefill batch line is its warmup request's: no
    ready mark; a Decode batch line, or `fired up`, is the server serving. Runs of each kind, planned."""
    head = [b"[2025-09-14 08:10:01] server_args=ServerArgs(model_path='Qwen/Qwen3-32B', tp_size=4)",
            b"[2025-09-14 08:10:47] INFO:     Application startup complete."]
    prefill = b"[2025-09-14 08:10:48 TP0] Prefill batch. #new-seq: 1, #new-token: %d, #cached-token: 0, token usage: 0.00, " \
              b"#running-req: 0, #queue-req: 0"
    decode = b"[2025-09-14 08:10:49 TP0] Decode batch. #running-req: 1, #token: %d, token usage: 0.00, gen throughput " \
             b"(token/s): 9.10, #queue-req: 0"
    r = random.Random(11)
    for tail in ([], [decode], [b"[2025-09-14 08:10:50] The server is fired up and ready to roll!"]):
        lines = []
        for _ in range(6):
            lines += head + [prefill % r.randint(5, 99) for _ in range(r.randint(1, 4))] + tail
        data = b"\n".join(lines) + b"\n"
        ref = _run(data, [], [None], True)
        assert _run(data, [], [None], False) == ref
        for cuts in (sorted(r.randrange(len(data)) for _ in range(20)),):
            assert _run(data, cuts, [None] * (len(cuts) + 1), False) == _run(data, cuts, [None] * (len(cuts) + 1), True)
        assert ref[-1][1].phase == ("starting" if not tail else "ready")


def test_an_engines_self_kill_while_a_cause_is_held_still_notes_its_line() -> None:
    """The self-kill announcement notes its line even while a specific cause is held (State._candidate),
    so a SIGKILL within SELF_KILL_LINES after it, past a recovery that dropped that cause, is the
    engine's own: the fast scanner must not skip it as a held candidate's (hypothesis found it)."""
    lines = [b"(APIServer pid=1) INFO 05-07 10:00:00 [api_server.py:1] vLLM API server version 0.9.0",
             b"[2026-05-02 10:06:01 TP1] Scheduler watchdog timeout (self.watchdog_timeout=300, self.soft=False)",
             b"CRITICAL 05-07 10:00:00 [core_client.py:359] Got fatal signal from worker processes, shutting down. "
             b"See stack trace above for root cause issue.",
             b"(APIServer pid=17) INFO:     Application startup complete.",
             b"ERROR 05-07 10:00:00 [core.py:1] EngineCore failed to start.",
             b"bash: line 1:  4096 Killed                  sleep 0.2"]
    data = b"\n".join(lines * 3) + b"\n"            # the second time round, the templates are planned
    ref = _run(data, [], [None], True)
    assert _run(data, [], [None], False) == ref
    assert ref[-1][1].failure.cause == "exception"   # the Killed was the engine's own: the umbrella decides


def test_a_line_of_glued_bars_is_read_bar_by_bar_by_both_scanners() -> None:
    """Redraws glued into one line (a paste that lost their \\r), with a record glued after the last or
    not: every bar is read in order, the planned way as the exhaustive one, however many there are."""
    head = (b"(EngineCore_DP0 pid=7) INFO 05-07 10:00:00 [core.py:1] vLLM API server version 0.11.0\n"
            b"(EngineCore_DP0 pid=7) INFO 05-07 10:00:01 [gpu_model_runner.py:1] Model loading took 9.1 GiB\n")
    bar = "Capturing CUDA graphs (decode, FULL): {p:3d}%|{b:<10}| {n}/67 [00:0{s}<00:1{s},  5.2{s}it/s]"
    tails = (b"", b"(EngineCore_DP0 pid=7) INFO 05-07 10:00:09 [gpu_model_runner.py:2] Graph capturing finished in 9 secs",
             b"RuntimeError: CUDA error: out of memory")
    for count in (1, 3, 4, 5, 9, 40):
        glued = "".join(bar.format(p=n * 100 // 67, b="#" * (n * 10 // 67), n=n, s=n % 10)
                        for n in range(1, count + 1)).encode()
        for tail in tails:
            data = head + glued + tail + b"\n" + head      # the template seen twice: the second time planned
            ref = _run(data, [], [None], True)
            assert _run(data, [], [None], False) == ref
            if not tail:
                assert ref[-1][1].progress.done == count


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"])
def test_a_line_cut_between_feeds_is_read_whole_and_once(eol: bytes, monkeypatch) -> None:
    """The segment a big feed's tail began is read on its own (tail and the feed's first piece), and
    the feed's scan leaves that piece alone: read by itself, a bar's piece would name another label."""
    monkeypatch.setattr(scanner, "SPLIT_FEED", 1)     # every feed counts as big
    head = b"(APIServer pid=1) INFO 05-07 10:00:00 [api_server.py:1] vLLM API server version 0.9.0" + eol
    bar = b"Loading safetensors checkpoint shards:  %d%% Completed | %d/9 [00:01<00:02,  1.50it/s]"
    data = head * 3 + b"".join(bar % (n * 100 // 9, n) + eol for n in (2, 3, 4))
    at = data.rindex(b"tensors checkpoint")
    for cuts in ([at], [at, at + 5], [len(head) * 3 + 3, at], [at - 1], [at, len(data) - 1]):
        fast, ref = _run(data, cuts, [None] * (len(cuts) + 1), False), _run(data, cuts, [None] * (len(cuts) + 1), True)
        assert fast == ref
        assert fast[-1][1].progress.label == "Loading safetensors checkpoint shards"


def _ts_in_full(kind: str, raw: str):
    """patterns._parse_ts before its per-minute memo: every timestamp converted in full."""
    from datetime import datetime
    try:
        if kind in ("ts1", "ts4"):
            return datetime(int(raw[0:4]), int(raw[5:7]), int(raw[8:10]), int(raw[11:13]), int(raw[14:16]),
                            int(raw[17:19])).timestamp()
        return datetime(2000, int(raw[0:2]), int(raw[3:5]), int(raw[6:8]), int(raw[9:11]),
                        int(raw[12:14])).timestamp()
    except ValueError:
        return None


@pytest.mark.parametrize("zone", ["UTC", "America/New_York", "Africa/Monrovia"])
def test_timestamps_through_the_minute_memo_equal_a_full_conversion(zone: str, monkeypatch) -> None:
    """Prefix timestamps are converted once a minute (local time: DST gaps and folds, Monrovia's
    1972 change of 44 min 30 s within a minute) and stay equal to a full conversion, also for
    seconds or fields datetime() refuses."""
    import time
    if zone != "UTC" and not Path("/usr/share/zoneinfo", zone).exists():
        pytest.skip("no tz database")
    monkeypatch.setenv("TZ", zone)
    time.tzset()
    try:
        patterns._MINUTES_YMD.clear()
        patterns._MINUTES_MD.clear()
        r = random.Random(3)
        days = ["1972-01-06 23", "1972-01-07 00", "2024-03-10 02", "2024-03-10 01", "2024-11-03 01",
                "2024-11-03 02", "2025-10-22 10", "2023-02-29 10", "2025-13-01 10", "2025-1x-01 10"]
        for _ in range(3000):
            day = r.choice(days)
            minute, second = r.choice(["00", "44", "45", "59", "6x", "30", " 5"]), r.choice(
                ["00", "29", "30", "31", "59", "60", "-1", "+5", " 7", "x", ""])
            for kind, raw in (("ts1", f"{day}:{minute}:{second}"), ("ts4", f"{day}:{minute}:{second},123"),
                              ("ts3", f"{day[5:]}:{minute}:{second}"), ("ts1", f"{day[5:]}:{minute}")):
                assert patterns._parse_ts(kind, raw) == _ts_in_full(kind, raw), (zone, kind, raw)
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
        patterns._MINUTES_YMD.clear()
        patterns._MINUTES_MD.clear()


def test_signal_digit_lines_whose_candidate_changes_nothing_are_skipped_only_then() -> None:
    """A "signal 9" segment whose plan (per its prefilter families) is a candidate of a bound rank
    is skipped while a candidate of that rank or more is held, and read otherwise (before any
    error, after a recovery, under a weaker held candidate)."""
    r = random.Random(13)
    head = "(APIServer pid=1) INFO 05-07 10:00:00 [api_server.py:1] vLLM API server version 0.9.0"
    lines = [head]
    for k in range(400):
        pick = r.random()
        if pick < 0.3:
            lines.append(r.choice(["#12 %d.25 nvcc error   : 'cudafe++' died due to signal %d (Kill signal)",
                                   "[%d/9] c++ -c a.cpp: worker received signal %d",
                                   "c++: fatal error: Killed signal terminated program cc1plus %d %d"])
                         % (k, r.choice([9, 9, 1, 15])))
        elif pick < 0.45:
            lines.append(r.choice(["RuntimeError: CUDA error: an illegal memory access", "ValueError: bad value %d" % k,
                                   "WARNING: something odd %d" % k, "torch.OutOfMemoryError: CUDA out of memory.",
                                   "Killed", "ERROR: process exited with exit code %d" % r.choice([1, 137])]))
        elif pick < 0.75:
            lines.append("[%d/%d] Building CXX object x%d.o" % (k % 50 + 1, 50, k))
        elif pick < 0.85:
            lines.append("(APIServer pid=1) INFO:     Application startup complete.")
        else:
            lines.append("")
    data = ("\n".join(lines) + "\n").encode() * 2
    for cuts in ([], sorted(r.randrange(len(data)) for _ in range(200))):
        assert _run(data, cuts, [None] * (len(cuts) + 1), False) == _run(data, cuts, [None] * (len(cuts) + 1), True)


def test_the_state_keeps_every_attribute_in_a_slot() -> None:
    """State's attributes are slots (past 30, an instance's attributes go through a dict of its own):
    one added without a slot lands in the instance's __dict__ and fails this."""
    blob = b"".join(p.read_bytes().rstrip(b"\n") + b"\n" for p in sorted(FIXTURES.glob("*.log")))
    fast = LogAnalyzer()
    fast.feed(blob * 2)
    fast.finish()
    fast.result()
    assert vars(fast._state) == {}
