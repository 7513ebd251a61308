"""Log analyzer: failure causes and root-cause lines, progress formats, phases, engines, serving numbers, warnings."""
from __future__ import annotations

from pathlib import Path

import pytest

from gpudeck.jobs.logs.analyze import (CAUSES, PHASES, LogAnalyzer, analyze_bytes, analyze_file,
                               parse_serving_stats_line)

FIXTURES = Path(__file__).parent / "fixtures" / "logs"

# file -> (cause, root-cause line, engine); cause None = no failure.
FAILURES = {
    "vllm_engine_core_oom.log": ("cuda_oom", 8, "vllm"),
    "vllm_umbrella_error_lines_only.log": ("exception", 3, "vllm"),
    "build_ninja_cc1plus_killed.log": ("host_oom", 10, None),
    "build_make_compile_error.log": ("build_failed", 8, None),
    "build_ptxas_segfault.log": ("build_failed", 3, None),
    "nccl_watchdog_timeout.log": ("nccl", 2, None),
    "cuda_illegal_access_via_watchdog.log": ("cuda_error", 2, "sglang"),
    "syntax_error_patched_file.log": ("syntax_error", 9, "vllm"),
    "argparse_bad_arguments.log": ("bad_arguments", 3, None),
    "host_oom_bare_killed.log": ("host_oom", 3, None),
    "sglang_watchdog_hang.log": ("hang", 2, "sglang"),
    "dmesg_xid79.log": ("gpu_fault", 2, None),
    "dmesg_xid13_app.log": ("cuda_error", 1, None),
    "import_vllm_c_undefined_symbol.log": ("import_error", 4, "vllm"),
    "module_not_found.log": ("import_error", 4, None),
    "generic_exception.log": ("exception", 5, None),
    "sglang_ansi_ranks_cr_capture_crash.log": ("cuda_error", 8, "sglang"),
    "slurm_time_limit.log": ("time_limit", 7, None),
    "slurm_node_fail.log": ("node_fail", 6, "sglang"),
    "slurm_preempted.log": ("preempted", 5, None),
}


@pytest.mark.parametrize("name", sorted(FAILURES))
def test_failure_cause_and_root_line(name: str) -> None:
    cause, line, engine = FAILURES[name]
    result = analyze_file(FIXTURES / name)
    assert result.failure is not None, result
    assert (result.failure.cause, result.failure.line) == (cause, line)
    assert result.phase == "failed"
    assert result.engine == engine
    assert result.failure.hint and "\n" not in result.failure.hint


def test_every_cause_is_covered_by_a_fixture() -> None:
    assert {c for c, _, _ in FAILURES.values()} == set(CAUSES)


def test_every_cause_has_its_words_where_causes_are_shown() -> None:
    """The post-mortem's and the stall notices' words cover every code the analysis emits (a code
    without them was shown raw: Slurm's time_limit, node_fail and preempted were)."""
    from gpudeck.jobs.history.postmortem import CAUSE_TEXT
    from gpudeck.jobs.stalls import FAILURE_WORDS
    assert set(CAUSES) <= set(CAUSE_TEXT) and set(CAUSES) <= set(FAILURE_WORDS)


def test_every_fixture_is_checked_somewhere() -> None:
    checked = set(FAILURES) | {
        "vllm_startup_ready_spec_bad.log", "sglang_startup_ready.log", "serving_recovered_error.log",
        "hf_trainer_cr_glued.log", "training_epoch_step_total.log", "sglang_kv_retract_v0_spec.log"}
    # tests/test_analyze_signatures.py reads the fixtures it names
    signatures = "".join((Path(__file__).parent / f).read_text()
                         for f in ("test_analyze_signatures.py", "test_analyze_generic.py"))
    checked |= {p.name for p in FIXTURES.glob("*.log") if f'"{p.name}"' in signatures}
    # a fixture whose header says what it reads (`# expect: {...}`) is checked by tests/test_analyze_table.py
    checked |= {p.name for p in FIXTURES.glob("*.log") if p.read_bytes().startswith(b"# expect: ")}
    assert {p.name for p in FIXTURES.glob("*.log")} == checked


