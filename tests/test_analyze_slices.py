"""A dense stretch read in slices by workers (slices.py) gives the one-process answer; a slice is taken
from its worker only where the reader proved its state the same, else read in the reader."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpudeck.jobs.logs.analyze import sparse
from gpudeck.jobs.logs.analyze.scanner import analyze_bytes
from gpudeck.jobs.logs.analyze.state import State
from runsupport import BOTH_READINGS, run_python_in_group

pytestmark = pytest.mark.skipif(not sparse.available(), reason="hyperscan is not installed: no spread reading")

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "logs"

# Run in a child process (parallel.py forks only a process with no other thread, and pytest-xdist's
# workers have some), with thresholds small enough for a few MB. The child reports both readings and
# how many slices were taken from a worker and how many read in the reader.
CHILD = """
import json, os, sys
from dataclasses import asdict
from gpudeck.jobs.logs.analyze import parallel, slices
parallel.MIN_FILE = 1 << 20
slices.MIN_SLICE = 256 * 1024
slices.STEP = int(sys.argv[3])
slices.CHECKS = (slices.STEP // 4, slices.STEP)
path, workers, mode = sys.argv[1], int(sys.argv[2]), sys.argv[4]
counts = {"taken": 0, "read": 0, "dense": 0, "misses": 0}
from gpudeck.jobs.logs.analyze.state import State
same = State.same_course
def counting_checks(self, other, *rest):
    delta = same(self, other, *rest)
    counts["misses"] += delta is None
    return delta
State.same_course = counting_checks
take = slices._take
def counting(analyzer, fd, a, b, got):
    before = analyzer._state
    take(analyzer, fd, a, b, got)
    counts["taken" if analyzer._state is not before else "read"] += 1
slices._take = counting
dense = slices.read_dense
def noting(*args):
    counts["dense"] += 1
    return dense(*args)
slices.read_dense = noting
if mode == "kill":                       # the second slice's worker dies, as one the OOM killer killed would
    work = slices._work
    def dying(analyzer, fd, start, a, b, *rest):
        if a > start and a == sorted(slices._CUTS)[1]:
            os._exit(137)
        work(analyzer, fd, start, a, b, *rest)
    cuts = slices._slices
    def noting_cuts(*args):
        got = cuts(*args)
        slices._CUTS = [a for a, _ in got[0]]
        return got
    slices._slices = noting_cuts
    slices._work = dying
max_bytes = int(sys.argv[5]) if len(sys.argv) > 5 else None
""" + BOTH_READINGS + """out.update(counts)
print(json.dumps(out))
"""


def _child(path: Path, workers: int, step: int = 256 * 1024, mode: str = "-", max_bytes: int | None = None) -> dict:
    args = [str(path), str(workers), str(step), mode] + ([str(max_bytes)] if max_bytes is not None else [])
    code, stdout, stderr = run_python_in_group(CHILD, args, 180, "the reading")
    assert code == 0, stderr[-2000:]
    return json.loads(stdout)


def _fixture_mix(path: Path, mb: float, without: bytes = b"\0") -> bytes:
    """The project's fixtures (but those holding `without`), one after another, repeated to `mb` MB: the
    bench's dense fixture mix."""
    one = b"".join(p.read_bytes().rstrip(b"\n") + b"\n" for p in sorted(FIXTURES.glob("*.log"))
                   if without not in p.read_bytes())
    data = one * int(mb * (1 << 20) // len(one) + 1)
    path.write_bytes(data)
    return data


@pytest.mark.parametrize("workers", [2, 3, 5])
def test_a_dense_mix_read_in_slices_gives_the_one_process_answer(tmp_path: Path, workers: int) -> None:
    log = tmp_path / "dense.log"
    data = _fixture_mix(log, 3)
    log.write_bytes(data + b"(APIServer pid=1) INFO 05-07 10:00:00 [loggers.py:1] Engine 000: Avg prompt throughput: "
                    b"12345.6 tokens/s, Avg generation throughput: 7.5 tokens/s")        # a last line, unended
    out = _child(log, workers)
    assert out["spread"] == out["serial"]
    assert out["serial"][0]["serving"]["prompt_tokens_per_s"] == 12345.6
    assert out["dense"] == 1 and out["taken"] >= workers - 1, out      # the slices were the workers'
    # One repetition of the fixtures (~128 KB) is longer than the first check (64 KiB): each slice was
    # taken at a later one.
    assert out["misses"] >= 1, out


def test_many_workers_take_slices_growing_a_step_each(tmp_path: Path) -> None:
    # No slice of the reader's own: slices 0 and 1 alike, then each a STEP longer (slices._slices).
    log = tmp_path / "dense.log"
    _fixture_mix(log, 6)
    out = _child(log, 6, step=384 * 1024)
    assert out["spread"] == out["serial"]
    assert out["dense"] == 1 and out["taken"] == 6, out


def test_a_cut_at_max_bytes_mid_line_gives_the_one_process_answer(tmp_path: Path) -> None:
    log = tmp_path / "dense.log"
    data = _fixture_mix(log, 3)
    cut = len(data) * 2 // 3 + 11
    assert data[cut - 1:cut] != b"\n"
    out = _child(log, 3, max_bytes=cut)
    assert out["spread"] == out["serial"] and out["serial"][2] is True and out["taken"] >= 1, out


def test_a_slice_whose_guess_did_not_converge_is_read_by_the_reader(tmp_path: Path) -> None:
    # A warning raised once, early in the first slice, and never again: a worker's guess (the state at
    # the stretch's start) lacks it, and no window gives it back, so every later slice is read here.
    log = tmp_path / "dense.log"
    data = _fixture_mix(log, 3, without=b"JIT")       # (the fixtures that raise jit_compile themselves)
    at = data.index(b"\n", 1536 * 1024) + 1
    once = b"[flashinfer] Prebuilt kernels not found, using JIT backend\n"
    assert b"JIT" not in data
    log.write_bytes(data[:at] + once + data[at:])
    out = _child(log, 3)
    assert out["spread"] == out["serial"]
    assert out["read"] >= 1, out


def test_a_worker_that_dies_leaves_its_slice_to_the_reader(tmp_path: Path) -> None:
    log = tmp_path / "dense.log"
    _fixture_mix(log, 3)
    out = _child(log, 3, mode="kill")
    assert out["spread"] == out["serial"] and out["read"] >= 1, out


def test_same_course_reads_every_field_and_the_seq_offset() -> None:
    # Two readings of one log from states that differ only in seq (progress updates seen before) agree
    # by that offset; any other difference, a NaN kept or a dict's order, is seen.
    text = (FIXTURES / "hf_trainer_cr_glued.log").read_bytes()
    a, b = State(), State()
    b.seq = 7
    for state in (a, b):
        for n, line in enumerate(text.split(b"\n"), 1):
            state.examine(line, n, 0xFF)
    assert a.same_course(b) == -7 and b.same_course(a) == 7
    b.shift_seq(-7)
    assert b.same_course(a) == 0
    b.series = (b.series[0], b.series[1], float("nan")) if b.series else ((), 0.0, float("nan"))
    a.series = (b.series[0], b.series[1], float("nan"))
    assert a.same_course(b) == 0                       # NaN is NaN here
    b.warnings = dict(reversed(list({"x": (1,), "y": (2,)}.items())))
    a.warnings = {"x": (1,), "y": (2,)}
    assert a.same_course(b) == 0                       # warnings by code, whatever their order: the result sorts them
    a.warnings = {"x": (1,), "y": (3,)}
    assert a.same_course(b) is None
    a.warnings = dict(b.warnings)
    b.why = dict(reversed(list(a.why.items())))
    assert len(a.why) > 1 and a.same_course(b) is None   # the same items in another order are not the same
    b.why = dict(a.why)
    a.phase = "ready" if b.phase != "ready" else "loading"
    assert a.same_course(b) is None
    a.phase = b.phase
    # NVRM lines before a gap are never read again (a later line joins the last run only): not compared
    a.nvrm.extend([(3, "NVRM: Xid 79"), (90, "NVRM: GPU at PCI:0000:3b:00"), (91, "NVRM: GPU has fallen off")])
    b.nvrm.extend([(90, "NVRM: GPU at PCI:0000:3b:00"), (91, "NVRM: GPU has fallen off")])
    assert a.same_course(b) == 0
    b.nvrm.popleft()
    assert a.same_course(b) is None
    # ...and none where the last run ended before the line just read (the next is 93): no walk reaches it
    assert a.same_course(b, 93) == 0 and a.same_course(b, 92) is None
    assert analyze_bytes(text).phase == "training"
