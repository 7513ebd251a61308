"""The next release's logs: new words, wrappers' prefixes, envelopes and the generic layer beneath the table."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpudeck.jobs.logs.analyze import LogAnalyzer, analyze_bytes
from gpudeck.jobs.logs.analyze import generic
from gpudeck.jobs.logs.analyze.patterns import strip_prefixes

FIXTURES = Path(__file__).parent / "fixtures" / "logs"

# What a wrapper may put before every line: none, an IDE's CMake runner, docker compose, a pasted
# compose line, kubectl --prefix (both shapes), a viewer's line numbers, journald, torchrun --tee
# (glued to the line), pdsh / clush (a host name), srun --label (a task number), kubelet's CRI
# log and journalctl's other timestamp formats, a quoted paste's `> `.
WRAPPERS = ["", "[build] ", "web-1  | ", "  | ", "pod/vllm-7f9c ", "[pod/vllm-7f9c/main] ", "  12 | ", "[1830] ",
            "Dec  1 10:00:01 gpu-box python3[4242]: ", "[default0]:", "node-3: ", "0: ",
            # kubelet's CRI log (/var/log/pods), journalctl -o short-iso / short-precise / short-full
            "2026-12-03T14:00:01.123456789Z stdout F ", "2026-12-03T14:00:01+0000 gpu-box python3[4242]: ",
            "Dec 03 14:00:01.123456 gpu-box python3[4242]: ", "Thu 2026-12-03 14:00:01 UTC gpu-box python3[4242]: ",
            # a quoted paste (markdown, e-mail), alone and around a compose line
            "> ", "> web-1  | "]

# fixture -> (phase, cause, root-cause line, progress (done, total) or None, engine)
FRESH = {
    "sglang_2026_pp_watchdog_timeout.log": ("failed", "hang", 7, None, "sglang"),
    "build_ide_runner_prefixed_ninja.log": ("building", None, None, (47, 230), None),
    "pip_wheel_envelope_cmake_error.log": ("failed", "build_failed", 12, None, None),
    "setup_py_calledprocess_ninja.log": ("failed", "build_failed", 11, None, None),
    "datagen_processing_shard_counter.log": ("loading", None, None, (3, 8), None),
    "launcher_exit_code_137.log": ("failed", "host_oom", 6, (2, 8), None),
    "pipeline_returncode_minus9.log": ("failed", "host_oom", 4, (1, 3), None),
    "supervisor_exit_status_137.log": ("failed", "host_oom", 3, None, None),
    # vLLM offline inference (LLM.generate): its bars name the engine, and it is answering prompts
    "vllm_offline_generate_bars.log": ("ready", None, None, (450, 1000), "vllm"),
    # srun's daemons not answering: the node's (the cluster's) trouble
    "slurm_srun_socket_timeout.log": ("failed", "node_fail", 5, (120, 900), None),
    # NCCL passing on a CUDA failure: the CUDA error it names (`Last error:`) is the cause
    "nccl_unhandled_cuda_error_oom.log": ("failed", "cuda_oom", 9, None, None),
    "nccl_cuda_failure_peer_access.log": ("failed", "cuda_error", 11, None, None),
    # requests' ReadTimeout: a type ending in Timeout is a traceback's final exception
    "hf_hub_read_timeout.log": ("failed", "exception", 9, None, "sglang"),
    # an SGLang subprocess SIGKILLed: multiprocessing's -9, and waitpid's raw status 9 in its SIGCHLD handler
    "sglang_scheduler_terminated_minus9.log": ("failed", "host_oom", 4, None, "sglang"),
    "sglang_sigchld_exitcode_9.log": ("failed", "host_oom", 4, None, "sglang"),
    # docker's json-file log (/var/lib/docker/containers/*/*-json.log): JSON-escaped records, read as their text
    "docker_json_file_vllm_syntax_error.log": ("failed", "syntax_error", 10, (2, 4), "vllm"),
    # an optional probe's traceback logged before any progress, then the build's steps: it carried on
    "build_probe_traceback_then_steps.log": ("building", None, None, (5, 40), None),
    # an optional import's traceback, then the engine goes on to load the model: it carried on
    "vllm_optional_import_traceback_then_load.log": ("loading", None, None, None, "vllm"),
    # a traceback captured with tabs: its quoted `raise RuntimeError(f"NCCL error: …")` is source, not the error
    "vllm_traceback_tab_indented.log": ("failed", "nccl", 7, None, "vllm"),
    # vLLM's header under a logging config of its own: a full date, or no time at all
    "vllm_logging_config_full_dates.log": ("failed", "exception", 8, None, "vllm"),
    "vllm_logging_config_no_time.log": ("failed", "exception", 8, None, "vllm"),
    # the engine known by its logger header alone: behind stacked wrappers too (`> web-1  | `)
    "vllm_v0_worker_died_then_watchdog.log": ("failed", "nccl", 3, None, "vllm"),
    # vLLM 0.4-0.6's end of loading: "Loading model weights took 14.99 GB"
    "vllm_v0_weights_took_then_blocks.log": ("starting", None, None, None, "vllm"),
    # a py-spy dump of a stuck engine (a hang report's usual evidence): its frames' relative module paths
    "vllm_pyspy_dump_frames_only.log": ("starting", None, None, None, "vllm"),
    "sglang_pyspy_dump_frames_only.log": ("starting", None, None, None, "sglang"),
}


def _wrapped(data: bytes, prefix: str) -> bytes:
    return b"".join(prefix.encode() + line + b"\n" for line in data.rstrip(b"\n").split(b"\n"))


def _check(r, want) -> None:
    phase, cause, line, progress, engine = want
    assert r.phase == phase, r
    if cause is None:
        assert r.failure is None, r.failure
    else:
        assert r.failure is not None and (r.failure.cause, r.failure.line) == (cause, line), r.failure
    if progress is not None:
        assert r.progress is not None and (r.progress.done, r.progress.total) == progress
    assert r.engine == engine


@pytest.mark.parametrize("prefix", WRAPPERS)
@pytest.mark.parametrize("name", sorted(FRESH))
def test_fresh_misses_read_right_behind_any_wrapper(name: str, prefix: str) -> None:
    _check(analyze_bytes(_wrapped((FIXTURES / name).read_bytes(), prefix)), FRESH[name])


@pytest.mark.parametrize("name", sorted(FRESH))
def test_fresh_misses_read_the_same_fed_in_pieces(name: str) -> None:
    data = _wrapped((FIXTURES / name).read_bytes(), "web-1  | ")
    a = LogAnalyzer()
    for i in range(0, len(data), 7):
        a.feed(data[i:i + 7])
        a.result()
    a.finish()
    assert a.result() == analyze_bytes(data)


def _docker_json_file(data: bytes, cut: int = 16384) -> bytes:
    """A log as docker's json-file driver writes it: one JSON record per line, a longer line cut into records."""
    out = []
    for i, line in enumerate(data.decode("utf-8", "replace").split("\n")[:-1]):
        parts = [line[k:k + cut] for k in range(0, len(line), cut)] or [""]
        for j, part in enumerate(parts):
            log = part + "\n" if j == len(parts) - 1 else part
            out.append(json.dumps({"log": log, "stream": "stderr", "time": f"2026-05-07T10:00:{i % 60:02d}.5Z"},
                                  separators=(",", ":")))
    return ("\n".join(out) + "\n").encode()


