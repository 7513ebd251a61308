"""Sparse chunks compacted by one hyperscan pass (sparse.py) read exactly as the exhaustive scanner reads them."""
from __future__ import annotations

import random

import pytest

from analyze_reference import ReferenceAnalyzer
from gpudeck.jobs.logs.analyze import GIANT_SEGMENT, LogAnalyzer, scanner, sparse

pytestmark = pytest.mark.skipif(not sparse.available(), reason="hyperscan is not installed")


def _access(r: random.Random) -> str:
    return (f'(APIServer pid=1) INFO:     10.1.{r.randint(0, 255)}.{r.randint(1, 254)}:{r.randint(30000, 60000)} - '
            f'"POST /v1/chat/completions HTTP/1.1" 200 OK')


def _stats(r: random.Random, t: int) -> str:
    return (f"(APIServer pid=1) INFO 05-07 10:{t // 60 % 60:02d}:{t % 60:02d} [loggers.py:271] Engine 000: Avg prompt "
            f"throughput: {r.uniform(0, 900):.1f} tokens/s, Avg generation throughput: {r.uniform(20, 300):.1f} "
            f"tokens/s, Running: {r.randint(0, 64)} reqs, Waiting: {r.randint(0, 9)} reqs, GPU KV cache usage: "
            f"{r.uniform(0, 99):.1f}%, Prefix cache hit rate: 12.0%")


EVENTS = [
    lambda r: "Traceback (most recent call last):\n  File \"/a/vllm/x.py\", line 3, in f\n"
              "    raise RuntimeError(\"CUDA error: quoted\")\nValueError: bad request %d" % r.randint(0, 99),
    lambda r: "\r".join(f"Loading weights: {d * 25:3d}%|{'#' * d:4s}| {d}/4 [00:01<00:01, 1.00it/s]" for d in range(5)),
    lambda r: "x" * (GIANT_SEGMENT + 100) + " RuntimeError: CUDA error: in a giant line " + "y" * 50,
    lambda r: "z" * (GIANT_SEGMENT + 10),
    lambda r: "(APIServer pid=1) ERROR 05-07 10:00:00 [serving.py:1] request failed",
    lambda r: "usage: vllm serve [-h]",
    lambda r: "[3/9] c++ -c a.cpp",
    lambda r: "No available shared memory broadcast block found in 60 seconds.",
    lambda r: "Killed",
]


def _log(seed: int, mb: float) -> bytes:
    r = random.Random(seed)
    out = ["(APIServer pid=1) INFO 05-07 10:00:00 [api_server.py:1] vLLM API server version 0.11.0"]
    size, t = 0, 0
    eol = r.choice(["\n", "\r\n"])
    while size < mb * 1e6:
        block = [_access(r) for _ in range(r.choice([50, 199, 600]))]
        t += 10
        block.append(_stats(r, t))
        if r.random() < 0.2:
            block.insert(r.randrange(len(block)), r.choice(EVENTS)(r))
        text = eol.join(block)
        out.append(text)
        size += len(text)
    return (eol.join(out) + r.choice(["\n", "", "\r"])).encode()


def _run(analyzer: LogAnalyzer, data: bytes, cuts: list[int]):
    prev, seen = 0, []
    for cut in sorted(set(cuts)) + [len(data)]:
        analyzer.feed(data[prev:cut])
        prev = cut
        seen.append((analyzer.line, analyzer.result()))
    analyzer.finish()
    seen.append((analyzer.line, analyzer.result()))
    return seen


@pytest.mark.parametrize("seed", range(6))
def test_compacted_chunks_read_as_the_exhaustive_scanner_reads_them(seed: int, monkeypatch) -> None:
    data = _log(seed, 1.5)
    r = random.Random(seed)
    cuts = [list(range(0, len(data), 256 * 1024)), sorted(r.randrange(len(data)) for _ in range(12)), []][seed % 3]
    compacted = []
    kept_lines = sparse.kept_lines

    def counting(*args, **kwargs):
        out = kept_lines(*args, **kwargs)
        compacted.append(out is not None)
        return out

    monkeypatch.setattr(sparse, "kept_lines", counting)
    fast = _run(LogAnalyzer(), data, cuts)
    assert any(compacted)
    assert fast == _run(ReferenceAnalyzer(), data, cuts)
    scanner.COMPACT = False
    try:
        assert fast == _run(LogAnalyzer(), data, cuts)
    finally:
        scanner.COMPACT = True


def test_compact_keeps_anchored_lines_and_every_newline() -> None:
    lines = [b"plain access line %d" % i for i in range(20000)]
    lines[7] = b"Avg prompt throughput: 1.0 tokens/s, Avg generation throughput: 2.0 tokens/s"
    lines[19990] = b"a\rRuntimeError: CUDA error: x\rb"
    data = b"\n".join(lines) + b"\n"
    small = sparse.compact(data, len(data))
    assert small is not None and small.count(b"\n") == data.count(b"\n")
    kept = [line for line in small.split(b"\n") if line]
    assert kept == [lines[7], lines[19990]]


def test_a_dense_chunk_is_left_whole() -> None:
    data = b"".join(b"[%d/90000] Building CUDA object k%d.o\n" % (i, i) for i in range(9000))
    assert sparse.compact(data, len(data)) is None


@pytest.mark.parametrize("seed", range(60))
def test_compaction_forced_on_the_property_tests_logs(seed: int, monkeypatch) -> None:
    """The fast-vs-exhaustive logs (every shape of segment), with compaction forced on every chunk."""
    import test_analyze_fast as fast_logs
    monkeypatch.setattr(sparse, "MIN_BYTES", 0)
    monkeypatch.setattr(sparse, "DENSE_BYTES", 0.001)
    data = fast_logs._log(seed, 120)
    r = random.Random(seed)
    cuts = sorted(r.randrange(len(data) + 1) for _ in range(r.choice([0, 3, 20])))
    assert _run(LogAnalyzer(), data, cuts) == _run(ReferenceAnalyzer(), data, cuts)


@pytest.mark.parametrize("seed", range(4))
def test_compaction_before_the_engine_is_known_reads_the_same(seed: int) -> None:
    """A log whose engine shows late (a wrapper's chatter first): compacted with the engine anchors in the set."""
    r = random.Random(seed)
    head = "\n".join(f"wrapper: attempt {i}: please wait for the server (GET /health -> 503)" for i in range(30000))
    data = (head + "\n").encode() + _log(seed, 0.8)
    cuts = [list(range(0, len(data), 256 * 1024)), []][seed % 2]
    assert _run(LogAnalyzer(), data, cuts) == _run(ReferenceAnalyzer(), data, cuts)


def test_mapped_numbers_each_kept_segment_by_its_physical_line() -> None:
    lines = [b"plain access line %d" % i for i in range(20000)]
    lines[7] = b"Avg prompt throughput: 1.0 tokens/s, Avg generation throughput: 2.0 tokens/s"
    lines[19990] = b"a\rRuntimeError: CUDA error: x\rb"
    data = b"head\n" + b"\n".join(lines) + b"\ntail\rpiece\r"
    got = sparse.mapped(data, len(data), 5, 2)         # data[5:] begins on line 2
    assert got is not None
    blob, numbers, after = got
    assert blob == lines[7] + b"\n" + lines[19990] + b"\ntail\rpiece\r"
    assert numbers == [9, 19992, 19992, 19992, 20002, 20002]
    assert after == 20002                              # no newline after the \r-ended piece
    assert sparse.mapped(data, len(data) - 11, 5, 2) == (blob[:-11], numbers[:-2], 20002)
