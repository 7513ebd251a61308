"""Signatures that generalise across engine releases: process prefixes, rank tags, launchers, kernels, trainers (issue 10's misses)."""
from __future__ import annotations

from pathlib import Path

import pytest

from gpudeck.jobs.logs.analyze import analyze_bytes, analyze_file

FIXTURES = Path(__file__).parent / "fixtures" / "logs"

# Every process-prefix shape vLLM has printed (multiproc _add_prefix, V0 -> V1, Ray actors): one line each,
# with a message that names no engine, must be read as vLLM.
VLLM_PREFIXES = [
    "(VllmWorkerProcess pid=31)",           # 0.4-0.6 multiproc_worker_utils
    "(VllmWorker rank=0 pid=31)",           # V1 0.8-0.9
    "(VllmWorker TP1 pid=31)",              # V1 0.10
    "(EngineCore_0 pid=30) (VllmWorker TP0 pid=31)",
    "(Worker_TP0 pid=31)",                  # 0.11+
    "(Worker_PP1_TP3 pid=31)",
    "(Worker_DP0_TP1_EP1 pid=31)",
    "(EngineCore_DP0 pid=30)",
    "(APIServer pid=29)",
    "(RayWorkerWrapper pid=31, ip=10.0.0.5)",
]


@pytest.mark.parametrize("prefix", VLLM_PREFIXES)
def test_vllm_process_prefixes_name_the_engine(prefix: str) -> None:
    r = analyze_bytes(f"{prefix} INFO 06-02 14:00:15 [loader.py:10] rank 0 is ready\n".encode())
    assert r.engine == "vllm"
    assert dict(r.decided_by)["engine"].startswith("vllm_process_prefix")


def test_a_bare_coloured_prefix_line_names_the_engine() -> None:
    r = analyze_bytes(b"\x1b[0;36m(EngineCore_DP0 pid=185)\x1b[0;0m \n")
    assert r.engine == "vllm"


def test_vllm_v1_capture_bar_label_names_engine_and_phase() -> None:
    r = analyze_file(FIXTURES / "vllm_capture_bar_only.log")
    assert (r.engine, r.phase) == ("vllm", "capturing")
    assert (r.progress.done, r.progress.total) == (23, 51)


def test_vllm_prefix_shapes_log() -> None:
    r = analyze_file(FIXTURES / "vllm_worker_prefix_shapes_capture.log")
    assert (r.engine, r.phase, r.failure) == ("vllm", "capturing", None)
    assert (r.progress.done, r.progress.total) == (8, 67)


@pytest.mark.parametrize("tag", ["TP0", "TP0 EP0", "DP1 TP0", "DP0 PP1 TP2 EP2", "DP0 ATTN_CP1 TP0"])
def test_sglang_rank_tags_of_every_release(tag: str) -> None:
    r = analyze_bytes(f"[2026-01-02 03:04:05 {tag}] Init torch distributed ends. mem usage=0.1 GB\n".encode())
    assert r.engine == "sglang"


def test_sglang_2026_decode_lines_serve_with_spec_numbers() -> None:
    r = analyze_file(FIXTURES / "sglang_2026_rank_tags_decode.log")
    assert (r.engine, r.phase, r.failure) == ("sglang", "ready", None)
    assert r.serving.spec_accept_len == pytest.approx(3.41)
    assert r.serving.spec_accept_rate == pytest.approx(0.68)
    assert r.serving.running == 11 and r.serving.kv_cache_pct == pytest.approx(40.0)
    assert not any(w.code == "spec_decode_ineffective" for w in r.warnings)


def test_custom_kernel_cuda_error_is_the_root_cause() -> None:
    r = analyze_file(FIXTURES / "vllm_custom_allreduce_peer_access.log")
    assert (r.failure.cause, r.failure.line) == ("cuda_error", 3)
    assert "peer access" in r.failure.message
    assert "--disable-custom-all-reduce" in r.failure.hint


def test_launcher_sigkill_reads_host_oom_with_dmesg_hint() -> None:
    r = analyze_file(FIXTURES / "torchrun_worker_sigkill.log")
    assert (r.failure.cause, r.failure.line) == ("host_oom", 4)
    assert "dmesg" in r.failure.hint
    # The ChildFailedError report's "Signal 9 (SIGKILL)" alone says the same.
    alone = analyze_bytes(b"  traceback : Signal 9 (SIGKILL) received by PID 4412\n")
    assert alone.failure.cause == "host_oom"
    # Another signal is not an OOM kill.
    other = analyze_bytes(b"ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -6) local_rank: 0\n")
    assert other.failure is None or other.failure.cause != "host_oom"


def test_hf_trainer_steps_over_total_optimization_steps() -> None:
    r = analyze_file(FIXTURES / "hf_trainer_total_steps_loss_step.log")
    assert r.phase == "training"
    assert (r.progress.done, r.progress.total, r.progress.label) == (110, 564, "step")