def _reading(r) -> tuple:
    return (r.engine, r.phase, r.progress and (r.progress.done, r.progress.total, r.progress.label),
            r.failure and (r.failure.cause, r.failure.line, r.failure.message))


PLAIN = sorted(p.name for p in FIXTURES.glob("*.log") if not p.name.startswith("docker_json_file")
               and not p.read_bytes().startswith(b"#"))


@pytest.mark.parametrize("name", PLAIN)
def test_a_docker_json_file_reads_as_its_plain_log(name: str) -> None:
    data = (FIXTURES / name).read_bytes()
    data = data if data.endswith(b"\n") else data + b"\n"
    want = _reading(analyze_bytes(data))
    docker = _docker_json_file(data)
    assert _reading(analyze_bytes(docker)) == want
    a = LogAnalyzer()
    for i in range(0, len(docker), 7):
        a.feed(docker[i:i + 7])
    a.finish()
    assert _reading(a.result()) == want


def test_a_docker_record_cut_at_16k_is_one_line_and_its_escapes_reach_no_terminal() -> None:
    data = (b"Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
            b"ValueError: bad \x1b]0;owned\x07" + b"x" * 40000 + b"\nINFO: after\n")
    docker = _docker_json_file(data)
    assert docker.count(b"\n") == 6 and b"\\u001b" in docker     # the long line in three records
    r = analyze_bytes(docker)
    assert r.failure is not None and (r.failure.cause, r.failure.line) == ("exception", 3)
    assert r.failure.message.startswith("ValueError: bad ") and "\x1b" not in r.failure.message
    assert "\x07" not in r.failure.message


def test_a_warning_never_names_the_cause() -> None:
    r = analyze_bytes(b"foo.py:3: UserWarning: CUDA out of memory while probing, retrying\n"
                      b"WARNING 01-02 10:00:00 [x.py:1] No module named 'flash_attn', using fallback\n"
                      b"csrc/a.cu(3): error: identifier \"x\" is undefined\n")
    assert r.failure is not None and (r.failure.cause, r.failure.line) == ("build_failed", 3)


def test_a_warning_alone_is_no_failure() -> None:
    r = analyze_bytes(b"functional_tensor.py:276: UserWarning: Failed to initialize NumPy: No module named 'numpy'\n")
    assert r.failure is None


