"""Strict JSON and strict numbers: what gpudeck writes is RFC 8259 JSON, and every number it reads is checked once.

Out: a non-finite number (inf, nan, an int too big for a float) becomes null, never `Infinity`.
In: `number`, `integer` and `parse_number` are the one set of rules for a number read from a run
file, a reply, a sample or a tool's text: finite, not a bool, an int within 64 bits, a text that is
the whole token (so `1e5` is 100000.0 and `29/1e5` is no number at all).
"""
from __future__ import annotations

import json
import math
from typing import Any, Mapping, Optional


def finite_number(value: Any) -> Any:
    """A number as JSON can carry it everywhere, or None. Non-numbers pass through unchanged."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    if isinstance(value, int):
        # An int past float range is exact in JSON but overflows every reader that does arithmetic.
        return value if abs(value) <= 2 ** 63 else None
    return value if math.isfinite(value) else None


_INT_LIMIT = 2 ** 63


def number(value: Any) -> Optional[float]:
    """`value` as a finite float when it is an int or float (never a bool); else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, int):
        return float(value) if abs(value) <= _INT_LIMIT else None
    return value if math.isfinite(value) else None


def integer(value: Any) -> Optional[int]:
    """`value` when it is an int within 64 bits (never a bool); else None."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if abs(value) <= _INT_LIMIT else None


def parse_number(text: Optional[str]) -> Optional[float]:
    """A whole token of text as a finite number ("12", "0.5", "1e5", " 7 "); None for anything else."""
    if text is None:
        return None
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def parse_integer(text: Optional[str]) -> Optional[int]:
    """A whole token of text as an int within 64 bits ("12", "-3"); None for "1.5", "1e3", "" or "[N/A]"."""
    if text is None:
        return None
    try:
        value = int(text.strip(), 10)
    except (AttributeError, ValueError):
        return None
    return value if abs(value) <= _INT_LIMIT else None


def first_number(mapping: Optional[Mapping[str, Any]], *keys: str) -> Optional[float]:
    """The first strict number under any of `keys` (sources name one figure differently)."""
    if not mapping:
        return None
    for key in keys:
        value = number(mapping.get(key))
        if value is not None:
            return value
    return None


def finite(obj: Any) -> Any:
    """`obj` with every non-finite number, at any depth of dicts/lists/tuples, replaced by None."""
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return finite_number(obj)


def dumps(obj: Any, **kwargs: Any) -> str:
    """json.dumps that always emits strict JSON (RFC 8259): cleaned, then allow_nan=False as the proof."""
    return json.dumps(finite(obj), allow_nan=False, **kwargs)


def _no_constant(name: str) -> None:
    return None


def loads(text: str | bytes) -> Any:
    """json.loads that reads `Infinity`/`NaN` (written by an older gpudeck) as null."""
    return json.loads(text, parse_constant=_no_constant)


# --------------------------------------------------------------------------- reading run files
#
# A run directory's files are not trusted (hand-edited, torn by a killed writer, written by an
# older gpudeck, planted): every reader of meta.json, exit.json, summary.json, health.json,
# events.jsonl, samples.jsonl ... goes through the loader below. It never follows a symlink,
# never reads a FIFO or a device, reads at most a size cap, refuses nesting deeper than
# MAX_DEPTH before json (or a reader's own recursion) can blow the stack, and reads every
# non-finite number (Infinity, NaN, 1e999, an int past 2**63) as null. A bad file costs its
# run a note, never the reader.

import errno as _errno
import io as _io
import os as _os
import re as _re
import stat as _stat
from itertools import accumulate as _accumulate
from pathlib import Path as _Path
from typing import Callable, Iterator, Optional, Union

MAX_DEPTH = 64                        # a run file nests 5 deep; 64 is far past any honest writer
MAX_FILE_BYTES = 16 << 20             # one JSON document (meta, exit, ids, health, result ...)
MAX_SUMMARY_BYTES = 64 << 20          # summary.json holds a decimated timeline and line checkpoints
MAX_JSONL_BYTES = 1 << 30             # events/samples: a week of 1 s samples is ~200 MB
MAX_LINE_BYTES = 1 << 20              # one JSONL record; a longer line is skipped
MAX_TIME = 2.0 ** 34                  # a unix time past year 2514 is not a time a run recorded

PathLike = Union[str, "_os.PathLike[str]"]


class Unreadable(ValueError):
    """A run file that exists but is not what it should be; `why` is a few words ("nesting deeper than 64")."""

    def __init__(self, path: PathLike, why: str) -> None:
        self.path = _Path(path)
        self.why = why
        super().__init__(f"{self.path.name} unreadable: {why}")


def _size_words(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB" if n >= 1 << 10 else f"{n} bytes"


def open_run_file(path: PathLike) -> int:
    """A read-only fd of a run file: never through a symlink, never a FIFO or device (no blocking read).

    FileNotFoundError when it is missing (a missing file is the caller's to word); Unreadable otherwise.
    """
    try:
        fd = _os.open(path, _os.O_RDONLY | _os.O_NOFOLLOW | _os.O_NONBLOCK | _os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == _errno.ELOOP:
            raise Unreadable(path, "a symlink (not followed)") from None
        raise Unreadable(path, exc.strerror or str(exc)) from None
    try:
        mode = _os.fstat(fd).st_mode
        if not _stat.S_ISREG(mode):
            raise Unreadable(path, "not a regular file")
        _os.set_blocking(fd, True)
    except BaseException:
        _os.close(fd)
        raise
    return fd


def open_run_binary(path: PathLike) -> _io.BufferedReader:
    """open_run_file as a buffered binary file object (for the readers that seek and read lines)."""
    return _os.fdopen(open_run_file(path), "rb")


def read_run_bytes(path: PathLike, max_bytes: int = MAX_FILE_BYTES) -> bytes:
    """The whole file, if it is at most max_bytes (checked on the open fd, and again while reading)."""
    fd = open_run_file(path)
    try:
        if _os.fstat(fd).st_size > max_bytes:
            raise Unreadable(path, f"larger than {_size_words(max_bytes)}")
        chunks, total = [], 0
        while True:
            chunk = _os.read(fd, min(1 << 20, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > max_bytes:
                raise Unreadable(path, f"larger than {_size_words(max_bytes)}")
        return b"".join(chunks)
    except OSError as exc:
        raise Unreadable(path, exc.strerror or str(exc)) from None
    finally:
        _os.close(fd)


_STRING = _re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = [0] * 256
_STEP[ord("[")] = _STEP[ord("{")] = 1
_STEP[ord("]")] = _STEP[ord("}")] = -1


def nesting(data: bytes, limit: int = MAX_DEPTH) -> int:
    """How deep the brackets of a JSON text nest (outside strings); 0 when it cannot exceed `limit`.

    No recursion and no per-byte Python loop: strings are cut out by a regex, the rest reduced to
    its brackets by translate(), and the running depth is accumulated in C.
    """
    if data.count(b"[") + data.count(b"{") <= limit:
        return 0                       # fewer opening brackets than the limit: cannot nest deeper
    brackets = _STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
    return max(_accumulate(map(_STEP.__getitem__, brackets)), default=0)


def parse(data: Union[bytes, str], *, path: PathLike = "JSON", max_depth: int = MAX_DEPTH) -> Any:
    """Strict JSON of a run file: nesting checked first, non-finite numbers read as null. Raises Unreadable."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    depth = nesting(raw, max_depth)
    if depth > max_depth:
        raise Unreadable(path, f"nesting deeper than {max_depth}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise Unreadable(path, "not UTF-8 text") from None
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except RecursionError:             # only if max_depth was set past the interpreter's limit
        raise Unreadable(path, "nesting too deep") from None
    except ValueError as exc:          # JSONDecodeError, an int of more than 4300 digits
        raise Unreadable(path, f"not JSON ({str(exc)[:80]})") from None
    return finite(value)


def _shape_word(value: Any) -> str:
    return {list: "a list", str: "a string", int: "a number", float: "a number", bool: "true/false",
            type(None): "null"}.get(type(value), type(value).__name__)


def load_object(path: PathLike, *, max_bytes: int = MAX_FILE_BYTES, notes: Optional[list] = None,
                max_depth: int = MAX_DEPTH, shape: Optional[Callable[[dict], Optional[dict]]] = None) -> Optional[dict]:
    """A run file holding one JSON object: the dict, or None (missing; or unreadable, with a note in `notes`)."""
    try:
        value = parse(read_run_bytes(path, max_bytes), path=path, max_depth=max_depth)
    except FileNotFoundError:
        return None
    except Unreadable as exc:
        if notes is not None:
            notes.append(str(exc))
        return None
    if not isinstance(value, dict):
        if notes is not None:
            notes.append(f"{_Path(path).name} unreadable: {_shape_word(value)}, not a JSON object")
        return None
    return shape(value) if shape is not None else value


def parse_line(line: bytes, max_depth: int = MAX_DEPTH) -> Optional[dict]:
    """One JSONL record as a dict, or None (torn, not JSON, too deep, not an object)."""
    if len(line) > MAX_LINE_BYTES:
        return None
    try:
        value = parse(line, max_depth=max_depth)
    except Unreadable:
        return None
    return value if isinstance(value, dict) else None


def iter_lines(path: PathLike, *, max_bytes: int = MAX_JSONL_BYTES, skipped: Optional[list] = None) -> Iterator[bytes]:
    """The lines of a run's JSONL file, each at most MAX_LINE_BYTES (longer ones skipped, counted in
    `skipped`), stopping after max_bytes. Missing: nothing. Unreadable (symlink, FIFO): raises Unreadable."""
    try:
        fh = open_run_binary(path)
    except FileNotFoundError:
        return
    with fh:
        read = 0
        while read < max_bytes:
            try:
                line = fh.readline(MAX_LINE_BYTES + 1)
            except OSError as exc:
                raise Unreadable(path, exc.strerror or str(exc)) from None
            if not line:
                return
            read += len(line)
            if len(line) > MAX_LINE_BYTES:
                while line and not line.endswith(b"\n") and read < max_bytes:   # skip the rest of a giant line
                    line = fh.readline(1 << 20)
                    read += len(line)
                if skipped is not None:
                    skipped.append(f"a line longer than {_size_words(MAX_LINE_BYTES)}")
                continue
            yield line
        if skipped is not None and fh.read(1):
            skipped.append(f"past the first {_size_words(max_bytes)} (not read)")


def load_jsonl(path: PathLike, *, max_bytes: int = MAX_JSONL_BYTES, notes: Optional[list] = None,
               shape: Optional[Callable[[dict], Optional[dict]]] = None) -> list[dict]:
    """The records (dicts) of a JSONL run file; bad lines are skipped, a torn last line silently
    (a killed writer), the others counted in one note. `shape` may fix or drop (None) a record."""
    records: list[dict] = []
    skipped: list[str] = []
    bad = 0
    last_torn = False
    try:
        for line in iter_lines(path, max_bytes=max_bytes, skipped=skipped):
            last_torn = not line.endswith(b"\n")
            if not line.strip():
                continue
            obj = parse_line(line)
            if obj is not None and shape is not None:
                obj = shape(obj)
            if obj is None:
                bad += 1
                continue
            records.append(obj)
    except Unreadable as exc:
        if notes is not None:
            notes.append(str(exc))
        return records
    if last_torn and bad:
        bad -= 1                           # the last line a killed writer left half-written
    if notes is not None and (bad or skipped):
        what = [f"{bad} unreadable line{'s' if bad != 1 else ''}"] if bad else []
        notes.append(f"{_Path(path).name}: " + ", ".join(what + skipped))
    return records


def timestamp(value: Any) -> Optional[float]:
    """A unix time a run could have recorded, as a float; None when missing, not a number or absurd."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) and 0.0 <= value <= MAX_TIME else None


def _is_time_key(key: str) -> bool:
    return key == "t" or key.endswith("_at")


def timed(record: dict) -> Optional[dict]:
    """A run file's shape check: its times ("t", "started_at", "ended_at", "written_at" ...: the keys of
    the top level) are sane unix times or None, so no reader ever turns 1e308 or -5 into a date."""
    bad = [k for k, v in record.items() if _is_time_key(k) and v is not None and timestamp(v) is None]
    if not bad:
        return record
    record = dict(record)
    for key in bad:
        record[key] = None
    return record
