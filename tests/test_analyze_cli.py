"""`gpudeck analyze` as a real process, and the reference-log evaluation (skipped when shared/reference-logs is absent)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "logs"
REFERENCE = ROOT.parent / "shared" / "reference-logs"


def gpudeck(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpudeck.console", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def test_json_has_exactly_the_documented_shape() -> None:
    proc = gpudeck("analyze", "--json", str(FIXTURES / "build_ninja_cc1plus_killed.log"))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert set(data) == {"engine", "phase", "progress", "failure", "ready_line", "serving", "warnings", "key_lines"}
    # key_lines: the post-mortem's lines, each {kind, line, text}
    assert data["key_lines"][0] == {"kind": "root_cause", "line": 10,
                                    "text": "c++: fatal error: Killed signal terminated program cc1plus"}
    assert {k["kind"] for k in data["key_lines"]} <= {"root_cause", "first_error", "last_progress", "ready"}
    assert all(set(k) == {"kind", "line", "text"} for k in data["key_lines"])
    assert set(data["progress"]) == {"done", "total", "label", "rate", "eta_s"}
    assert data["failure"] == {"cause": "host_oom", "line": 10,
                               "message": "c++: fatal error: Killed signal terminated program cc1plus",
                               "hint": data["failure"]["hint"]}
    assert data["warnings"][0]["code"] == "oom_risk"


def test_json_serving_keys() -> None:
    data = json.loads(gpudeck("analyze", "--json", str(FIXTURES / "sglang_startup_ready.log")).stdout)
    assert set(data["serving"]) == {"running", "waiting", "kv_cache_pct", "gen_tokens_per_s",
                                    "prompt_tokens_per_s", "spec_accept_rate", "spec_accept_len"}


def test_human_output_names_cause_line_and_hint() -> None:
    proc = gpudeck("analyze", str(FIXTURES / "vllm_engine_core_oom.log"))
    assert proc.returncode == 0
    assert "FAILED:   cuda_oom at line 8" in proc.stdout
    assert "hint:" in proc.stdout and "engine:   vllm" in proc.stdout


def test_human_output_progress_with_eta() -> None:
    out = gpudeck("analyze", str(FIXTURES / "training_epoch_step_total.log")).stdout
    assert "progress: epoch 2 step 200/500 (40%)" in out and "ETA 10m00s" in out


def test_missing_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    proc = gpudeck("analyze", str(tmp_path / "nope.log"))
    assert proc.returncode == 2
    assert proc.stdout == "" and proc.stderr.count("\n") == 1 and proc.stderr.startswith("gpudeck: ")


def test_directory_is_exit_2(tmp_path: Path) -> None:
    proc = gpudeck("analyze", str(tmp_path))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


def test_escape_sequences_in_messages_do_not_reach_the_terminal(tmp_path: Path) -> None:
    log = tmp_path / "evil.log"
    log.write_bytes(b"ValueError: \x1b]0;pwned\x07\x1b[2J boom \x9b31m\n")
    out = gpudeck("analyze", str(log)).stdout
    assert "\x1b" not in out and "\x07" not in out and "boom" in out


@pytest.mark.skipif(not REFERENCE.is_dir(), reason="shared/reference-logs not present")
def test_reference_logs_all_read_right() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "eval_reference_logs.py"), str(REFERENCE)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "MISS" not in proc.stdout


def test_eval_script_skips_when_folder_absent(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "eval_reference_logs.py"), str(tmp_path / "none")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.startswith("skipped")


def test_eval_script_reads_a_label_whose_causes_include_no_failure(tmp_path: Path) -> None:
    # labels.json's cause may be a list holding null: "no failure" is then one accepted reading, as is each cause
    (tmp_path / "a_clean.log").write_text("INFO step 10/100 loss 1.25\n")
    (tmp_path / "b_oom.log").write_text("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    labels = {"a_clean.log": {"phase": ["training", "failed"], "cause": ["exception", None]},
              "b_oom.log": {"phase": ["failed"], "cause": ["exception", None]}}
    (tmp_path / "labels.json").write_text(json.dumps(labels))
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "eval_reference_logs.py"), str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert "OK    a_clean.log" in proc.stdout and "MISS  b_oom.log: cause: want ('exception', None), got cuda_oom" \
        in proc.stdout, proc.stdout
    assert "score: 1/2" in proc.stdout and proc.returncode == 1