@pytest.mark.parametrize("line,cause", [
    ("[2026-05-02 10:06:02 PP1 TP1] Scheduler watchdog timeout (self.watchdog_timeout=300, self.soft=False)", "hang"),
    ("[2026-05-02 10:06:02 DP0 TP3 EP3] Detokenizer watchdog timed out after 600 s", "hang"),
    ("[rank2]:[E ProcessGroupNCCL.cpp:616] [Rank 2] Watchdog caught collective operation timeout: "
     "WorkNCCL(SeqNum=7, OpType=ALLGATHER) ran for 600000 milliseconds", "nccl"),
    ("c10d watchdog timed out waiting for ALLREDUCE to finish", "nccl"),
])
def test_watchdog_family_reads_hang_or_nccl_by_what_it_names(line: str, cause: str) -> None:
    r = analyze_bytes(line.encode() + b"\n")
    assert r.failure is not None and r.failure.cause == cause


@pytest.mark.parametrize("line,cause", [
    ("subprocess.CalledProcessError: Command '['cmake', '--build', '.', '-j', '8']' returned non-zero exit status 2.",
     "build_failed"),
    ("subprocess.CalledProcessError: Command '['/usr/bin/python3', 'setup.py', 'bdist_wheel']' returned non-zero "
     "exit status 1.", "build_failed"),
    ("subprocess.CalledProcessError: Command '['nvcc', '-c', 'a.cu']' returned non-zero exit status 1.",
     "build_failed"),
    ("subprocess.CalledProcessError: Command '['ninja', '-v']' returned non-zero exit status -9.", "host_oom"),
    ("subprocess.CalledProcessError: Command '['git', 'fetch']' returned non-zero exit status 128.", "exception"),
    ("ModuleNotFoundError: No module named 'sgl_kernel'", "import_error"),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "cuda_oom"),
    ("IndentationError: unexpected indent", "syntax_error"),
    ("ray.exceptions.RayTaskError(ModuleNotFoundError): ray::Worker.init() (pid=4242, ip=10.0.0.2)", "import_error"),
    ("ray.exceptions.RayTaskError(ValueError): ray::Worker.init() (pid=4242, ip=10.0.0.2)", "exception"),
])
def test_a_final_exception_is_classified_by_its_type(line: str, cause: str) -> None:
    r = analyze_bytes(b"Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
                      + line.encode() + b"\n")
    assert r.failure is not None and (r.failure.cause, r.failure.line) == (cause, 3), r.failure


@pytest.mark.parametrize("prefix", WRAPPERS)
@pytest.mark.parametrize("line", [
    "triton.runtime.errors.OutOfResources: out of resource: shared memory, Required: 262144, Hardware limit: 232448.",
    "subprocess.TimeoutExpired: Command '['nvidia-smi']' timed out after 30 seconds",
    "jinja2.exceptions.TemplateNotFound: chat_template.jinja",
    "ray.exceptions.RayTaskError(ValueError): ray::Worker.execute_method() (pid=4242, ip=10.0.0.2)",
    "Exception: the tokenizer has no chat template",
    "torch._dynamo.exc.BackendCompilerFailed: backend='inductor' raised: LoweringException",
])
def test_a_final_exception_of_any_type_name_is_the_failure_line(line: str, prefix: str) -> None:
    """Type names that end in neither Error nor Exception (or are Exception itself) end a traceback too:
    the line is the failure, not "a traceback without its final exception line"."""
    r = analyze_bytes(_wrapped(b"Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
                               b"    main()\n" + line.encode() + b"\n", prefix))
    assert r.failure is not None and (r.failure.cause, r.failure.line) == ("exception", 4), r.failure
    assert r.failure.message == line


def test_a_cli_error_line_is_no_exception_type() -> None:
    # `Error: …` and `Failed: …` are a tool's words, not a Python type: the traceback's own line decides.
    r = analyze_bytes(b"Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\nFailed: to fetch\n")
    assert r.failure is not None and r.failure.line == 1


@pytest.mark.parametrize("prefix", WRAPPERS)
@pytest.mark.parametrize("lines,want", [
    ((b"iter 100: loss 2.3456, time 123.45ms, mfu 12.34%", b"iter 110: loss 2.3000, time 123.45ms, mfu 12.34%"),
     110),                                                                        # nanoGPT
    ((b"[2025-01-01 10:00:00,000] [INFO] [logging.py:128:log_dist] [Rank 0] step=100, skipped=0, lr=[1e-05], "
      b"mom=[(0.9, 0.95)]",), 100),                                              # DeepSpeed
])
def test_a_step_count_beside_a_loss_or_learning_rate_is_training(lines, want, prefix: str) -> None:
    r = analyze_bytes(_wrapped(b"\n".join(lines) + b"\n", prefix))
    assert r.phase == "training" and r.progress is not None and (r.progress.done, r.progress.total) == (want, None)


def test_a_bare_count_of_something_else_is_no_training() -> None:
    r = analyze_bytes(b"iter 3 of the retry loop: still waiting for the server\nstep 2: copying files\n")
    assert r.phase != "training" and r.progress is None


