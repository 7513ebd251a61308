"""Differential test: today's analyzer against the one the "read" issue started from, on every fixture and reference log.

Every difference is a fix named here (and in the commit that made it); anything else is a regression.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import diff_analyze  # noqa: E402

from gpudeck.jobs.logs.analyze import signatures  # noqa: E402

ROW_IDS = {r.id for r in signatures.TABLE}

# (log, field) -> today's reading, each a fix of the "read" issue.
FIXES = {
    # cause.py rule 6: a request's traceback ends on its exception line (or a chain's joint): the engine's after it is the run's
    ("fixture vllm_v0_request_error_then_engine_loop_dies.log", "failure"): ("exception", 15),
    ("fixture vllm_v0_request_error_then_engine_loop_dies.log", "warnings"): ["request_error"],
    # ENGINE_SELF_KILL: SGLang's `Dumping requests before crash` comes just before it kills its tree: the Killed is its own
    ("fixture sglang_tp_oom_decode_line_then_crash_dump_killed.log", "failure"): ("cuda_oom", 7),
    ("fixture sglang_tp_oom_decode_line_then_crash_dump_killed.log", "warnings"): [],
    # verl's `Total training steps: 934` names the total its `step:42 - … pg_loss` lines count to
    ("fixture verl_total_training_steps_then_step_lines.log", "progress"): (42, 934, "step"),
    # fairseq's `epoch 004:    1600 / 2211 loss=…`: the count right after the epoch's colon is its step
    ("fixture fairseq_epoch_count_min_loss_scale.log", "progress"): (1600, 2211, "epoch 4 step"),
    # a newer step beside a loss (DeepSpeed's `step=410, … lr=`) wins over the epoch's `Epoch 1/1` printed when it began
    ("fixture deepspeed_chat_epoch_banner_then_steps.log", "progress"): (410, None, "step"),
    # State.warming: SGLang's own warmup request's Prefill batch line (uvicorn up, no `fired up` yet) is no serving
    ("fixture sglang_stuck_at_warmup_prefill.log", "phase"): "starting",
    ("fixture sglang_stuck_at_warmup_prefill.log", "progress"): (4, 4, "Capturing batches (bs=1 avail_mem=39.77 GB)"),
    # uvicorn_listening: `Uvicorn running on` after `Application startup complete` (uvicorn's order) leaves vLLM ready
    ("fixture vllm_startup_complete_then_uvicorn_running.log", "phase"): "ready",
    # build_steps: pip's `Preparing metadata (setup.py)` runs setup.py, a build: its exception is build_failed
    ("fixture pip_metadata_cuda_home_unset.log", "failure"): ("build_failed", 14),
    # a word-labelled count after the epoch (`epoch 2/20 | batch 340/1563`) is the finer one: read as the step
    ("fixture train_epoch_and_batch_counts_cublas_failed.log", "progress"): (340, 1563, "epoch 2 step"),
    # every bar of a line of glued redraws is read (the fourth was the last read): the last is the latest
    ("fixture sglang_capture_eleven_glued_redraws.log", "progress"): (11, 52, "Capturing batches (bs=336 avail_mem=57.38 GB)"),
    # NCCL's `remote process exited` / ncclRemoteError is another rank's death: that rank's earlier error decides
    ("fixture torchrun_rank_keyerror_then_nccl_remote_exit.log", "failure"): ("exception", 8),
    # cause.py rule 6: a client's openai.BadRequestError traceback after the ready server's log is the client's
    ("fixture vllm_ready_then_client_bad_request_traceback.log", "failure"): None,
    ("fixture vllm_ready_then_client_bad_request_traceback.log", "phase"): "ready",
    ("fixture vllm_ready_then_client_bad_request_traceback.log", "warnings"): ["request_error"],
    # vllm_stats: V1's `Preemptions: N` (printed only when some were) is KV cache pressure
    ("fixture vllm_v1_stats_preemptions.log", "warnings"): ["kv_cache_pressure"],
    # a full `(mixed prefill-decode, PIECEWISE)` capture bar leaves vLLM V1 capturing: its FULL bar comes next
    ("fixture vllm_v1_between_piecewise_and_full_capture.log", "phase"): "capturing",
    # cause.py rule 3: a GPU's hardware fault explains the CUDA error before it in the paste (dmesg after the log)
    ("fixture vllm_cuda_error_then_pasted_dmesg_xid79.log", "failure"): ("gpu_fault", 7),
    # KILLED_EXIT: vLLM V1's `Failed core proc(s): {'EngineCore_DP0': -9}`, SIGKILL while loading
    ("fixture vllm_v1_engine_core_sigkilled_loading.log", "failure"): ("host_oom", 16),
    # ENGINE_SELF_KILL: SGLang 2026's `SIGQUIT received. … one child failed`; the other DP rank's stats line
    # just before it proved no recovery
    ("fixture sglang_dp_rank_oom_then_sigquit_2026.log", "failure"): ("cuda_oom", 10),
    ("fixture sglang_dp_rank_oom_then_sigquit_2026.log", "warnings"): [],
    # sglang_stats: a hybrid model's fuller pool (`swa token usage: 0.99`) binds
    ("fixture sglang_hybrid_swa_pool_full.log", "warnings"): ["kv_cache_pressure"],
    ("fixture sglang_hybrid_swa_pool_full.log", "serving"): {"running": 64.0, "waiting": 37.0, "kv_cache_pct": 99.0,
                                                              "gen_tokens_per_s": 1822.7, "prompt_tokens_per_s": None,
                                                              "spec_accept_rate": None, "spec_accept_len": None},
    # IMPORT: torch.ops of vLLM's `_C` that never loaded (`'_OpNamespace' '_C' object has no attribute`)
    ("fixture vllm_c_extension_abi_warning_then_op_missing.log", "failure"): ("import_error", 12),
    # cause.py rule 1: a command, environment settings and a repro's source are no events of the run
    ("fixture pasted_command_env_repro_then_loading.log", "failure"): None,
    ("fixture pasted_command_env_repro_then_loading.log", "phase"): "loading",
    # TORCH_RERAISED: a DataLoader worker's re-raise is an envelope of its `Original Traceback`'s error
    ("fixture dataloader_worker_stale_nfs_handle.log", "failure"): ("exception", 17),
    # an unlabeled bar after transformers' `Loading checkpoint shards` is no CUDA-graph capture (lm-eval's),
    # and a bar naming no phase after that load ended it is no longer loading (_labelled_bar)
    ("fixture lm_eval_hf_model_midway.log", "phase"): "unknown",
    # sglang_ready: the Rust routers' `Router ready | workers: [...]` serves
    ("fixture sglang_router_ready_serving.log", "phase"): "ready",
    ("fixture sglang_router_ready_serving.log", "ready_line"): 6,
    # jit_compile: vLLM on TPU precompiling its padded shapes; Gaudi's `[Warmup][Decode][9/32]` buckets
    ("fixture vllm_tpu_xla_precompile.log", "phase"): "compiling",
    ("fixture vllm_gaudi_warmup_buckets.log", "phase"): "compiling",
    ("fixture vllm_gaudi_warmup_buckets.log", "progress"): (9, 32, "Warmup Decode"),
    # cause.py rule 3: a CUDA OOM after DeepSpeed's failed op-builder link probe is no consequence of it
    ("fixture deepspeed_op_probe_then_cuda_oom.log", "failure"): ("cuda_oom", 12),
    # rich bar n/N: Lightning's RichProgressBar counts batches after its glyphs; `Epoch 3/9` labels it
    ("fixture lightning_rich_progress_bar.log", "progress"): (400, 1000, "Epoch 3/9"),
    # tgi_ready: text-generation-inference's router `… router/src/server.rs:2402: Connected` serves
    ("fixture tgi_v3_router_connected.log", "phase"): "ready",
    ("fixture tgi_v3_router_connected.log", "ready_line"): 13,
    # labelled [n/N]: of several counters the last, the finest, labelled with the ones before it
    ("fixture train_loop_epoch_step_brackets.log", "progress"): (300, 782, "Epoch 2 Step"),
    # server_listening: llama.cpp's `server is listening on http://…` and idle slots say it serves
    ("fixture llamacpp_server_ready_idle.log", "phase"): "ready",
    ("fixture llamacpp_server_ready_idle.log", "ready_line"): 17,
    # cause.py rule 6: vLLM's handler logged one request's ValueError and answered 400: a warning
    ("fixture serving_recovered_error.log", "warnings"): ["error_recovered", "request_error"],
    ("fixture sglang_asgi_request_exception_serves_on.log", "warnings"): ["request_error"],   # uvicorn's own words
    ("fixture sglang_asgi_request_exception_serves_on.log", "failure"): None,
    ("fixture sglang_asgi_request_exception_serves_on.log", "phase"): "ready",
    # trainer banners: torchtitan's `total steps 3000` is the run's total (its steps read n/None)
    ("fixture torchtitan_total_steps_banner.log", "progress"): (30, 3000, "step"),
    # a bar's label names its phase: a hub download's file name is loading (a full one made the next
    # bar capturing), Lightning's `Validation DataLoader 0` is training (its `Loader` read loading)
    ("fixture vllm_hub_download_file_bars.log", "phase"): "loading",
    ("fixture lightning_validation_after_dataset_prep.log", "phase"): "training",
    ("fixture build_ide_runner_prefixed_ninja.log", "progress"): (47, 230, "build"),      # [build] prefix
    ("fixture slurm_preempted.log", "progress"): (113, 230, "build"),                    # [build] prefix
    ("fixture pip_wheel_envelope_cmake_error.log", "failure"): ("build_failed", 12),     # not the numpy UserWarning
    ("fixture setup_py_calledprocess_ninja.log", "failure"): ("build_failed", 11),      # its own line, not the header
    # `%(asctime)s %(levelname)s %(message)s`: the level read, the message's own `Exception: ` kept
    ("fixture python_logging_level_then_exception.log", "failure"): ("exception", 3),
    ("fixture python_logging_level_then_exception.log", "phase"): "failed",
    ("fixture sglang_2026_pp_watchdog_timeout.log", "failure"): ("hang", 7),            # new watchdog words
    ("reference 14_vllm_nccl_watchdog_timeout_worker_died.log", "engine"): "vllm",      # behind a pasted '  | '
    ("reference 46_sglang_capture_jit_ninja_build_failed.log", "failure"): ("build_failed", 9),   # CalledProcessError
    ("reference 70_train_fairseq_multigpu_interleaved_tqdm.log", "progress"): (51, 11265, "epoch 001"),  # no '| '
    # NCCL's unhandled cuda error defers to the `Cuda failure 217 'peer access ...'` after `Last error:`
    ("reference 65_nccl_unhandled_cuda_error_peer_access.log", "failure"): ("cuda_error", 13),
    # CONFIG_REJECTED: a config check that names the launch option it rejects (its name says so too)
    ("reference 64_vllm_tp_not_divisible_bad_argument.log", "failure"): ("bad_arguments", 17),
    # the generic layer: a bare "label N/M" (no anchor before), any label that names what is counted
    ("fixture datagen_processing_shard_counter.log", "progress"): (3, 8, "Processing shard"),
    ("fixture datagen_processing_shard_counter.log", "phase"): "loading",               # "shard" names it
    ("fixture generic_exception.log", "progress"): (9800, 10000, "generated"),         # where datagen got to
    ("fixture launcher_exit_code_137.log", "progress"): (2, 8, "Packing shard"),
    ("fixture pipeline_returncode_minus9.log", "progress"): (1, 3, "stage"),
    # the generic layer: SIGKILL's exit code in HOST_OOM's missing spellings (KILLED_EXIT)
    ("fixture launcher_exit_code_137.log", "failure"): ("host_oom", 6),                # `Exit code: 137`
    ("fixture launcher_exit_code_137.log", "phase"): "failed",
    ("fixture pipeline_returncode_minus9.log", "failure"): ("host_oom", 4),            # `returncode=-9`
    ("fixture pipeline_returncode_minus9.log", "phase"): "failed",
    # record prefixes: DeepSpeed's bracketed `[WARNING]` is the record's level (a warning names no cause)
    ("fixture deepspeed_bracketed_warning_words.log", "phase"): "training",
    ("fixture deepspeed_bracketed_warning_words.log", "progress"): (400, 500, "training"),
    ("fixture deepspeed_bracketed_warning_words.log", "failure"): None,
    # record prefixes: journalctl -o short-iso's `<ISO> host unit[pid]: ` hid the vLLM header behind it
    ("fixture journald_short_iso_vllm_keyerror.log", "failure"): ("exception", 7),
    # record prefixes: `%(asctime)s %(levelname)s` (a space, no dash): a caught OOM's WARNING names no cause
    ("fixture pylogging_space_level_caught_oom.log", "phase"): "training",
    ("fixture pylogging_space_level_caught_oom.log", "failure"): None,
    # record prefixes: NeMo's `[NeMo W <ts> file:N]` and torchtitan's `[rank0]:[titan] <ts> - root - WARNING - `
    ("fixture nemo_tagged_warning_words.log", "phase"): "training",
    ("fixture nemo_tagged_warning_words.log", "failure"): None,
    ("fixture torchtitan_logger_tag_warning_words.log", "phase"): "training",
    ("fixture torchtitan_logger_tag_warning_words.log", "failure"): None,
    ("fixture vllm_compile_warmup_size.log", "phase"): "compiling",      # torch_compile: the size warmup
    ("fixture vllm_loading_drafter_model.log", "phase"): "loading",      # load_begin: the drafter
    # vLLM offline inference: its bars' labels name the engine (vllm_offline_bar) and a serving phase
    ("fixture vllm_offline_generate_bars.log", "engine"): "vllm",
    ("fixture vllm_offline_generate_bars.log", "phase"): "ready",
    # srun / slurmstepd's daemons not answering (SLURM_COMM)
    ("fixture slurm_srun_socket_timeout.log", "phase"): "failed",
    ("fixture slurm_srun_socket_timeout.log", "failure"): ("node_fail", 5),
    # NCCL's unhandled cuda error defers to the CUDA failure it names (`Last error:` ... 'out of memory')
    ("fixture nccl_unhandled_cuda_error_oom.log", "failure"): ("cuda_oom", 9),
    # ... and any other CUDA failure NCCL names (`Cuda failure 217 'peer access is not supported ...'`)
    ("fixture nccl_cuda_failure_peer_access.log", "failure"): ("cuda_error", 11),
    # an exception type ending in Timeout (requests' ReadTimeout)
    ("fixture hf_hub_read_timeout.log", "failure"): ("exception", 9),
    # SIGKILL as multiprocessing's exitcode (`terminated with -9`) and waitpid's status (`exitcode=9`)
    ("fixture sglang_scheduler_terminated_minus9.log", "failure"): ("host_oom", 4),
    ("fixture sglang_sigchld_exitcode_9.log", "phase"): "failed",
    ("fixture sglang_sigchld_exitcode_9.log", "failure"): ("host_oom", 4),
    # docker's json-file records read as the text they carry (envelope.py)
    ("fixture docker_json_file_vllm_syntax_error.log", "failure"): ("syntax_error", 10),
    ("fixture docker_json_file_vllm_syntax_error.log", "progress"): (2, 4, "Loading safetensors checkpoint shards"),
    # recovery: progress that starts after an error logged before any progress (a probe's traceback)
    ("fixture build_probe_traceback_then_steps.log", "phase"): "building",
    ("fixture build_probe_traceback_then_steps.log", "failure"): None,
    ("fixture build_probe_traceback_then_steps.log", "warnings"): ["error_recovered"],
    # recovery: a phase entered after a logged error (an optional import's traceback, then loading)
    ("fixture vllm_optional_import_traceback_then_load.log", "phase"): "loading",
    ("fixture vllm_optional_import_traceback_then_load.log", "failure"): None,
    ("fixture vllm_optional_import_traceback_then_load.log", "warnings"): ["error_recovered"],
    # indentation: a tab counts CODE_INDENT, so a tab-indented traceback's quoted source is no error line
    ("fixture vllm_traceback_tab_indented.log", "failure"): ("nccl", 7),
    # record prefixes: vLLM's header dated in full, or with no time (a logging config of its own)
    ("fixture vllm_logging_config_full_dates.log", "failure"): ("exception", 8),
    ("fixture vllm_logging_config_no_time.log", "failure"): ("exception", 8),
    # load_end: vLLM 0.4-0.6's "Loading model weights took 14.99 GB" ends the load
    ("fixture vllm_v0_weights_took_then_blocks.log", "phase"): "starting",
    ("reference 47_vllm_tp_workers_loaded_then_hang.log", "phase"): "starting",
    # vllm_source_path / sglang_source_path: a relative module path (py-spy's frames) names the engine
    ("fixture vllm_pyspy_dump_frames_only.log", "engine"): "vllm",
    ("fixture vllm_pyspy_dump_frames_only.log", "phase"): "starting",
    ("fixture sglang_pyspy_dump_frames_only.log", "engine"): "sglang",
    ("fixture sglang_pyspy_dump_frames_only.log", "phase"): "starting",
    # label_phase: a bar labelled by its loss (torchtune's `1|97|Loss: 1.07`) counts training steps
    ("fixture torchtune_lora_loss_labelled_bar.log", "phase"): "training",
    ("fixture torchtune_lora_loss_labelled_bar.log", "progress"): (97, 512, "Loss: 1.0731608867645264"),
    # label_phase: a dataset's file bar (`train-00004-of-00012.parquet`) is a download, not training
    ("fixture hf_datasets_parquet_files_download.log", "phase"): "loading",
    # TRL GRPO's rollouts: vLLM's own lines name the engine the trainer runs (its `Processed prompts` bar inside
    # the training run leaves the phase training: _labelled_bar)
    ("fixture trl_grpo_vllm_colocate_rollouts.log", "engine"): "vllm",
    # ready_mark: serving stats inside a training run are its rollout engine's (verl, OpenRLHF): still training
    ("fixture verl_ppo_vllm_rollout_stats.log", "phase"): "training",
    ("fixture verl_ppo_vllm_rollout_stats.log", "progress"): (7, 290, "step"),
    # LABELLED_BRACKET: a bracketed epoch between the label and the counter (mmengine's `Epoch(train)  [3][ 400/1250]`)
    ("fixture mmengine_epoch_train_iterations.log", "phase"): "training",
    ("fixture mmengine_epoch_train_iterations.log", "progress"): (300, 1163, "mmengine - INFO - Epoch(train)"),
    # KERAS_BAR: Keras' Progbar counts the epoch's batches (was: the `Epoch 2/20` line)
    ("fixture keras_fit_progbar_mid_epoch.log", "progress"): (233, 625, ""),
    # State._nest: HF Trainer's unlabeled evaluation bar inside its unlabeled training bar leaves the training count
    ("fixture hf_trainer_eval_loop_inside_training.log", "progress"): (400, 1200, "training"),
    # vllm_image (weak): a pod's `Image: vllm/vllm-openai:…` names the engine, and no phase
    ("fixture kubectl_describe_pod_pending_gpus.log", "engine"): "vllm",
    ("fixture kubectl_describe_vllm_pod_oomkilled.log", "engine"): "vllm",
    # OOM_RISK: `make -j 16` bounds its jobs (only a bare `-j` is unbounded)
    ("fixture make_bounded_jobs_no_oom_risk.log", "warnings"): [],
    # _PREFIX: torch's TORCH_LOGS header carries the compile id `[0/1]` (frame/recompile), no ninja step
    ("fixture torch_inductor_compile_id_header.log", "progress"): None,
    # dist_init: c10d's `Waiting in store based barrier to initialize process group` is a start under way
    ("fixture torch_store_barrier_still_waiting.log", "phase"): "starting",
    # EXC_LINE: a type of an `exc` module (torch._dynamo.exc.Unsupported) ends its traceback, not the umbrella above
    ("fixture vllm_dynamo_unsupported_data_dependent_branch.log", "failure"): ("exception", 13),
    # State._set_progress: a build series that completed, then the next extension's, counts past a probe's compile error
    ("fixture deepspeed_op_probe_compile_error_build_goes_on.log", "phase"): "building",
    ("fixture deepspeed_op_probe_compile_error_build_goes_on.log", "failure"): None,
    ("fixture deepspeed_op_probe_compile_error_build_goes_on.log", "warnings"): ["error_recovered"],
    # OOM_RISK: DeepSpeed ZeRO-3's `pytorch allocator cache flushes since last step` is GPU memory running out
    ("fixture deepspeed_zero3_allocator_cache_flushes_oom_risk.log", "warnings"): ["oom_risk"],
    ("fixture deepspeed_bracketed_warning_words.log", "warnings"): ["oom_risk"],
    # State._recovered: serving after a bare ERROR line (no exception: a KV transfer's) names it recovered from
    ("fixture vllm_error_line_then_serving_stats_recovered.log", "warnings"): ["error_recovered"],
    # LABELLED_BRACKET: a bare `[2300/50000]` before a loss is a training step (was: a ninja step behind the glog header)
    ("fixture absl_training_loop_bare_step_counter.log", "phase"): "training",
    ("fixture absl_training_loop_bare_step_counter.log", "progress"): (2300, 50000, "step"),
    # NOT_EVENTS before XID: `$ journalctl -k | grep -c "NVRM: Xid"` is a command, no Xid
    ("fixture prolog_grep_for_xid_then_training.log", "phase"): "training",
    ("fixture prolog_grep_for_xid_then_training.log", "failure"): None,
    # _PREFIX: TensorFlow's `…: W external/…/bfc_allocator.cc:291] ` is a WARNING (its "ran out of memory" no OOM)
    ("fixture tensorflow_bfc_not_a_failure_training.log", "phase"): "training",
    ("fixture tensorflow_bfc_not_a_failure_training.log", "failure"): None,
    # _HF_LOAD_BAR: diffusers' `Loading pipeline components` is a library's load: the bars after it are a script's
    ("fixture diffusers_pipeline_then_image_bars.log", "phase"): "unknown",
    # JIT: DeepGEMM's JIT pre-compile session (SGLang) is a JIT warm-up
    ("fixture sglang_deepgemm_jit_precompile_warning.log", "warnings"): ["jit_compile"],
    # build_steps: trtllm-build's `Build TensorRT engine` builds
    ("fixture trtllm_build_engine_in_progress.log", "phase"): "building",
    # stats_working: stats with requests running and no token made prove no recovery from the stall notices
    ("fixture vllm_stall_notices_then_stats_with_no_tokens.log", "phase"): "failed",
    ("fixture vllm_stall_notices_then_stats_with_no_tokens.log", "failure"): ("hang", 5),
    ("fixture vllm_stall_notices_then_stats_with_no_tokens.log", "warnings"): [],
    # label_phase: a `Convert to … format` bar (LMDeploy's TurboMind) converts the weights as they load
    ("fixture lmdeploy_turbomind_convert_weights_bar.log", "phase"): "loading",
}


def _named_by_its_fixture(name: str, field: str, after: object) -> bool:
    """A fixture whose header expects this very reading and names the table row that reads it (`# fix:
    ROW`, see diff_analyze.expectation) names the difference itself: adding a signature is one table row
    and one fixture, nothing listed here."""
    if not name.startswith("fixture "):
        return False
    want = diff_analyze.expectation((diff_analyze.FIXTURES / name[len("fixture "):]).read_bytes())
    return (want is not None and want["fix"] in ROW_IDS and field in want["expect"]
            and want["expect"][field] == diff_analyze.plain(after))


def _has_base() -> bool:
    if shutil.which("git") is None:
        return False
    return subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{diff_analyze.BASE}^{{commit}}"],
                          capture_output=True).returncode == 0


@pytest.mark.skipif(not _has_base(), reason="the base revision is not in this checkout")
def test_every_difference_from_the_base_analyzer_is_a_named_fix() -> None:
    got = {(name, field): after for name, field, _, after in diff_analyze.differences(diff_analyze.BASE)
           if (name, field) in FIXES or not _named_by_its_fixture(name, field, after)}
    have_reference = diff_analyze.REFERENCE.is_dir()
    want = {k: v for k, v in FIXES.items() if have_reference or k[0].startswith("fixture ")}
    assert got == want


def test_a_fixture_names_its_own_fix_only_for_a_row_of_the_table() -> None:
    data = b'# expect: {"phase": "failed", "failure": ["hang", 3]}\n# fix: HANG\nWatchdog timeout (x)\n'
    assert diff_analyze.expectation(data) == {"expect": {"phase": "failed", "failure": ["hang", 3]}, "fix": "HANG"}
    assert diff_analyze.expectation(b"Watchdog timeout (x)\n# expect: {}\n") is None     # a header only
    assert "HANG" in ROW_IDS and "NO_SUCH_ROW" not in ROW_IDS
