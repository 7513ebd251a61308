"""Scores `gpudeck analyze` against the real excerpts in shared/reference-logs (skipped when that folder is absent).

Each reference file opens with `# source:` and `# expect:` lines (what a careful operator
concludes). The expectations below were derived by hand from those `# expect:` lines; the
two header lines are blanked (not removed) before analysis, so line numbers still count them.

    python bench/eval_reference_logs.py [FOLDER] [--verbose]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gpudeck.jobs.logs.analyze import LogAnalyzer  # noqa: E402

DEFAULT_FOLDER = ROOT.parent / "shared" / "reference-logs"

# file-name prefix -> expected fields. "line" may be an int or a (first, last) range.
# Only what the expect line states (or plainly implies) is checked.
EXPECTATIONS: dict[str, dict[str, Any]] = {
    "02": {"engine": "vllm", "phase": "ready", "ready_line": 13, "failure": None},
    "04": {"engine": "vllm", "phase": "starting", "ready_line": None, "failure": None},
    "05": {"engine": "sglang", "phase": "starting", "ready_line": None, "failure": None,
           "progress": (52, 52)},
    "07": {"engine": "sglang", "phase": "ready", "failure": None,
           "serving": {"running": (1, 1), "waiting": (0, 0), "spec_accept_len": (1.6, 2.2),
                       "spec_accept_rate": (0.4, 0.54), "gen_tokens_per_s": (165, 189)},
           "no_warning": "spec_decode_ineffective"},
    "11": {"engine": "vllm", "phase": "failed", "cause": "cuda_oom", "line": 9},
    "12": {"engine": "vllm", "phase": "failed", "cause": "exception", "line": 20},
    "13": {"engine": "sglang", "phase": "failed", "cause": "nccl", "line": 15},
    "15": {"phase": "failed", "cause": "nccl", "line": 8},
    "16": {"engine": "sglang", "phase": "failed", "cause": "import_error", "line": 15,
           "message_has": "undefined symbol"},
    "19": {"phase": "failed", "cause": "host_oom", "line": 14, "progress": (29, 100),
           "hint_has": "MAX_JOBS"},
    "22": {"phase": "building", "failure": None, "progress": None},
    "24": {"phase": "training", "failure": None, "progress": (320, None)},
    "25": {"phase": "training", "failure": None, "progress": (0.09, None)},
    "28": {"engine": "vllm", "phase": "compiling", "failure": None, "ready_line": None, "progress": (9, 9)},
    "29": {"engine": "sglang", "phase": "loading", "failure": None, "progress": (13, 55)},
    "30": {"phase": "loading", "failure": None, "progress": (153, 191)},
    "31": {"engine": "sglang", "phase": "capturing", "failure": None, "progress": (0, 52)},
    "33": {"phase": "capturing", "failure": None, "progress": (0, 17)},
    "37": {"engine": "vllm", "phase": "failed", "cause": "bad_arguments", "line": 8},
    "38": {"phase": "failed", "cause": "gpu_fault", "line": (3, 5)},
    # 39: a py-spy dump of a stalled EngineCore: no error is logged (the stall is the telemetry's to see)
    "39": {"engine": "vllm", "phase": "starting", "failure": None},
    "40": {"engine": "sglang", "phase": "failed", "cause": "exception", "line": 3, "progress": (8, 28)},
    "42": {"engine": "vllm", "phase": "ready", "failure": None,
           "serving": {"running": (1, 1), "spec_accept_len": (2.63, 2.66), "spec_accept_rate": (0.32, 0.34),
                       "gen_tokens_per_s": (123, 125)},
           "no_warning": "spec_decode_ineffective"},
    "45": {"engine": "sglang", "phase": "failed", "cause": "hang", "line": 4},
    # 71-102: formats and failure shapes the analyser was not tuned on (see the folder's README).
    "71": {"engine": "vllm", "phase": "ready", "failure": None, "warning": "spec_decode_ineffective",
           "serving": {"running": (2, 2), "spec_accept_rate": (0, 0)}},
    "72": {"engine": "vllm", "phase": "capturing", "failure": None, "progress": (37, 51)},
    "73": {"engine": "vllm", "phase": "starting", "failure": None, "ready_line": None, "progress": (35, 35)},
    "74": {"engine": "sglang", "phase": "loading", "failure": None, "progress": (8, 17)},
    "75": {"engine": "sglang", "phase": "capturing", "failure": None, "progress": None},
    "76": {"engine": "sglang", "phase": "ready", "failure": None, "no_warning": "spec_decode_ineffective",
           "serving": {"spec_accept_len": (2.63, 3.05), "spec_accept_rate": (0.54, 0.68), "running": (22, 24),
                       "waiting": (2, 4), "kv_cache_pct": (63, 66)}},
    "77": {"engine": "vllm", "phase": "failed", "cause": "exception", "line": 7,
           "message_has": "No supported CUDA architectures"},
    "78": {"engine": "vllm", "phase": "capturing", "failure": None, "progress": (21, 83)},
    "79": {"engine": "vllm", "phase": "capturing", "failure": None, "progress": (8, 67)},
    "80": {"engine": "vllm", "phase": "starting", "failure": None},
    "81": {"engine": "vllm", "phase": ("starting", "compiling"), "failure": None},
    "82": {"phase": "failed", "cause": "build_failed", "line": 5, "progress": None},
    "83": {"phase": "failed", "cause": "host_oom", "line": 3, "hint_has": "dmesg", "progress": (4, 7)},
    "84": {"phase": "failed", "cause": "nccl", "line": 3},
    "85": {"phase": "failed", "cause": "nccl", "line": 10},
    "86": {"phase": "failed", "cause": "nccl", "line": 3},
    "87": {"phase": "training", "failure": None, "progress": (10, 1000000)},
    "88": {"phase": "failed", "cause": "cuda_error", "line": 15},
    "89": {"phase": "training", "failure": None, "progress": (4, 9)},
    "90": {"phase": "failed", "cause": "gpu_fault", "line": (5, 12)},
    "91": {"engine": "sglang", "phase": "failed", "cause": "cuda_error", "line": (3, 4)},
    "92": {"engine": "vllm", "phase": "starting", "failure": None, "progress": None},
    "93": {"engine": "vllm", "phase": "failed", "cause": "exception", "line": 6, "progress": (41, 49)},
    "94": {"engine": "sglang", "phase": "compiling", "failure": None},
    "95": {"engine": "sglang", "phase": "failed", "cause": "exception", "line": 3},
    "96": {"engine": "sglang", "phase": ("capturing", "compiling"), "failure": None, "ready_line": None},
    "97": {"phase": "training", "failure": None, "progress": (382, 2724)},
    "98": {"phase": "failed", "cause": "build_failed", "line": (3, 5)},
    "99": {"phase": "failed", "cause": "build_failed", "line": 3, "progress": None},
    "100": {"engine": "vllm", "phase": "failed", "cause": "hang", "line": (4, 7), "progress": (0, 4)},
    "101": {"engine": "vllm", "phase": "failed", "cause": "exception", "line": 13},
    "102": {"engine": "vllm", "phase": "ready", "failure": None, "warning": "kv_cache_pressure",
            "serving": {"kv_cache_pct": (87.7, 98.4), "waiting": (23, 43)}},
}


def labelled_expectations(folder: Path) -> dict[str, dict[str, Any]]:
    """labels.json's readings (file name -> expectation) in EXPECTATIONS' schema: phase/cause may be tuples (any of)."""
    labels_path = folder / "labels.json"
    if not labels_path.is_file():
        return {}
    import json
    out: dict[str, dict[str, Any]] = {}
    for name, label in json.loads(labels_path.read_text()).items():
        if name.startswith("_"):
            continue
        want: dict[str, Any] = {"phase": tuple(label["phase"])}
        cause = label.get("cause")
        if cause is None:
            want["failure"] = None
        else:
            want["cause"] = tuple(cause) if isinstance(cause, list) else cause
        if label.get("progress") is not None:
            want["progress"] = tuple(label["progress"])
        if label.get("engine") is not None:
            want["engine"] = label["engine"]
        if label.get("warning"):
            want["warning"] = label["warning"]
        out[name] = want
    return out


def _order(path: Path) -> tuple[int, str]:
    head = path.name.split("_", 1)[0]
    digits = "".join(ch for ch in head if ch.isdigit())
    return (int(digits) if digits else 0, head)


def analyze_reference(path: Path) -> dict[str, Any]:
    """The analysis as JSON, plus `decided_by`: which signature decided each field."""
    data = path.read_bytes()
    lines = data.split(b"\n")
    # Blank the `# source:` / `# expect:` header but keep its two line numbers.
    for i in range(min(2, len(lines))):
        if lines[i].startswith(b"# "):
            lines[i] = b""
    analyzer = LogAnalyzer()
    analyzer.feed(b"\n".join(lines))
    analyzer.finish()
    result = analyzer.result()
    return {**result.to_json(), "decided_by": dict(result.decided_by)}


def _close(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return abs(float(a) - float(b)) < 1e-6


def check(expect: dict[str, Any], got: dict[str, Any]) -> list[str]:
    """The list of mismatches (empty when the analysis says what the expect line says)."""
    misses: list[str] = []
    failure = got.get("failure")
    for key, want in expect.items():
        if key in ("engine", "phase", "ready_line"):
            if got.get(key) != want and not (isinstance(want, tuple) and got.get(key) in want):
                misses.append(f"{key}: want {want!r}, got {got.get(key)!r}")
        elif key == "failure":
            if failure is not None:
                misses.append(f"failure: want none, got {failure['cause']} at line {failure['line']}")
        elif key == "cause":             # (a list may hold null: "no failure" is one of the readings)
            got_cause = failure and failure["cause"]
            if got_cause != want and not (isinstance(want, tuple) and got_cause in want):
                misses.append(f"cause: want {want}, got {got_cause}")
        elif key == "line":
            line = failure and failure["line"]
            lo, hi = want if isinstance(want, tuple) else (want, want)
            if not isinstance(line, int) or not lo <= line <= hi:
                misses.append(f"line: want {want}, got {line}")
        elif key in ("message_has", "hint_has"):
            field = "message" if key == "message_has" else "hint"
            if failure is None or want not in failure[field]:
                misses.append(f"{field}: want it to mention {want!r}")
        elif key == "progress":
            prog = got.get("progress")
            if want is None:
                if prog is not None:
                    misses.append(f"progress: want none, got {prog['done']}/{prog['total']}")
            elif prog is None or not (_close(prog["done"], want[0]) and _close(prog["total"], want[1])):
                misses.append(f"progress: want {want[0]}/{want[1]}, got "
                              f"{prog and (str(prog['done']) + '/' + str(prog['total']))}")
        elif key == "serving":
            serving = got.get("serving") or {}
            for name, (lo, hi) in want.items():
                value: Optional[float] = serving.get(name)
                if value is None or not lo - 1e-9 <= value <= hi + 1e-9:
                    misses.append(f"serving.{name}: want {lo}..{hi}, got {value}")
        elif key == "warning":
            if not any(w["code"] == want for w in got.get("warnings", [])):
                misses.append(f"warning {want} not raised")
        elif key == "no_warning":
            if any(w["code"] == want for w in got.get("warnings", [])):
                misses.append(f"warning {want} raised on a healthy log")
    return misses


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", default=str(DEFAULT_FOLDER))
    parser.add_argument("--verbose", "-v", action="store_true", help="print each analysis as JSON")
    args = parser.parse_args(argv)
    folder = Path(args.folder)
    if not folder.is_dir():
        print(f"skipped: {folder} not found")
        return 0
    ok = total = 0
    labelled = labelled_expectations(folder)
    for path in sorted(folder.glob("*.log"), key=_order):
        expect = EXPECTATIONS.get(path.name.split("_", 1)[0]) or labelled.get(path.name)
        if expect is None:
            print(f"----  {path.name}: no expectation encoded (analysed only)")
            continue
        got = analyze_reference(path)
        misses = check(expect, got)
        total += 1
        ok += not misses
        print(f"{'OK  ' if not misses else 'MISS'}  {path.name}" + ("" if not misses else ": " + "; ".join(misses)))
        for field, signature in got["decided_by"].items():
            print(f"        {field:10s} <- {signature}")
        if args.verbose:
            import json
            print("      " + json.dumps(got))
    print(f"score: {ok}/{total}")
    return 0 if ok == total else 1


if __name__ == "__main__":
    raise SystemExit(main())