def test_a_sigkilled_worker_says_check_dmesg() -> None:
    r = analyze_bytes(b"torch.distributed.elastic.multiprocessing.api: failed (exitcode: -9) local_rank: 0\n")
    assert r.failure is not None and r.failure.cause == "host_oom" and "dmesg" in r.failure.hint


@pytest.mark.parametrize("token,value", [("1e5", 100000), ("2.5", 2.5), ("-3", -3), ("1.5e-3", 0.0015),
                                          ("1e400", None), ("inf", None), ("nan", None), ("29/1e5", None),
                                          ("12abc", None), ("", None)])
def test_strict_numbers(token: str, value) -> None:
    assert generic.strict_number(token) == value


@pytest.mark.parametrize("text,want", [("[build] [47/230] Building CUDA object", ("", 47, 230)),
                                        ("rank0: shard 3/8 loaded", ("shard", 3, 8)),
                                        ("no counter 1.5/2 here", None)])
def test_counter_anywhere_in_a_line(text: str, want) -> None:
    assert generic.counter(text) == want


@pytest.mark.parametrize("line,want", [(b"step 29/1e5 loss 1.2\n", (29, 100000)),
                                        (b"step 29/1e400 loss 1.2\n", (29, None)),
                                        (b"step 29/100x loss 1.2\n", (29, None))])
def test_step_totals_are_whole_tokens(line: bytes, want) -> None:
    r = analyze_bytes(line)
    assert r.progress is not None and (r.progress.done, r.progress.total) == want


def test_a_serving_number_in_scientific_notation_is_rejected_not_truncated() -> None:
    r = analyze_bytes(b"INFO 01-02 10:00:00 [loggers.py:1] Engine 000: Avg prompt throughput: 0.0 tokens/s, "
                      b"Avg generation throughput: 1e400 tokens/s, Running: 1 reqs, Waiting: 0 reqs\n")
    assert r.serving is None or r.serving.gen_tokens_per_s is None
    r = analyze_bytes(b"[2026-01-02 10:00:00 TP0] Decode batch, #running-req: 3, #token: 10, token usage: 1e-2, "
                      b"gen throughput (token/s): 12.5, #queue-req: 0\n")
    assert r.serving is not None and r.serving.kv_cache_pct is None and r.serving.gen_tokens_per_s == 12.5


@pytest.mark.parametrize("line,want", [
    (b"rank0: Loading checkpoint shard [3/8] from /models/x\n", ("loading", 3, 8)),
    (b"worker-2 capture cuda graph [12/52] bs=64\n", ("capturing", 12, 52)),
    (b"GET /v1/models [12/52] 200 OK\n", None),
])
def test_a_labelled_bracket_counter_anywhere_in_a_line(line: bytes, want) -> None:
    r = analyze_bytes(line)
    if want is None:
        assert r.progress is None
    else:
        assert r.progress is not None and (r.phase, r.progress.done, r.progress.total) == want


@pytest.mark.parametrize("line,want", [
    # Lightning's RichProgressBar: the epoch counter labels the bar; the bar counts batches
    ("Epoch 3/9  ━━━━━━━━━━━━━━━━╸━━━━━━━━━━━━━━ 400/1000 0:04:52 • 0:07:37 1.33it/s v_num: 0 loss: 1.23",
     ("training", 400, 1000, "Epoch 3/9", 1.33, 457.0)),
    ("Validation DataLoader 0 ━━━━━━━━━━╸━━━━━━━━━━━ 50/100 0:00:05 • 0:00:05 9.52it/s",
     ("training", 50, 100, "Validation DataLoader 0", 9.52, 5.0)),
    # no label, seconds per item: a bar of an unknown phase
    ("━━━━━━━━━━━━━━━━━━━━━━━╺━━━━━━━━━━━━ 12/20 0:01:40 • 0:01:20 8.00s/it", ("unknown", 12, 20, "", 0.125, 80.0)),
    # box-drawing with no count after it (a table's rule) is no bar
    ("┡━━━╇━━━━━━━╇━━━━━━╇━━━━━━━━┩ 3 rows", None),
])
def test_a_rich_progress_bar_reads_its_own_count(line: str, want) -> None:
    r = analyze_bytes(line.encode() + b"\n")
    if want is None:
        assert r.progress is None
    else:
        p = r.progress
        assert p is not None and (r.phase, p.done, p.total, p.label, p.rate, p.eta_s) == want


@pytest.mark.parametrize("line", [b"exec: worker: signal: killed", b"supervisor: worker 3 received SIGKILL",
                                   b"Process exited with exit code 137", b"Killed"])
def test_a_sigkill_in_any_words_is_host_oom_with_dmesg(line: bytes) -> None:
    r = analyze_bytes(line + b"\n")
    assert r.failure is not None and r.failure.cause == "host_oom" and "dmesg" in r.failure.hint


