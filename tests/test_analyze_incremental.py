"""Log analyzer as a live reader: any chunking gives the whole-file answer; invalid UTF-8 and giant lines stay cheap and bounded."""
from __future__ import annotations

import time
import tracemalloc
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpudeck.jobs.logs import analyze as an
from gpudeck.jobs.logs.analyze import LogAnalyzer, analyze_bytes, analyze_file

FIXTURES = Path(__file__).parent / "fixtures" / "logs"


def _corpus() -> bytes:
    """All fixtures back to back, plus the awkward cases: \\r\\n, a giant line, invalid bytes, no final newline."""
    parts = [p.read_bytes() for p in sorted(FIXTURES.glob("*.log"))]
    giant = b"x" * (an.GIANT_SEGMENT + 5000) + b" RuntimeError: CUDA error: tail of a giant line\n"
    parts.insert(3, giant)
    parts.insert(5, b"windows line\r\nKilled\r\n\xff\xfe broken \xc3 utf8\n")
    return b"".join(parts) + b"[12/40] unterminated ninja line"


CORPUS = _corpus()
WHOLE = analyze_bytes(CORPUS)


def _feed_in_pieces(data: bytes, cuts: list[int]) -> an.LogAnalysis:
    a = LogAnalyzer()
    prev = 0
    for cut in sorted(set(cuts)):
        a.feed(data[prev:cut])
        a.result()                       # asking mid-stream must not change the outcome
        prev = cut
    a.feed(data[prev:])
    a.finish()
    return a.result()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(min_value=0, max_value=len(CORPUS)), max_size=40))
def test_any_chunking_gives_the_whole_file_answer(cuts: list[int]) -> None:
    assert _feed_in_pieces(CORPUS, cuts) == WHOLE


@settings(max_examples=15, deadline=None)
@given(st.sampled_from(sorted(p.name for p in FIXTURES.glob("*.log"))), st.integers(1, 7))
def test_byte_by_byte_small_pieces_equal_whole(name: str, step: int) -> None:
    data = (FIXTURES / name).read_bytes()
    assert _feed_in_pieces(data, list(range(0, len(data), step))) == analyze_bytes(data)


def test_result_without_finish_reads_the_unterminated_line_tentatively() -> None:
    a = LogAnalyzer()
    a.feed(CORPUS)
    assert a.result() == WHOLE


def test_analyze_file_equals_analyze_bytes(tmp_path: Path) -> None:
    path = tmp_path / "corpus.log"
    path.write_bytes(CORPUS)
    assert analyze_file(path, chunk_size=4097) == WHOLE


def test_invalid_utf8_is_tolerated_and_lines_still_count() -> None:
    data = b"\xff\xfe\xfd garbage\n\x80\x81 NCCL \xc3\x28 \n\xed\xa0\x80\nRuntimeError: CUDA error: \xff bad\n"
    r = analyze_bytes(data)
    assert (r.failure.cause, r.failure.line) == ("cuda_error", 4)
    assert "\ufffd" in r.failure.message


def test_giant_line_is_cheap_and_its_ends_are_read() -> None:
    big = b"A" * (8 * 1024 * 1024)
    data = b"Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:01<00:01,  1.00it/s]\n" + big + \
        b" CUDA error: an illegal memory access, at the end of an 8 MB line\nnext\n"
    start = time.perf_counter()
    r = analyze_bytes(data)
    assert time.perf_counter() - start < 5.0          # linear, not quadratic (generous for a shared 2-core box)
    assert (r.failure.cause, r.failure.line) == ("cuda_error", 2)
    assert (r.progress.done, r.progress.total) == (1, 2)


def test_giant_line_fed_in_pieces_keeps_memory_flat() -> None:
    a = LogAnalyzer()
    piece = b"B" * 65536
    tracemalloc.start()
    try:
        for _ in range(200):                           # a 13 MB line, no newline yet
            a.feed(piece)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * 1024 * 1024                      # head + rolling tail + one piece, never the whole line
    assert len(a._tail) + len(a._giant_tail) + len(a._giant_head or b"") <= an.GIANT_SEGMENT + an.TAIL_BYTES
    a.feed(b"CUDA out of memory at the end\n")
    assert a.result().failure.cause == "cuda_oom" and a.line == 2


def test_many_cr_updates_on_one_physical_line() -> None:
    bar = b"".join(b"\r%3d%%|#   | %d/5000 [00:10<00:10, 500.00it/s]" % (i * 100 // 5000, i) for i in range(5001))
    r = analyze_bytes(b"header\n" + bar + b"\nafter\n")
    assert (r.progress.done, r.progress.total) == (5000, 5000)
    a = LogAnalyzer()
    for i in range(0, len(bar), 1000):
        a.feed(bar[i:i + 1000])
    assert a.line == 1 and a.result().progress.done == 5000


def test_line_numbers_count_newlines_only() -> None:
    a = LogAnalyzer()
    a.feed(b"a\rb\rc\nd\r\ne\n")
    assert a.line == 4
