"""The signature table: every row's example line reads as the row says; the doc is generated from it."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpudeck.jobs.logs.analyze import analyze_bytes, analyze_file, signatures
from gpudeck.jobs.logs.analyze.patterns import strip_prefixes

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import diff_analyze  # noqa: E402

ROWS = {f"{r.field}:{r.id}": r for r in signatures.TABLE}
FIXTURES = ROOT / "tests" / "fixtures" / "logs"
# Fixtures that say what they read in their header (diff_analyze.expectation): a new row's fixture.
HEADED = sorted(p.name for p in FIXTURES.glob("*.log") if diff_analyze.expectation(p.read_bytes()) is not None)


def test_row_ids_are_unique_per_field() -> None:
    assert len(ROWS) == len(signatures.TABLE)


def test_every_row_has_an_example_and_releases() -> None:
    for r in signatures.TABLE:
        assert r.example and r.releases and r.decides, r.id


@pytest.mark.parametrize("key", sorted(ROWS))
def test_every_rows_example_reads_as_the_row_says(key: str) -> None:
    r = ROWS[key]
    if r.field == "prefix":
        assert r.pattern.match(r.example) and strip_prefixes(r.example)[0].strip() == r.reads
        return
    assert r.match(r.example, signatures.Context(None, "ERROR", True)) if r.field == "cause" \
        else r.pattern.search(r.example), "the row's pattern does not match its own example"
    a = analyze_bytes(r.example.encode() + b"\n")
    why = dict(a.decided_by)
    if r.field == "engine":
        assert a.engine == r.decides
        if r.priority > 1:
            assert why["engine"].startswith(r.id)
    elif r.field == "phase":
        assert a.phase == r.reads
    elif r.field == "progress":
        if r.reads:
            assert a.progress is not None and f"{a.progress.done}/{a.progress.total}" == r.reads
            assert why["progress"].startswith(r.id)
        else:
            assert a.phase == "training"
    elif r.field == "serving":
        k, v = r.reads.split("=")
        assert a.serving is not None and getattr(a.serving, k) == float(v)
    elif r.field == "warning":
        assert r.decides in {w.code for w in a.warnings}
    elif r.rank == 0:           # a bare ERROR line names no cause alone: it is the line an envelope defers to
        assert a.failure is None and [k.kind for k in a.key_lines] == ["first_error"]
    else:
        assert a.failure is not None and a.failure.cause == (r.reads or r.decides), a.failure
        assert why["failure"].startswith(r.id + " ->"), why["failure"]


@pytest.mark.parametrize("name", HEADED)
def test_a_fixture_reads_as_its_header_expects_through_the_row_it_names(name: str) -> None:
    want = diff_analyze.expectation((FIXTURES / name).read_bytes())
    a = analyze_file(FIXTURES / name)
    got = diff_analyze.summary(a)
    assert {field: diff_analyze.plain(got[field]) for field in want["expect"]} == want["expect"]
    if want["fix"] is not None:
        assert want["fix"] in {r.id for r in signatures.TABLE}, want["fix"]
        assert any(why.startswith(want["fix"] + " ") for _, why in a.decided_by), a.decided_by


def test_failure_rows_are_tried_by_priority_not_by_position() -> None:
    line = "RuntimeError: CUDA error: an illegal memory access (NCCL watchdog thread terminated)"
    assert signatures.classify(line, signatures.Context(None, None, False))[3] == "CUDA_ERR"


def test_the_checked_in_doc_is_the_generated_one() -> None:
    doc = (ROOT / "docs" / "LOG_SIGNATURES.md").read_text(encoding="utf-8")
    assert doc == signatures.markdown(), "stale: run python docs/make_log_signatures.py"


def test_the_checked_in_derived_anchors_are_the_generated_ones() -> None:
    from gpudeck.jobs.logs.analyze import derived_anchors, patterns
    source = (ROOT / "jobs" / "logs" / "analyze" / "derived_anchors.py").read_text(encoding="utf-8")
    assert source == signatures.derived_anchors_source(), "stale: run python docs/make_log_signatures.py"
    assert derived_anchors.INPUTS == patterns.row_anchor_inputs(signatures.ANCHOR_ROWS)
    assert list(derived_anchors.ANCHORS) == patterns.derive_row_anchors(signatures.ANCHOR_ROWS)
    assert [lit for lit, _ in derived_anchors.ANCHORS] == signatures.ROW_ANCHORS


def test_a_table_changed_since_the_anchors_were_generated_derives_them_at_import() -> None:
    # A new row without regenerating: its wording must still be an anchor (only the import is slower).
    probe = textwrap.dedent("""
        import json, sys
        from gpudeck.jobs.logs.analyze import derived_anchors
        fresh = list(derived_anchors.ANCHORS)
        derived_anchors.INPUTS += " and a row added since"
        derived_anchors.ANCHORS = ((b"never a real anchor", 8),)
        from gpudeck.jobs.logs.analyze import patterns, signatures
        print(json.dumps([[lit.decode() for lit in signatures.ROW_ANCHORS], [lit.decode() for lit, _ in fresh],
                          "never a real anchor" in [lit.decode() for lit in patterns.FAMILY]]))
    """)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    row_anchors, generated, adopted_stale = json.loads(out.stdout)
    assert row_anchors == generated == [lit.decode() for lit in signatures.ROW_ANCHORS]
    assert adopted_stale is False and len(generated) > 40