@pytest.mark.parametrize("line,want", [
    (b"rank0: Loading checkpoint 3/8 from /models/x\n", ("loading", 3, 8)),
    (b"Loading at 2026/12/05\n", None),                  # a date
    (b"Loading weights took 1.5/2 s\n", None),            # no whole-token count
    (b"Loading x 9/8\n", None),                          # past its total: no count
])
def test_a_labelled_plain_counter(line: bytes, want) -> None:
    r = analyze_bytes(line)
    if want is None:
        assert r.progress is None
    else:
        assert r.progress is not None and (r.phase, r.progress.done, r.progress.total) == want


@pytest.mark.parametrize("line,want", [
    (b"Processing shard 3/8\n", ("Processing shard", 3, 8)),         # no anchor but the counter itself
    (b"2026-03-02 09:14:03,517 - INFO - prep - Tokenizing batch 12/40 (4096 docs)\n", ("Tokenizing batch", 12, 40)),
    (b"[2026-03-02 09:14:03] Writing chunk 4/16 to s3://bucket/x\n", ("Writing chunk", 4, 16)),
    (b"rank 3/8 joined the rendezvous\n", None),                     # who counts, not how far
    (b"NCCL INFO Channel 01/32 : 0 1 2 3 4 5 6 7\n", None),
    (b"supervisor: restarting worker in 5s (attempt 1/5)\n", None),  # which try
    (b"backup started at 01/12 10:00\n", None),                      # a date
    (b"Processing shard 9/8\n", None),                               # past its total: no count
])
def test_a_plain_counter_with_any_label_is_progress(line: bytes, want) -> None:
    """A "label N/M" reads as progress with its label where nothing more specific read the line: of the
    label's phase where it names one, else of phase "unknown" (the phase stays as it was)."""
    r = analyze_bytes(line)
    if want is None:
        assert r.progress is None
    else:
        assert r.progress is not None and (r.progress.label, r.progress.done, r.progress.total) == want


def test_a_plain_counter_with_no_phase_in_its_label_leaves_the_phase() -> None:
    r = analyze_bytes(b"INFO:     Application startup complete.\nTokenizing batch 12/40\n")
    assert r.phase == "ready" and r.progress is not None and (r.progress.done, r.progress.total) == (12, 40)


@pytest.mark.parametrize("line", [b"Exit code: 137", b"Exit Code: 137", b"exit status 137", b"Exit status 137",
                                   b"ERROR - pipeline - CompletedProcess(args=['python', 'x.py'], returncode=-9)",
                                   b"worker finished, returncode=-9", b"job 7: exit_code=137", b"exitCode: 137",
                                   b"task returned return code 137"])
def test_sigkills_exit_code_in_any_spelling_is_host_oom_with_dmesg(line: bytes) -> None:
    r = analyze_bytes(line + b"\n")
    assert r.failure is not None and r.failure.cause == "host_oom" and "dmesg" in r.failure.hint, r.failure


@pytest.mark.parametrize("line", [b"Exit code: 1", b"Exit code: 1370", b"returncode=-1", b"returncode=-90",
                                   b"exit_code=0"])
def test_another_exit_code_is_no_host_oom(line: bytes) -> None:
    r = analyze_bytes(line + b"\n")
    assert r.failure is None or r.failure.cause != "host_oom", r.failure


@pytest.mark.parametrize("line,other", [(b"Exit code: 137", b"Exit code: 100"), (b"returncode=-9", b"returncode=-1"),
                                         (b"exit_code=137", b"exit_code=1")])
def test_exit_code_lines_are_judged_per_segment(line: bytes, other: bytes) -> None:
    """Their templates are one (digits are 0 in a template): each segment's own digits decide."""
    for data in (line + b"\n" + other + b"\n", other + b"\n" + line + b"\n", (other + b"\n") * 3 + line + b"\n"):
        r = analyze_bytes(data * 2)
        assert r.failure is not None and r.failure.cause == "host_oom", data


@pytest.mark.parametrize("line,cause", [
    ("TimeoutError: Timed out waiting for the engine core to start", "hang"),
    ("TimeoutError: all_reduce did not finish within 600 s", "nccl"),
    ("torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. 1/2 clients joined.", "nccl"),
    ("torch.distributed.DistNetworkError: The client socket has timed out after 1800000ms while trying to connect to "
     "(gpu-node-1, 29500).", "nccl"),
    ("torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError: ", "nccl"),
    ("torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the C10d store has "
     "failed.", "nccl"),
])
def test_a_timeout_exception_is_read_by_what_it_names(line: str, cause: str) -> None:
    r = analyze_bytes(b"Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
                      + line.encode() + b"\n")
    assert r.failure is not None and (r.failure.cause, r.failure.line) == (cause, 3), r.failure


@pytest.mark.parametrize("line", [b">>> [47/230] Building CUDA object k.cu.o", b"12:00:01 build | [47/230] /usr/bin/nvcc -c k.cu",
                                   b"(step 3) [47/230] Linking CXX shared library _C.so"])