def test_hints_say_what_to_do() -> None:
    assert "MAX_JOBS" in analyze_file(FIXTURES / "build_ninja_cc1plus_killed.log").failure.hint
    assert "rebuild" in analyze_file(FIXTURES / "import_vllm_c_undefined_symbol.log").failure.hint
    assert "segfault" in analyze_file(FIXTURES / "build_ptxas_segfault.log").failure.hint
    assert "install" in analyze_file(FIXTURES / "module_not_found.log").failure.hint


def test_vllm_startup_to_ready_with_useless_speculation() -> None:
    r = analyze_file(FIXTURES / "vllm_startup_ready_spec_bad.log")
    assert (r.engine, r.phase, r.ready_line, r.failure, r.progress) == ("vllm", "ready", 25, None, None)
    assert r.serving.running == 8 and r.serving.waiting == 1
    assert r.serving.kv_cache_pct == pytest.approx(47.5)
    assert r.serving.gen_tokens_per_s == pytest.approx(44.0)
    assert r.serving.spec_accept_len == pytest.approx(1.09)
    assert r.serving.spec_accept_rate == pytest.approx(0.025)
    assert [w.code for w in r.warnings] == ["spec_decode_ineffective"]
    assert r.warnings[0].line == 30


@pytest.mark.parametrize("upto,phase", [
    (4, "loading"),        # "Starting to load model"
    (9, "loading"),        # shard bar 10/30, worker prefix alone on a line, blank lines
    (13, "starting"),      # weights loaded
    (14, "compiling"),     # Dynamo
    (16, "starting"),      # KV cache sized
    (17, "capturing"),     # the PIECEWISE capture bar, full: vLLM V1 may draw its (decode, FULL) bar next
    (18, "starting"),      # "Graph capturing finished": the server is next
    (22, "starting"),      # API server coming up
    (25, "ready"),
])
def test_vllm_phases_in_order(upto: int, phase: str) -> None:
    lines = (FIXTURES / "vllm_startup_ready_spec_bad.log").read_bytes().split(b"\n")
    r = analyze_bytes(b"\n".join(lines[:upto]) + b"\n")
    assert r.phase == phase


def test_vllm_shard_bar_progress_mid_load() -> None:
    lines = (FIXTURES / "vllm_startup_ready_spec_bad.log").read_bytes().split(b"\n")
    r = analyze_bytes(b"\n".join(lines[:9]) + b"\n")
    assert (r.progress.done, r.progress.total) == (10, 30)
    assert r.progress.label == "Loading safetensors checkpoint shards"
    assert r.progress.rate == pytest.approx(0.5) and r.progress.eta_s == pytest.approx(40)


def test_sglang_is_ready_only_when_fired_up() -> None:
    data = (FIXTURES / "sglang_startup_ready.log").read_bytes()
    cut = data.index(b"[2025-09-01 10:00:26 TP0] Prefill")
    early = analyze_bytes(data[:cut])
    assert (early.engine, early.phase, early.ready_line) == ("sglang", "starting", None)
    assert (early.progress.done, early.progress.total) == (20, 20)
    r = analyze_bytes(data)
    assert (r.phase, r.ready_line) == ("ready", 19)
    assert r.serving.running == 12 and r.serving.waiting == 2
    assert r.serving.kv_cache_pct == pytest.approx(31.0)
    assert r.serving.spec_accept_len == pytest.approx(3.10) and r.serving.spec_accept_rate == pytest.approx(0.62)
    assert r.warnings == ()


