"""Messages mined from the engines' and tools' own sources across releases, read right behind every prefix.

tests/fixtures/mined/*.json lists, per source, the log calls read in vLLM's and SGLang's code at
several releases (startup, loading, compile, capture, ready, stats, watchdog, failures) and the
console lines of the tools around them (torch elastic, c10d, NCCL, DeepSpeed, HF Trainer and Hub,
ninja, CMake, pip, nvcc, the OOM killer, Slurm, containers): each message as printed with sample
arguments, and what an operator reads from it. Each is formatted under every logger prefix its
engine has printed, and under wrappers nobody enumerated, after the engine's startup line; the
analyzer must read what the entry expects. A wording the table misses is a failing message here.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpudeck.jobs.logs.analyze import CAUSES, PHASES, SERVING_KEYS, WARNING_CODES, analyze_bytes

MINED = Path(__file__).parent / "fixtures" / "mined"

# What each engine's logger has put before a message, across releases ({level}: the message's).
OWN_PREFIXES = {
    "vllm": ["{level} 06-02 14:00:15 llm_engine.py:161] ",                           # V0, 0.4-0.6
             "{level} 03-11 10:00:00 [core.py:93] ",                                  # 0.7+
             "(EngineCore_DP0 pid=20) {level} 11-01 10:00:00 [core.py:93] ",          # V1 engine core
             "(VllmWorker rank=1 pid=31) {level} 11-01 10:00:00 [gpu_model_runner.py:1] ",
             "(APIServer pid=1) {level} 11-01 10:00:00 [api_server.py:1] ",
             "(ApiServer_1 pid=2) {level} 11-01 10:00:00 [api_server.py:1] "],     # --api-server-count > 1
    "sglang": ["[2024-08-01 10:00:00 TP0] ", "[2025-10-01 10:00:00 DP0 TP3] ", "[2026-05-02 10:00:00 PP1 TP1] ",
               "[2025-10-01 10:00:00] ", "[gpu=0] "],                               # 0.2's ModelTpServer lines
    "tools": [""],
}
# The startup line each source's log begins with (the engine is known from there on).
BANNERS = {"vllm": "vLLM API server version 0.11.0", "sglang": "server_args=ServerArgs(model_path='/models/m', tp_size=2)"}
# Wrappers outside the record, none of them the engine's: an IDE's CMake runner, docker compose,
# kubectl --prefix, a viewer's line number, torchrun --tee, a quoted paste.
WRAPPERS = ["", "[build] ", "web-1  | ", "pod/x-7f9 ", "  12 | ", "[default0]:", "> "]

KEYS = {"phase", "cause", "progress", "serving", "warning", "benign"}


def _sources() -> list[dict]:
    return [json.loads(p.read_text(encoding="utf-8")) for p in sorted(MINED.glob("*.json"))]


def _messages() -> list[tuple[str, dict]]:
    return [(doc["source"], m) for doc in _sources() for m in doc["messages"]]


def _log(source: str, message: dict, own: str, wrapper: str) -> tuple[bytes, int]:
    """The log (the banner, then the message) and the message's line number."""
    lines = [wrapper + own.format(level="INFO") + BANNERS[source]] if source in BANNERS else []
    lines.append(wrapper + own.format(level=message.get("level") or "INFO") + message["line"])
    return ("\n".join(lines) + "\n").encode(), len(lines)


def _misreadings(r: Any, expect: dict, line: int) -> list[str]:
    out = []
    if "phase" in expect and r.phase != expect["phase"]:
        out.append(f"phase {r.phase}, not {expect['phase']}")
    if "cause" in expect:
        got = (r.failure.cause, r.failure.line) if r.failure else None
        if got != (expect["cause"], line):
            out.append(f"failure {got}, not ({expect['cause']!r}, {line})")
    if expect.get("benign") and r.failure is not None:
        out.append(f"failure {r.failure.cause} at {r.failure.line}, not none")
    if "progress" in expect:
        got = (r.progress.done, r.progress.total) if r.progress else None
        if got != tuple(expect["progress"]):
            out.append(f"progress {got}, not {tuple(expect['progress'])}")
    for key, value in (expect.get("serving") or {}).items():
        got = getattr(r.serving, key, None) if r.serving else None
        if got is None or abs(got - value) > 1e-6 * max(1.0, abs(value)):
            out.append(f"serving {key} {got}, not {value}")
    if "warning" in expect and expect["warning"] not in [w.code for w in r.warnings]:
        out.append(f"warnings {[w.code for w in r.warnings]}, no {expect['warning']}")
    return out


def test_the_mined_messages_are_well_formed() -> None:
    docs = _sources()
    assert {d["source"] for d in docs} >= {"vllm", "sglang", "tools"}
    for doc in docs:
        if doc["source"] in ("vllm", "sglang"):
            assert len({r["name"] for r in doc["releases"]}) >= 3, f"{doc['source']}: three releases read"
        ids = [m["id"] for m in doc["messages"]]
        assert len(ids) == len(set(ids)), f"{doc['source']}: ids repeat"
        for m in doc["messages"]:
            expect = m["expect"]
            assert expect and set(expect) <= KEYS, (m["id"], expect)
            assert expect.get("phase", "starting") in PHASES and expect.get("cause", "exception") in CAUSES, m["id"]
            assert set(expect.get("serving") or {}) <= set(SERVING_KEYS), m["id"]
            assert expect.get("warning", "oom_risk") in WARNING_CODES, m["id"]
            assert "\n" not in m["line"] and len(m["line"]) < 1000, m["id"]


@pytest.mark.parametrize("source,message", _messages(), ids=lambda v: v if isinstance(v, str) else v["id"])
def test_a_mined_message_reads_right_behind_every_prefix(source: str, message: dict) -> None:
    wrong = []
    for own in OWN_PREFIXES[source]:
        for wrapper in WRAPPERS:
            data, line = _log(source, message, own, wrapper)
            wrong += [f"{(wrapper + own)!r}: {w}" for w in _misreadings(analyze_bytes(data), message["expect"], line)]
    assert not wrong, f"{message['line']!r}\n" + "\n".join(wrong)