def test_a_build_step_behind_a_prefix_nobody_listed(line: bytes) -> None:
    r = analyze_bytes(line + b"\n")
    assert r.phase == "building" and r.progress is not None and (r.progress.done, r.progress.total) == (47, 230)


def _reading(r, shift: int = 0, engine: bool = True) -> tuple:
    return (r.phase, r.engine if engine else "-", r.failure and (r.failure.cause, r.failure.line + shift),
            r.progress and (r.progress.done, r.progress.total))


@pytest.mark.parametrize("prefix", WRAPPERS[1:])
def test_every_fixture_reads_the_same_behind_a_wrapper(prefix: str) -> None:
    """A wrapper's prefix on every line changes nothing: the same phase, engine, cause, root-cause line
    and progress as the bare log (its `#` header left out, so that the wrapper is on every line). The
    engine too, unless the wrapper names one (a pod called vllm-7f9c is a hint of its own)."""
    engine = "vllm" not in prefix
    differ = []
    for path in sorted(FIXTURES.glob("*.log")):
        raw = path.read_bytes()
        body = b"\n".join(line for line in raw.split(b"\n") if not line.startswith(b"#"))
        header = raw.count(b"\n") - body.count(b"\n")
        bare = _reading(analyze_bytes(raw), 0, engine)
        wrapped = _reading(analyze_bytes(_wrapped(body, prefix)), header, engine)
        if wrapped != bare:
            differ.append(f"{path.name}: {wrapped} != {bare}")
    assert not differ, "\n".join(differ)


TB = "Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n    main()\n"


@pytest.mark.parametrize("prefix", WRAPPERS)
@pytest.mark.parametrize("text,want", [
    # a compiler's or a program's name ending in a digit is no host prefix (pdsh's `node-3: `)
    ("gcc-12: error: unrecognized command-line option '-std=c++20'", ("build_failed", 1)),
    ("x86_64-linux-gnu-gcc-11: fatal error: no input files", ("build_failed", 1)),
    ("clang-14: error: unsupported option '--cuda-gpu-arch=sm_90a'", ("build_failed", 1)),
    ("usage: train_v2 [-h] --model M\ntrain_v2: error: unrecognized arguments: --foo", ("bad_arguments", 2)),
    # pip's `ERROR: Exception:` heads a traceback: the traceback's own last line decides
    ("Collecting torch\nERROR: Exception:\n" + TB + "pip._vendor.urllib3.exceptions.ReadTimeoutError: "
     "HTTPSConnectionPool(host='files.pythonhosted.org', port=443): Read timed out.", ("exception", 6)),
    ("Exception", None),
    ("check.health.Failed: 0 nodes", None),
    # DeepSpeed's launcher: a rank SIGKILLed is the OOM killer's; its own SIGINT/SIGTERM handling is a stop
    ("[2024-05-01 10:14:42,011] [ERROR] [launch.py:325:sigkill_handler] ['/usr/bin/python3', '-u', 'train.py'] "
     "exits with return code = -9", ("host_oom", 1)),
    ("[2026-05-18 03:37:03,778] [ERROR] [launch.py:341:sigkill_handler] [...] exits with return code = -2", None),
    ("{'loss': 1.234, 'learning_rate': 1e-05, 'epoch': 0.5}\n[2024-05-01 10:14:41,902] [INFO] "
     "[launch.py:319:sigkill_handler] Killing subprocess 41874\n[2024-05-01 10:14:41,950] [INFO] "
     "[launch.py:329:sigkill_handler] Main process received SIGTERM, exiting", None),
])
def test_lines_that_look_like_another_kind_read_as_what_they_are(text: str, want, prefix: str) -> None:
    r = analyze_bytes(_wrapped(text.encode(), prefix))
    assert (r.failure and (r.failure.cause, r.failure.line)) == want, r.failure


@pytest.mark.parametrize("prefix", ["[2026-12-03 14:00:03,100] [{level}] [comm.py:120:init] ",
                                    "[{level}|trainer.py:900] 2026-12-03 14:00:03,100 >> ", "[{level}] "])
def test_a_bracketed_level_is_the_records_level(prefix: str) -> None:
    """DeepSpeed's and HF examples' bracketed level is read as the record's: a WARNING naming NCCL errors
    is no failure (rule 1), an ERROR is one."""
    line = "NCCL_BLOCKING_WAIT is set; NCCL errors and timeouts will raise exceptions"
    assert strip_prefixes(prefix.format(level="WARNING") + line)[:2] == (line, "WARNING")
    assert analyze_bytes((prefix.format(level="WARNING") + line + "\n").encode()).failure is None
    failed = analyze_bytes((prefix.format(level="ERROR") + "NCCL error: unhandled system error\n").encode())
    assert failed.failure is not None and failed.failure.cause == "nccl"