def test_a_request_error_while_serving_is_a_warning_not_a_failure() -> None:
    r = analyze_file(FIXTURES / "serving_recovered_error.log")
    assert r.failure is None and r.phase == "ready"
    # (the ERROR line that says so is an error the server carried on from, too)
    assert [(w.code, w.line) for w in r.warnings] == [("error_recovered", 2), ("request_error", 6)]
    assert r.warnings[1].message == ("a request failed and the server answered it (it serves on): ValueError: This "
                                     "model's maximum context length is 8192 tokens.")
    # no stats line after it: the server answered the request (vLLM's handler caught it), it is no crash
    data = (FIXTURES / "serving_recovered_error.log").read_bytes()
    cut = analyze_bytes(data[:data.index(b"(APIServer pid=5) INFO:     10.0.0.9")])
    assert cut.failure is None and cut.phase == "ready" and [w.code for w in cut.warnings] == ["request_error"]


def test_error_then_serving_is_recovered_not_failed() -> None:
    data = (FIXTURES / "serving_recovered_error.log").read_bytes().replace(
        b"(APIServer pid=5) ERROR 06-01 12:00:00 [serving_chat.py:300] Error in preprocessing prompt inputs\n", b"")
    r = analyze_bytes(data)
    assert r.failure is None and r.phase == "ready"
    assert [(w.code, w.line) for w in r.warnings] == [("error_recovered", 5)]
    # (the state keeps the warning's parts; its text is made with the result)
    assert r.warnings[0].message == ("exception logged at line 5 but the job carried on: ValueError: This model's "
                                     "maximum context length is 8192 tokens.")


def test_crash_while_serving_is_failed() -> None:
    # An exception no request-error line announces, and no serving after it: the server died of it.
    data = (FIXTURES / "serving_recovered_error.log").read_bytes().replace(
        b"(APIServer pid=5) ERROR 06-01 12:00:00 [serving_chat.py:300] Error in preprocessing prompt inputs\n", b"")
    r = analyze_bytes(data[:data.index(b"(APIServer pid=5) INFO:     10.0.0.9")])
    assert r.failure.cause == "exception" and r.failure.line == 5


def test_a_clients_status_error_after_the_ready_server_is_the_clients() -> None:
    """cause.py rule 6: a client's traceback pasted after the server's log, ending on its library's
    status error, is a request the server answered; alone, or as a connection error, it is a failure."""
    r = analyze_file(FIXTURES / "vllm_ready_then_client_bad_request_traceback.log")
    assert (r.phase, r.failure) == ("ready", None)
    assert [(w.code, w.line) for w in r.warnings] == [("request_error", 16)]
    assert r.warnings[0].message.startswith("a client's request failed and the server answered it (it serves on): "
                                            "openai.BadRequestError: Error code: 400")
    data = (FIXTURES / "vllm_ready_then_client_bad_request_traceback.log").read_bytes()
    client = data[data.index(b"Traceback"):]
    alone = analyze_bytes(client)                       # no server in the log: the client's run failed
    assert alone.phase == "failed" and (alone.failure.cause, alone.failure.line) == ("exception", 8)
    refused = analyze_bytes(data.replace(b"openai.BadRequestError: Error code: 400",
                                         b"openai.APIConnectionError: Connection error. 400"))
    assert refused.phase == "failed" and (refused.failure.cause, refused.failure.line) == ("exception", 16)


def test_an_nccl_remote_exit_defers_to_the_dead_ranks_own_error() -> None:
    r = analyze_file(FIXTURES / "torchrun_rank_keyerror_then_nccl_remote_exit.log")
    assert (r.failure.cause, r.failure.line, r.failure.message) == ("exception", 8, "KeyError: 'messages'")
    data = (FIXTURES / "torchrun_rank_keyerror_then_nccl_remote_exit.log").read_bytes()
    alone = analyze_bytes(data[data.index(b"[rank0]:[E0312"):])    # no rank's own error: the NCCL error decides
    assert (alone.failure.cause, alone.failure.line) == ("nccl", 1)
    assert "peer rank exited" in alone.failure.hint


