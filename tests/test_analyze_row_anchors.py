"""The failure rows' own wording is what the byte passes look for: no line a row decides is skipped."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gpudeck.jobs.logs.analyze import signatures, sparse
from gpudeck.jobs.logs.analyze.model import F, M, P
from gpudeck.jobs.logs.analyze.patterns import _COMMON_ANCHORS, _RARE_ANCHORS, FAMILY, prefilter_in, row_anchors
from gpudeck.jobs.logs.analyze.signatures import MARKERS, Context, classify

FIXTURES = Path(__file__).parent / "fixtures"


def test_an_alternative_without_an_anchor_gives_its_longest_required_literal() -> None:
    rx = re.compile(r"CUDA error|illegal memory access|Cuda failure \d* ?'|x{2,}(?:maybe this)?")
    assert row_anchors(rx, [b"CUDA"]) == [b"illegal memory access", b"Cuda failure"]


def test_required_literals_come_from_mandatory_groups_and_repeats_only() -> None:
    # inside a group and a + repeat: required; after ? or inside a nested alternation: not
    assert row_anchors(re.compile(r"(?:Scheduler process )+died(?: badly)?"), []) == [b"Scheduler process"]
    assert row_anchors(re.compile(r"(?:alpha beta|gamma delta) happened quietly"), []) == [b"happened quietly"]
    # digits split a literal (a template has them as 0s); one short word is everywhere
    assert row_anchors(re.compile(r"exit 137 abc"), []) == []
    assert row_anchors(re.compile(r"reaped"), []) == [] and row_anchors(re.compile(r"oom_reaper"), []) == [b"oom_reaper"]
    assert row_anchors(re.compile(r"Killed process 42 totally"), []) == [b"Killed process"]
    assert row_anchors(re.compile(r"(?i)out of memory"), []) == []          # case-insensitive: no exact literal


def test_an_anchor_of_another_family_does_not_cover_a_row() -> None:
    rx = re.compile(r"Loading weights now")
    assert row_anchors(rx, {b"Loading": M | P}, M) == []
    assert row_anchors(rx, {b"Loading": M | P}, F) == [b"Loading weights now"]


def test_the_table_adds_anchors_for_its_own_wording() -> None:
    added = set(signatures.ROW_ANCHORS)
    # NCCL's own CUDA failure line carries no listed anchor: the CUDA_ERR row's wording is one
    assert b"Cuda failure" in added and b"Could not build wheels for" in added
    assert FAMILY[b"fired up and ready to roll"] & M                       # a phase marker's: M
    assert all(not re.search(rb"\d", lit) and len(lit) >= 6 for lit in added)


def test_every_line_a_phase_marker_reads_holds_a_marker_anchor() -> None:
    lines = [seg for path in sorted((FIXTURES / "logs").glob("*.log")) for raw in path.read_bytes().split(b"\n")
             for seg in raw.split(b"\r") if seg.strip()]
    for path in sorted((FIXTURES / "mined").glob("*.json")):
        lines += [m["line"].encode() for m in json.loads(path.read_text())["messages"] if m.get("line")]
    marked = [line for line in lines if MARKERS.search(line.decode("utf-8", "replace"))]
    assert len(marked) > 100
    listed = [lit for lit, _ in _RARE_ANCHORS + _COMMON_ANCHORS]
    assert [line for line in marked if not any(lit in line and FAMILY[lit] & M for lit in listed)] == []


def _decided_lines() -> list[bytes]:
    lines = [r.example.encode() for r in signatures.FAILURES if r.example]
    for path in sorted((FIXTURES / "logs").glob("*.log")):
        lines += [seg for raw in path.read_bytes().split(b"\n") for seg in raw.split(b"\r") if seg.strip()]
    for path in sorted((FIXTURES / "mined").glob("*.json")):
        lines += [m["line"].encode() for m in json.loads(path.read_text())["messages"] if m.get("line")]
    return [line for line in lines if classify(line.decode("utf-8", "replace"), Context(None, None, False))]


def test_every_line_a_row_decides_is_anchored_for_the_byte_passes() -> None:
    decided = _decided_lines()
    assert len(decided) > 250
    unanchored = [line for line in decided if prefilter_in(line, True).search(line) is None]
    assert unanchored == []


@pytest.mark.skipif(not sparse.available(), reason="hyperscan is not installed: no sparse reading")
def test_every_line_a_row_decides_is_kept_by_the_sparse_scan() -> None:
    decided = _decided_lines()
    filler = b"(APIServer pid=1) INFO:     10.0.0.1:40000 - \"GET /health HTTP/1.1\" 200 OK\n" * 500
    for line in decided:
        buf = filler + line + b"\n" + filler
        kept = sparse.kept_lines(buf, len(buf))
        assert kept is not None and [buf[a:b] for a, b in kept] == [line + b"\n"], line