@pytest.mark.parametrize("text,want", [
    ("OSError: [Errno 28] No space left on device", ("exception", "DISK_FULL -> exception_disk_full")),
    ("OSError: [Errno 122] Disk quota exceeded: '/home/u/.cache/huggingface/hub/tmpx'",
     ("exception", "DISK_FULL -> exception_disk_full")),
    ("RuntimeError: unable to write to file </torch_4411_2>: No space left on device (28)",
     ("exception", "DISK_FULL -> exception_shm_full")),
    # NCCL's own words for its /dev/shm segment stay NCCL's
    ("gpu-3:41:41 [0] NCCL WARN Error while creating shared memory segment /dev/shm/nccl-x (size 9637888), error: "
     "No space left on device (28)", ("nccl", "NCCL -> nccl_shm")),
    ("-- Configuring done\n[3/9] Building CUDA object x.o\n/usr/bin/ld: final link failed: No space left on device",
     ("build_failed", "DISK_FULL -> exception_disk_full")),
    # a hint of its own where the generic one would mislead
    ("RuntimeError: CUDA error: invalid device ordinal", ("cuda_error", "CUDA_ERR -> cuda_error_ordinal")),
    ("RuntimeError: No CUDA GPUs are available", ("cuda_error", "CUDA_ERR -> cuda_error_driver")),
])
def test_a_line_is_read_with_the_hint_that_fits_it(text: str, want: tuple) -> None:
    r = analyze_bytes((text + "\n").encode())
    assert r.failure is not None and (r.failure.cause, dict(r.decided_by)["failure"].split(" (")[0]) == want


@pytest.mark.parametrize("line,level,message", [
    ("2026-12-03 14:00:05,123 WARNING CUDA out of memory at batch size 64, retrying with 32", "WARNING",
     "CUDA out of memory at batch size 64, retrying with 32"),
    ("2026-12-03 14:00:05,123\tWARNING worker.py:2000 -- NCCL errors will now raise", "WARNING",
     "NCCL errors will now raise"),                                                   # Ray's driver
    ("2026-12-03 14:00:05,123 INFORMATION kept", None, "INFORMATION kept"),          # no level
    ("[rank0]:[titan] 2026-12-03 14:00:02,123 - root - WARNING - NCCL errors will raise", "WARNING",
     "NCCL errors will raise"),                                                       # torchtitan: name, then level
    ("[NeMo W 2026-12-03 14:00:02 nemo_logging:393] NCCL errors will raise", "WARNING", "NCCL errors will raise"),
    ("[NeMo E 2026-12-03 14:00:02 exp_manager:100] Checkpoint save failed", "ERROR", "Checkpoint save failed"),
])
def test_a_timestamp_then_a_level_after_a_space(line: str, level: str, message: str) -> None:
    assert strip_prefixes(line)[:2] == (message, level)


@pytest.mark.parametrize("line, message", [
    # journald / syslog (a numeric zone): `host unit[pid]: ` is the wrapper's, stripped
    ("2026-12-03T14:00:01+0000 gpu-box python3[4242]: train step[120]: loss 1.25", "train step[120]: loss 1.25"),
    ("2026-12-03T14:00:01.123456+00:00 gpu-box kernel: Out of memory: Killed process 4242",
     "Out of memory: Killed process 4242"),
    # kubectl --timestamps writes `Z`: what follows is the program's own text, kept whole
    ("2026-12-03T14:00:01.123456789Z train step[120]: loss 1.25", "train step[120]: loss 1.25"),
    ("2026-12-03T14:00:01Z data loader[3]: shard 3 read", "data loader[3]: shard 3 read"),
])
def test_a_host_and_unit_after_a_stamp_only_where_journald_writes_them(line: str, message: str) -> None:
    assert strip_prefixes(line)[0] == message


@pytest.mark.parametrize("text,line", [
    ("Collecting vllm==0.99.0\nERROR: Could not find a version that satisfies the requirement vllm==0.99.0 (from "
     "versions: 0.10.0, 0.11.0)\nERROR: No matching distribution found for vllm==0.99.0", 2),
    ("  \u00d7 No solution found when resolving dependencies:\n  \u2570\u2500\u25b6 Because vllm==0.11.0 depends on "
     "torch==2.8.0 and you require torch==2.9.0, we can conclude that your requirements are unsatisfiable.", 1),   # uv
])
def test_an_installer_that_finds_no_version_fails_the_build(text: str, line: int) -> None:
    r = analyze_bytes((text + "\n").encode())
    assert r.failure is not None and (r.failure.cause, r.failure.line) == ("build_failed", line), r.failure


_ELASTIC = ("[default0]:step 50/1000 loss 3.2\n"
            "E1203 14:05:01.000000 7001 torch/distributed/elastic/multiprocessing/api.py:874] failed (exitcode: {code}) "
            "local_rank: 0 (pid: 7010) of binary: /usr/bin/python3\n"
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
            "Root Cause (first observed failure):\n[0]:\n  exitcode  : {code} (pid: 7010)\n  traceback : {tb}\n")