def test_argparse_rejecting_an_options_value_is_bad_arguments_with_or_without_usage() -> None:
    for text in (b"vllm serve: error: argument --max-model-len: invalid int value: '32k'\n",
                 b"vllm-1  | vllm serve: error: argument --tensor-parallel-size/-tp: invalid int value: 'auto'\n",
                 b"api_server.py: error: argument --dtype: invalid choice: 'fp8' (choose from 'auto', 'half')\n"):
        r = analyze_bytes(b"INFO 11-20 14:02:11 [__init__.py:216] Automatically detected platform cuda.\n" + text)
        assert (r.failure.cause, r.failure.line) == ("bad_arguments", 2), text
        assert "value it cannot take" in r.failure.hint
    # an echoed command with its flags is still no event (cause.py rule 1)
    echoed = analyze_bytes(b"vllm serve /models/x --tensor-parallel-size 8 --watchdog-timeout 3600\n")
    assert echoed.failure is None


def test_a_specific_cause_inside_a_request_error_still_decides() -> None:
    data = (b"(APIServer pid=5) INFO:     Application startup complete.\n"
            b"ERROR:    Exception in ASGI application\n"
            b"Traceback (most recent call last):\n"
            b'  File "/venv/lib/python3.12/site-packages/vllm/engine/async_llm.py", line 400, in generate\n'
            b"RuntimeError: CUDA error: an illegal memory access was encountered\n")
    r = analyze_bytes(data)
    assert r.phase == "failed" and (r.failure.cause, r.failure.line) == ("cuda_error", 5)


def test_hf_trainer_bar_with_cr_updates_and_glued_loss_dict() -> None:
    r = analyze_file(FIXTURES / "hf_trainer_cr_glued.log")
    assert r.phase == "training"
    assert (r.progress.done, r.progress.total) == (56, 600)
    assert r.progress.rate == pytest.approx(1 / 1.5, rel=1e-3)
    assert r.progress.eta_s == pytest.approx(540)


def test_hf_loss_dicts_alone_give_epoch_progress_against_num_epochs() -> None:
    data = (b"***** Running training *****\n  Num Epochs = 4\n"
            b"{'loss': 1.2, 'grad_norm': 3.0, 'learning_rate': 1e-05, 'epoch': 0.5}\n"
            b"{'loss': 1.1, 'grad_norm': 2.0, 'learning_rate': 2e-05, 'epoch': 1.25}\n")
    r = analyze_bytes(data)
    assert (r.phase, r.progress.done, r.progress.total, r.progress.label) == ("training", 1.25, 4, "epoch")


def test_training_steps_rate_from_line_timestamps() -> None:
    r = analyze_file(FIXTURES / "training_epoch_step_total.log")
    assert (r.progress.done, r.progress.total) == (200, 500)
    assert r.progress.label == "epoch 2 step"
    assert r.progress.rate == pytest.approx(0.5)          # 100 steps in 200 s
    assert r.progress.eta_s == pytest.approx(600)


def test_epoch_n_of_m_without_steps() -> None:
    r = analyze_bytes(b"Epoch 3/10: train loss 0.52\n")
    assert (r.phase, r.progress.done, r.progress.total) == ("training", 3, 10)


def test_rate_from_arrival_times_when_the_log_has_none() -> None:
    a = LogAnalyzer()
    a.feed(b"[10/200] nvcc -c a.cu\n", now=1000.0)
    a.feed(b"[30/200] nvcc -c b.cu\n", now=1010.0)
    r = a.result()
    assert (r.phase, r.progress.done, r.progress.total) == ("building", 30, 200)
    assert r.progress.rate == pytest.approx(2.0) and r.progress.eta_s == pytest.approx(85.0)


def test_make_percent_and_ninja_counts() -> None:
    assert analyze_bytes(b"[ 37%] Building CXX object x.o\n").progress.done == 37
    r = analyze_bytes(b"[7/9] c++ -c a.cpp\n")
    assert (r.progress.done, r.progress.total, r.phase) == (7, 9, "building")


