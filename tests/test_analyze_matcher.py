"""The table's multi-pattern matcher: hyperscan (where it installs) and the stdlib fallback give the same answers."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpudeck.jobs.logs.analyze import analyze_bytes, matcher, signatures, state

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "logs"
REFERENCE = ROOT.parent / "shared" / "reference-logs"


def _logs() -> list[Path]:
    return sorted(FIXTURES.glob("*.log")) + (sorted(REFERENCE.glob("*.log")) if REFERENCE.is_dir() else [])


def _bodies() -> list[str]:
    from gpudeck.jobs.logs.analyze.patterns import strip_prefixes
    out = []
    for path in _logs():
        for raw in path.read_bytes().replace(b"\r", b"\n").split(b"\n"):
            body = strip_prefixes(raw.decode("utf-8", "replace"))[0].strip()
            if body:
                out.append(body)
    return out


def _every_row(body: str, ctx: signatures.Context):
    """classify() without a matcher: every row asked, by priority (what both backends must equal)."""
    for sig in signatures._ORDERED:
        m = sig.match(body, ctx)
        if m is not None:
            v = sig.decide(body, m, ctx)
            if v is not None:
                return (v[0], v[1], v[2], sig.id)
    return None


@pytest.fixture
def backend_restored():
    yield
    signatures.use_backend(None)
    state._CLASSIFIED.clear()


@pytest.mark.parametrize("backend", matcher.BACKENDS)
def test_each_backend_classifies_every_line_as_every_row_would(backend: str, backend_restored) -> None:
    signatures.use_backend(backend)
    bodies = _bodies()
    # The project's fixtures alone (a clone with no ../shared beside it, as CI's) hold ~340 lines.
    assert len(bodies) > (1000 if REFERENCE.is_dir() else 300)
    for phase in (None, "building", "capturing"):
        for level in (None, "ERROR"):
            ctx = signatures.Context(phase, level, False)
            wrong = [b for b in bodies if signatures.classify(b, ctx) != _every_row(b, ctx)]
            assert not wrong, wrong[:3]


@pytest.mark.parametrize("backend", matcher.BACKENDS)
def test_each_backend_reads_every_log_the_same(backend: str, backend_restored) -> None:
    state._CLASSIFIED.clear()
    signatures.use_backend("re")
    want = [analyze_bytes(p.read_bytes()) for p in _logs()]
    state._CLASSIFIED.clear()
    signatures.use_backend(backend)
    assert [analyze_bytes(p.read_bytes()) for p in _logs()] == want


def test_hyperscan_is_optional() -> None:
    code = ("import sys; sys.modules['hyperscan'] = None\n"
            "from gpudeck.jobs.logs.analyze import analyze_bytes, matcher\n"
            "assert matcher.BACKENDS == ('re',), matcher.BACKENDS\n"
            "r = analyze_bytes(b'torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\\n')\n"
            "assert r.failure.cause == 'cuda_oom'\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


@pytest.mark.skipif("hyperscan" not in matcher.BACKENDS, reason="hyperscan is not installed")
def test_a_record_no_row_can_match_asks_only_the_rows_without_a_pattern() -> None:
    m = matcher.Matcher(signatures._ORDERED, "hyperscan")
    got = {m.rows[i].id for i in m.candidates("GET /v1/models HTTP/1.1 200 OK")}
    assert got == {r.id for r in m.rows if r.pattern is None or r.test is not None}
    assert len(m.candidates("GET /v1/models \u00e9 HTTP/1.1 200 OK")) == len(m.rows)   # not ASCII: every row


@pytest.mark.skipif("hyperscan" not in matcher.BACKENDS, reason="hyperscan is not installed")
def test_a_database_hyperscan_refuses_degrades_to_asking_every_row(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))   # an empty cache: the database is compiled (hscache.py)
    m = matcher.Matcher(signatures._ORDERED, "hyperscan")

    class Refusing:
        def compile(self, **kwargs):
            raise matcher._hs.ArchitectureError("no SSSE3")

    monkeypatch.setattr(matcher._hs, "Database", Refusing)
    assert m.candidates("RuntimeError: CUDA error: x") == tuple(range(len(m.rows)))
    assert m.backend == "re"