@pytest.mark.parametrize("code,tb,want", [
    ("-6", "Signal 6 (SIGABRT) received by PID 7010", 7),          # the worker's fatal signal, in the table
    ("-11", "Signal 11 (SIGSEGV) received by PID 7010", 7),
    ("1", "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html", 2),   # its own log has it
])
def test_torch_elastic_summary_is_an_envelope_of_its_workers_end(code: str, tb: str, want: int) -> None:
    r = analyze_bytes(_ELASTIC.format(code=code, tb=tb).encode())
    assert r.failure is not None and (r.failure.cause, r.failure.line) == ("exception", want), r.failure


@pytest.mark.parametrize("line,cause", [
    # a row's words in a line with no other anchor (no Error, failed, CUDA…): the prefilter must let it through
    ("Unable to determine the device handle for GPU0000:3B:00.0: GPU is lost.  Reboot the system to recover this GPU",
     "gpu_fault"),
    ("nvidia-smi: GPU 0000:3b:00.0 has fallen off the bus", "gpu_fault"),
    ("  traceback : Signal 7 (SIGBUS) received by PID 7010", "exception"),
    ("tar: model/x.bin: Cannot write: No space left on device", "exception"),
    ("Cannot access gated repo for url https://huggingface.co/m/resolve/main/config.json.", "exception"),
])
def test_a_rows_words_alone_are_examined(line: str, cause: str) -> None:
    r = analyze_bytes(("step 100/1000 loss 2.2\n" + line + "\n").encode())
    assert r.failure is not None and (r.failure.cause, r.failure.line) == (cause, 2), r.failure


@pytest.mark.parametrize("label, phase", [
    ("Validation DataLoader 0", "training"),        # Lightning: validation runs within training (not a load)
    ("Sanity Checking DataLoader 0", "training"),
    ("Evaluating", "training"),
    ("Generating train split", None),               # HF datasets: the data, not training yet
    ("Running tokenizer on dataset (num_proc=16)", None),
    ("Map (num_proc=8)", None),
    ("model-00002-of-00017.safetensors", "loading"),   # a hub download, one bar a file
    ("model.safetensors-00013-of-00039.safeten(…)", "loading"),
    ("Loading checkpoint shards", "loading"),
    ("Epoch 3", "training"),
    ("Capturing CUDA graphs (decode, FULL)", "capturing"),
])
def test_a_bars_label_names_its_phase(label: str, phase) -> None:
    from gpudeck.jobs.logs.analyze.patterns import label_phase
    assert label_phase(label) == phase


def test_dataset_preparation_bars_alone_are_not_training() -> None:
    data = (b"Generating train split: 100%|##########| 100000/100000 [00:02<00:00, 41021.33 examples/s]\n"
            b"Running tokenizer on dataset (num_proc=16):  45%|####5     | 45000/100000 [00:10<00:12, 4400.00 examples/s]\n")
    a = analyze_bytes(data)
    assert a.phase != "training" and a.progress is not None and a.progress.done == 45000


def test_a_timestamp_after_one_leading_space_dates_the_record() -> None:
    # Megatron-LM prints ` [2025-02-10 08:04:01] iteration  100/ 500000 | … elapsed time per iteration (ms): …`:
    # its timestamps give the rate and the ETA
    data = b"".join(b" [2026-12-07 08:%02d:%02d] iteration %8d/  500000 | consumed samples: %12d | elapsed time per "
                    b"iteration (ms): 1180.0 | learning rate: 3.000E-05 | lm loss: 6.41E+00 |\n"
                    % (4 + 2 * k, 0, 100 * (k + 1), 102400 * (k + 1)) for k in range(3))
    a = analyze_bytes(data)
    assert a.phase == "training" and (a.progress.done, a.progress.total) == (300, 500000)
    assert a.progress.rate == pytest.approx(200 / 240) and a.progress.eta_s == pytest.approx((500000 - 300) * 240 / 200)
    assert strip_prefixes(" [2026-12-07 08:04:00] iteration 100/500000")[0] == "iteration 100/500000"


def test_a_sigkill_after_a_requested_cancel_is_the_cancels_own() -> None:
    # scancel: SIGTERM, then SIGKILL after KillWait; slurmstepd announces the cancel first. The shell's
    # `Killed` after it is that escalation, no OOM; before any cancel it is still the OOM killer's.
    cancel = b"slurmstepd: error: *** JOB 41 ON node-1 CANCELLED AT 2026-12-07T17:00:01 ***\n"
    killed = b"bash: line 1:  9039 Killed                  sleep 0.2\n"
    assert analyze_bytes(b"ready\ngot TERM, ignoring\n" + cancel + killed).failure is None
    a = analyze_bytes(b"step 10/100 loss 1.0\n" + killed + cancel)
    assert (a.failure.cause, a.failure.line) == ("host_oom", 2)
    timed_out = b"slurmstepd: error: *** JOB 41 ON node-1 CANCELLED AT 2026-12-07T17:00:01 DUE TO TIME LIMIT ***\n"
    assert analyze_bytes(b"step 10/100 loss 1.0\n" + timed_out + killed).failure.cause == "time_limit"