def test_cmake_configure_is_building_without_progress() -> None:
    r = analyze_bytes(b"-- The C compiler identification is GNU 12.2.0\n-- Detecting C compiler ABI info\n")
    assert (r.phase, r.progress, r.failure) == ("building", None, None)


def test_oom_risk_warning_when_ninja_picks_parallelism() -> None:
    r = analyze_file(FIXTURES / "build_ninja_cc1plus_killed.log")
    assert [(w.code, w.line) for w in r.warnings] == [("oom_risk", 2)]
    assert "MAX_JOBS" in r.warnings[0].message


def test_v0_spec_metrics_and_kv_retraction_warn() -> None:
    r = analyze_file(FIXTURES / "sglang_kv_retract_v0_spec.log")
    assert {w.code for w in r.warnings} == {"spec_decode_ineffective", "kv_cache_pressure"}
    assert r.serving.spec_accept_rate == pytest.approx(0.051)
    assert r.serving.spec_accept_len == pytest.approx(301 / 250)


def test_spec_warning_clears_when_acceptance_recovers() -> None:
    bad = b"[2025-01-01 00:00:00 TP0] Decode batch. #running-req: 1, accept len: 1.02, accept rate: 0.01, gen throughput (token/s): 10.0, #queue-req: 0\n"
    good = b"[2025-01-01 00:00:09 TP0] Decode batch. #running-req: 1, accept len: 3.50, accept rate: 0.70, gen throughput (token/s): 90.0, #queue-req: 0\n"
    assert [w.code for w in analyze_bytes(bad).warnings] == ["spec_decode_ineffective"]
    assert analyze_bytes(bad + good * 5).warnings == ()


def test_glued_bar_then_record_on_one_line_keeps_progress_and_sees_the_crash() -> None:
    data = (b"Capturing batches (bs=8 avail_mem=9.00 GB):  40%|####      | 4/10 [00:04<00:06,  1.00it/s]"
            b"[2025-02-02 10:00:00 TP3] Scheduler hit an exception: Traceback (most recent call last):\n"
            b'  File "/x/sglang/srt/runner.py", line 9, in capture\n    raise RuntimeError("NCCL error: x")\n')
    r = analyze_bytes(data)
    assert (r.progress.done, r.progress.total) == (4, 10)
    assert (r.failure.cause, r.failure.line) == ("exception", 1)      # the quoted source line is not the cause
    assert r.engine == "sglang"


def test_cr_updates_stay_on_one_line_number() -> None:
    bar = b"".join(b"\rLoading safetensors checkpoint shards:  %d%% Completed | %d/4 [00:0%d<00:01, 1.00it/s]"
                   % (i * 25, i, i) for i in range(5))
    r = analyze_bytes(b"first line\n" + bar + b"\nKilled\n")
    assert (r.progress.done, r.progress.total) == (4, 4)
    assert (r.failure.cause, r.failure.line) == ("host_oom", 3)


def test_unterminated_bar_counts_while_live() -> None:
    a = LogAnalyzer()
    a.feed(b"[2025-09-01 10:00:16 TP0] Capture cuda graph begin.\n\rCapturing batches (bs=8 avail_mem=9 GB):  50%|#  | 10/20 [00:05<00:05,  2.00it/s]")
    r = a.result()
    assert (r.phase, r.progress.done, r.progress.total) == ("capturing", 10, 20)
    assert r.progress.rate == pytest.approx(2.0)
    # asking did not consume anything: the rest of the line still lands on the same segment
    a.feed(b"\rCapturing batches (bs=4 avail_mem=9 GB):  60%|#  | 12/20 [00:06<00:04,  2.00it/s]\n")
    assert a.result().progress.done == 12


