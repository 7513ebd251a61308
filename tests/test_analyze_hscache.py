"""The hyperscan databases cached on disk (hscache.py): a cache hit reads as a fresh compile; a bad file is rebuilt."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpudeck.jobs.logs.analyze import analyze_bytes, hscache, matcher, signatures, sparse, state

pytestmark = pytest.mark.skipif("hyperscan" not in matcher.BACKENDS, reason="hyperscan is not installed")

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "logs"


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """An empty cache folder, and no database compiled in this process yet (the module-level ones restored after)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    monkeypatch.setattr(sparse, "_dbs", {})
    fresh()
    yield hscache.folder()
    signatures.use_backend(None)
    state._CLASSIFIED.clear()


def fresh() -> None:
    """Forget the databases this process holds (the next use compiles or loads them again)."""
    signatures.use_backend(None)
    sparse._dbs.clear()
    state._CLASSIFIED.clear()


def refuse_compiling(monkeypatch) -> None:
    class Refusing:
        def __init__(self, **kwargs: object) -> None:
            pass

        def compile(self, **kwargs: object) -> None:
            raise AssertionError("compiled: the cache was not used")

    monkeypatch.setattr(matcher._hs, "Database", Refusing)


def readings() -> list:
    """Every fixture read, and what the failure matcher and the compaction make of them (both anchor sets)."""
    logs = [p.read_bytes() for p in sorted(FIXTURES.glob("*.log"))]
    blob = b"".join(logs)
    big = blob * (sparse.MIN_BYTES // len(blob) + 2)
    bodies = [line.decode("utf-8", "replace") for line in blob.split(b"\n")]
    return ([analyze_bytes(b) for b in logs],
            [signatures.MATCHER.candidates(b) for b in bodies],
            [sparse.compact(big, len(big), 0, known) for known in (True, False)])


def test_a_cache_hit_reads_the_fixtures_as_a_fresh_compile(cache, monkeypatch) -> None:
    want = readings()                                       # compiled, and written to the cache
    assert signatures.MATCHER.backend == "hyperscan"
    assert len(list(cache.glob("*" + hscache.SUFFIX))) == 3  # the failure rows, two anchor sets
    assert not list(cache.glob(".tmp-*"))                   # written atomically: no leftover
    assert oct(cache.stat().st_mode & 0o777) == oct(0o700)
    fresh()
    refuse_compiling(monkeypatch)                           # the cache alone must answer
    got = readings()
    assert signatures.MATCHER.backend == "hyperscan"
    assert got == want


@pytest.mark.parametrize("damage", ["flip a payload byte", "wrong digest", "truncate", "foreign key",
                                    "not a cache file", "empty", "writable by others"])
def test_a_bad_cache_file_is_ignored_and_rebuilt(cache, damage: str) -> None:
    want = readings()
    files = sorted(cache.glob("*" + hscache.SUFFIX))
    assert len(files) == 3
    originals = [path.read_bytes() for path in files]
    for n, path in enumerate(files):
        blob = originals[n]
        if damage == "flip a payload byte":
            i = len(blob) // 2
            path.write_bytes(blob[:i] + bytes([blob[i] ^ 0xFF]) + blob[i + 1:])
        elif damage == "wrong digest":                      # the database itself intact: the digest decides
            at = len(hscache.MAGIC) + 65
            path.write_bytes(blob[:at] + b"0" * 64 + blob[at + 64:])
        elif damage == "truncate":
            path.write_bytes(blob[:len(blob) // 3])
        elif damage == "foreign key":                       # a sound file of another table, under this name
            path.write_bytes(originals[(n + 1) % len(files)])
        elif damage == "not a cache file":
            path.write_bytes(b"\x00" * 4096)
        elif damage == "empty":
            path.write_bytes(b"")
        else:
            os.chmod(path, 0o666)
    mode = matcher._hs.HS_MODE_BLOCK
    for path in files:                                      # each is refused as it is
        assert hscache.load(path, path.name[:-len(hscache.SUFFIX)], mode) is None, path
    fresh()
    assert readings() == want
    for path in files:                                      # rebuilt: sound again, owner-only
        k = path.name[:-len(hscache.SUFFIX)]
        assert hscache.load(path, k, mode) is not None, path
        assert path.stat().st_mode & 0o077 == 0


def test_a_cache_that_cannot_be_written_costs_only_the_compile(tmp_path, monkeypatch) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("no folder below a regular file\n")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker / "cache"))
    monkeypatch.setattr(sparse, "_dbs", {})
    fresh()
    try:
        got = readings()
        assert signatures.MATCHER.backend == "hyperscan"
    finally:
        fresh()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "elsewhere"))
    assert got == readings()


def test_the_key_names_what_was_compiled_and_for_which_cpu(monkeypatch) -> None:
    mode = matcher._hs.HS_MODE_BLOCK
    k = hscache.key([b"abc"], [0], [0], mode)
    assert k == hscache.key([b"abc"], [0], [0], mode)
    assert len({k, hscache.key([b"abd"], [0], [0], mode), hscache.key([b"abc"], [1], [0], mode),
                hscache.key([b"abc"], [0], [8], mode), hscache.key([b"ab", b"c"], [0, 0], [0, 0], mode)}) == 5
    monkeypatch.setattr(hscache, "_cpu", lambda: b"another cpu")
    assert hscache.key([b"abc"], [0], [0], mode) != k


def test_old_files_are_pruned(cache) -> None:
    for n in range(hscache.KEEP + 5):
        hscache.compile_database([b"line %d" % n], [0], [0])
    assert len(list(cache.glob("*" + hscache.SUFFIX))) == hscache.KEEP