def test_repeated_stall_notices_are_a_hang_and_one_is_not() -> None:
    lines = (FIXTURES / "vllm_shm_broadcast_stall.log").read_bytes().split(b"\n")
    r = analyze_bytes(b"\n".join(lines))
    assert (r.failure.cause, r.failure.line, r.engine) == ("hang", 3, "vllm")
    assert (r.progress.done, r.progress.total) == (0, 16)
    once = analyze_bytes(b"\n".join(lines[:3]) + b"\n")
    assert once.failure is None


def test_megatron_iterations_are_training_progress() -> None:
    r = analyze_file(FIXTURES / "megatron_iteration_log.log")
    assert (r.phase, r.failure) == ("training", None)
    assert (r.progress.done, r.progress.total) == (200, 50000)


def test_nccl_ib_completion_error() -> None:
    r = analyze_file(FIXTURES / "nccl_ib_completion_error.log")
    assert (r.failure.cause, r.failure.line) == ("nccl", 2)
    assert "ibstat" in r.failure.hint


def test_gsp_heartbeat_timeout_is_a_gpu_fault() -> None:
    r = analyze_file(FIXTURES / "dmesg_gsp_timeout.log")
    assert (r.failure.cause, r.failure.line) == ("gpu_fault", 2)


def test_device_side_assert_line_is_the_root_cause() -> None:
    r = analyze_file(FIXTURES / "sglang_device_assert.log")
    assert (r.failure.cause, r.failure.line) == ("cuda_error", 2)
    assert "assert" in r.failure.hint


def test_pip_box_drawn_build_failure() -> None:
    r = analyze_file(FIXTURES / "pip_bdist_wheel_failed.log")
    assert (r.failure.cause, r.failure.line) == ("build_failed", 2)


def test_key_lines_for_a_post_mortem() -> None:
    r = analyze_file(FIXTURES / "torchrun_worker_sigkill.log").to_json()
    kinds = {k["kind"]: k for k in r["key_lines"]}
    assert kinds["root_cause"]["line"] == 4 and "exitcode: -9" in kinds["root_cause"]["text"]
    assert kinds["first_error"]["line"] == 4
    assert kinds["last_progress"]["line"] == 2 and "3/7" in kinds["last_progress"]["text"]
    ready = analyze_file(FIXTURES / "sglang_startup_ready.log").to_json()
    (line,) = [k["line"] for k in ready["key_lines"] if k["kind"] == "ready"]
    assert line == ready["ready_line"]


def test_ray_memory_monitor_kill_is_host_oom_not_cuda() -> None:
    r = analyze_file(FIXTURES / "ray_node_oom_worker_killed.log")
    assert (r.failure.cause, r.failure.line) == ("host_oom", 2)
    assert "host RAM" in r.failure.hint


def test_kv_cache_too_small_for_the_max_length() -> None:
    r = analyze_file(FIXTURES / "vllm_kv_cache_too_small_for_max_len.log")
    assert (r.failure.cause, r.failure.line) == ("cuda_oom", 3)
    assert "--max-model-len" in r.failure.hint


def test_container_shm_too_small_for_nccl() -> None:
    r = analyze_file(FIXTURES / "container_shm_and_oomkilled.log")
    assert (r.failure.cause, r.failure.line) == ("nccl", 2)
    assert "--shm-size" in r.failure.hint
    assert analyze_bytes(b"Bus error (core dumped)\n").failure.hint.count("--shm-size") == 1
    assert analyze_bytes(b"    Last State:  Terminated\n      Reason:    OOMKilled\n").failure.cause == "host_oom"


def test_exception_types_named_failed() -> None:
    r = analyze_file(FIXTURES / "dynamo_backend_compiler_failed.log")
    assert (r.failure.cause, r.failure.line, r.phase) == ("exception", 5, "failed")
    assert "BackendCompilerFailed" in r.failure.message


def test_gpu_memory_already_taken_is_cuda_oom_with_who_holds_it() -> None:
    r = analyze_file(FIXTURES / "vllm_gpu_memory_taken.log")
    assert (r.failure.cause, r.failure.line) == ("cuda_oom", 3)
    assert "another process" in r.failure.hint


def test_port_in_use_after_startup() -> None:
    r = analyze_file(FIXTURES / "uvicorn_port_in_use.log")
    assert (r.failure.cause, r.failure.line, r.phase) == ("exception", 4, "failed")
    assert "--port" in r.failure.hint


def test_sglang_dead_scheduler_is_the_failure() -> None:
    r = analyze_file(FIXTURES / "sglang_scheduler_dead.log")
    assert (r.engine, r.failure.cause, r.failure.line) == ("sglang", "exception", 2)