def test_unlabeled_bar_after_transformers_loaded_the_weights_is_no_capture() -> None:
    # from_pretrained's bar, then a script's or a harness's own bars: nothing captures CUDA graphs
    data = (b"Loading checkpoint shards: 100%|##########| 4/4 [00:04<00:00,  1.02s/it]\n"
            b" 45%|####      | 450/1000 [01:10<01:26,  6.40it/s]\n")
    r = analyze_bytes(data)
    assert r.phase != "capturing" and r.progress is not None and (r.progress.done, r.progress.total) == (450, 1000)


def test_unlabeled_bar_after_weights_is_cuda_graph_capture() -> None:
    data = (b"Loading safetensors checkpoint shards: 100% Completed | 2/2 [00:01<00:00,  1.50it/s]\n\n"
            b"  0%|          | 0/12 [00:00<?, ?it/s]\n")
    r = analyze_bytes(data)
    assert (r.phase, r.progress.done, r.progress.total) == ("capturing", 0, 12)


def test_syntax_warning_and_deprecation_are_noise() -> None:
    data = (b"/x/protocol.py:12: SyntaxWarning: invalid escape sequence '\\e'\n"
            b"/x/y.py:3: DeprecationWarning: pkg_resources is deprecated\n"
            b"  warnings.warn(msg)\n")
    r = analyze_bytes(data)
    assert r.failure is None and r.warnings == ()


def test_error_level_lines_alone_are_not_a_failure() -> None:
    r = analyze_bytes(b"(APIServer pid=1) ERROR 01-01 00:00:00 [x.py:1] client disconnected\n")
    assert r.failure is None


def test_exit_137_and_sigkill_are_host_oom() -> None:
    for line in (b"Worker VllmWorker-3 died, exit code: -9\n", b"error: process exited with status 137\n",
                 b"subprocess.CalledProcessError: Command 'x' died with <Signals.SIGKILL: 9>.\n",
                 b"nvcc error   : 'cicc' died due to signal 9 (Kill signal)\n"):
        assert analyze_bytes(line).failure.cause == "host_oom", line


@pytest.mark.parametrize("line,cause", [
    (b"RuntimeError: CUDA error: device-side assert triggered\n", "cuda_error"),
    (b"RuntimeError: NCCL error in: ../nccl.cpp:100, unhandled cuda error\n", "nccl"),
    (b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1 GiB\n", "cuda_oom"),
    (b"Capture cuda graph failed: CUDA out of memory. Tried to allocate 20.00 MiB\n", "cuda_oom"),
    (b"ImportError: libcudart.so.12: cannot open shared object file: No such file or directory\n", "import_error"),
    (b"IndentationError: unexpected indent\n", "syntax_error"),
    (b"NVRM: GPU at PCI:0000:b3:00: GPU-1234 has fallen off the bus.\n", "gpu_fault"),
    (b"CMake Error at CMakeLists.txt:20 (find_package):\n", "build_failed"),
    (b"main.py: error: the following arguments are required: --model\n", "bad_arguments"),
    (b"ValueError: max_model_len is too large\n", "exception"),
])
def test_single_line_signatures(line: bytes, cause: str) -> None:
    assert analyze_bytes(line).failure.cause == cause


def test_compiler_unrecognized_option_is_a_build_failure_not_bad_arguments() -> None:
    r = analyze_bytes(b"[3/9] c++ -c a.cpp\nc++: error: unrecognized command-line option '-mfoo'\n")
    assert r.failure.cause == "build_failed"


_LINK_PROBE = b"/usr/bin/ld: cannot find -laio: No such file or directory\ncollect2: error: ld returned 1 exit status\n"


@pytest.mark.parametrize("after,cause", [
    # a GPU's own failure is no consequence of a build error: the job got past it (cause.py rule 3)
    (b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n", "cuda_oom"),
    (b"NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.\n", "gpu_fault"),
    # consequences of a failed build stay the build's: the op it could not load, the rank left waiting
    (b"ImportError: /root/.cache/torch_extensions/fused_adam/fused_adam.so: cannot open shared object file\n",
     "build_failed"),
    (b"torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, remote process exited\n",
     "build_failed"),
])
def test_a_gpu_failure_after_a_build_error_decides_its_consequences_do_not(after: bytes, cause: str) -> None:
    r = analyze_bytes(_LINK_PROBE + after)
    assert r.failure is not None and r.failure.cause == cause, r.failure
    assert r.failure.line == (3 if cause != "build_failed" else 2)


_CUDA_ERROR = b"RuntimeError: CUDA error: unspecified launch failure\n"
_XID_79 = b"NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"
_XID_13 = b"NVRM: Xid (PCI:0000:3b:00): 13, pid=4242, name=python3, Graphics SM Warp Exception\n"


@pytest.mark.parametrize("data,want", [
    (_CUDA_ERROR + _XID_79, ("gpu_fault", 2)),      # the hardware fault explains the CUDA error pasted above it
    (_XID_79 + _CUDA_ERROR, ("gpu_fault", 1)),
    (_CUDA_ERROR + _XID_13, ("cuda_error", 1)),     # an application's own fault (Xid 13) explains nothing more
])
def test_a_gpu_hardware_fault_decides_over_the_cuda_errors_around_it(data: bytes, want: tuple) -> None:
    r = analyze_bytes(data)
    assert r.failure is not None and (r.failure.cause, r.failure.line) == want, r.failure


def test_phase_and_cause_vocabulary() -> None:
    for name in FAILURES:
        assert analyze_file(FIXTURES / name).phase in PHASES


# ------------------------------------------------------------------ the stats-line parser (engines fall back on it)

def test_parse_vllm_stats_line() -> None:
    got = parse_serving_stats_line(
        "(APIServer pid=1) INFO 05-07 04:56:17 [loggers.py:271] Engine 000: Avg prompt throughput: 2.5 tokens/s, "
        "Avg generation throughput: 123.8 tokens/s, Running: 1 reqs, Waiting: 4 reqs, GPU KV cache usage: 17.5%, "
        "Prefix cache hit rate: 0.0%")
    assert got == {"prompt_tokens_per_s": 2.5, "gen_tokens_per_s": 123.8, "running": 1.0, "waiting": 4.0,
                   "kv_cache_pct": 17.5}


def test_parse_vllm_spec_line() -> None:
    got = parse_serving_stats_line(
        "SpecDecoding metrics: Mean acceptance length: 2.63, Accepted throughput: 76.80 tokens/s, Drafted "
        "throughput: 235.49 tokens/s, Accepted: 768 tokens, Drafted: 2355 tokens, Per-position acceptance rate: "
        "0.726, 0.467, Avg Draft acceptance rate: 32.6%")
    assert got == {"spec_accept_len": 2.63, "spec_accept_rate": pytest.approx(0.326)}


def test_parse_vllm_v0_line_pending_is_waiting() -> None:
    got = parse_serving_stats_line(
        "Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 40.1 tokens/s, Running: 3 reqs, "
        "Swapped: 0 reqs, Pending: 7 reqs, GPU KV cache usage: 0.3%, CPU KV cache usage: 0.0%.")
    assert got["waiting"] == 7 and got["running"] == 3 and got["kv_cache_pct"] == pytest.approx(0.3)


def test_parse_sglang_decode_and_prefill() -> None:
    got = parse_serving_stats_line(
        "\x1b[0m[2025-10-22 10:27:57 TP0] Decode batch. #running-req: 1, #token: 186, token usage: 0.25, accept len: "
        "1.95, accept rate: 0.49, cuda graph: True, gen throughput (token/s): 178.86, #queue-req: 2, ")
    assert got == {"running": 1.0, "waiting": 2.0, "kv_cache_pct": pytest.approx(25.0), "gen_tokens_per_s": 178.86,
                   "spec_accept_len": 1.95, "spec_accept_rate": 0.49}
    pre = parse_serving_stats_line("[x TP0] Prefill batch. #new-seq: 1, #new-token: 28, #cached-token: 0, "
                                   "token usage: 0.00, #running-req: 0, #queue-req: 5, input throughput (token/s): 800.0")
    assert pre == {"running": 0.0, "waiting": 5.0, "kv_cache_pct": 0.0, "prompt_tokens_per_s": 800.0}


def test_parse_other_lines_is_none() -> None:
    assert parse_serving_stats_line('INFO:     1.2.3.4:5 - "POST /v1/completions HTTP/1.1" 200 OK') is None
    assert parse_serving_stats_line("Capturing batches (bs=1): 100%|#| 52/52") is None


def test_a_leading_annotation_header_is_not_read_as_output_but_keeps_line_numbers():
    from gpudeck.jobs.logs.analyze import LogAnalyzer
    log = (b"# source: https://example.invalid/issue/1\n"
           b"# expect: RuntimeError: CUDA out of memory would be the cause\n"
           b"INFO starting\n"
           b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    whole = LogAnalyzer()
    whole.feed(log)
    got = whole.result().to_json()
    assert got["failure"]["cause"] == "cuda_oom"
    assert got["failure"]["line"] == 4            # the header's two lines still count
    bytewise = LogAnalyzer()
    for i in range(len(log)):
        bytewise.feed(log[i:i + 1])
    assert bytewise.result().to_json() == got


def test_only_the_leading_block_of_hash_lines_is_skipped():
    from gpudeck.jobs.logs.analyze import LogAnalyzer
    a = LogAnalyzer()
    a.feed(b"# header\nINFO starting\n# a comment the job printed\nRuntimeError: boom\n")
    assert a.result().to_json()["failure"]["line"] == 4
    header_only = LogAnalyzer()
    header_only.feed(b"# expect: torch.OutOfMemoryError: CUDA out of memory\n")
    assert header_only.result().to_json()["failure"] is None


def test_a_loss_dict_glued_onto_a_trainer_bar_keeps_the_bars_done_and_total():
    from gpudeck.jobs.logs.analyze import LogAnalyzer
    a = LogAnalyzer()
    a.feed(b" 44%|\xe2\x96\x88\xe2\x96\x88\xe2\x96\x88\xe2\x96\x88\xe2\x96\x8d     | 440/1000 [10:00<12:43,  1.36s/it]"
           b"\r 45%|\xe2\x96\x88\xe2\x96\x88\xe2\x96\x88\xe2\x96\x88\xe2\x96\x8c     | 450/1000 [10:13<12:30,  1.36s/it]"
           b"\r{'loss': 0.8123, 'learning_rate': 1e-05, 'epoch': 2.25}\n")
    got = a.result().to_json()
    assert got["phase"] == "training"
    assert (got["progress"]["done"], got["progress"]["total"]) == (450, 1000)
    assert got["progress"]["eta_s"] == 750          # 12:30 left, as the bar says


def test_stats_with_requests_running_and_no_token_made_prove_no_recovery() -> None:
    # The front-end prints its stats on while a step hangs: `Running: 6 reqs` at 0.0 tokens/s is no proof the
    # engine steps, so the stall notices before it stay the failure; a line that made tokens proves it.
    data = (FIXTURES / "vllm_stall_notices_then_stats_with_no_tokens.log").read_bytes()
    stuck = analyze_bytes(data)
    assert stuck.phase == "failed" and (stuck.failure.cause, stuck.failure.line) == ("hang", 5)
    working = data.replace(b"Avg generation throughput: 0.0 tokens/s, Running: 6 reqs, Waiting: 12",
                           b"Avg generation throughput: 88.0 tokens/s, Running: 6 reqs, Waiting: 12")
    served = analyze_bytes(working)
    assert served.phase == "ready" and served.failure is None
    assert [(w.code, w.line) for w in served.warnings] == [("error_recovered", 5)]
    idle = data.replace(b"Running: 6 reqs, Waiting: 9", b"Running: 0 reqs, Waiting: 0")
    assert analyze_bytes(idle).failure is None           # nothing running: an idle server's stats, not a stuck one
