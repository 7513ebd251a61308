"""The analyzer's regular expressions compiled once per machine: their compiled code cached on disk.

The stdlib compiles a pattern in pure Python (its parser and code generator): the analyzer's
~110 patterns and its two prefilter tries cost ~0.1 s of CPU at every process start on the
2-core VM, a third of `gpudeck analyze` of a small file. The code they compile to is a list of
ints that only the interpreter build defines (kept here as an array's bytes); ``_sre.compile``
turns it back into a pattern in microseconds. So `compile()` keeps, per interpreter build,
{(pattern, flags): that code} in one file under ``$XDG_CACHE_HOME/gpudeck/regex/``
(``~/.cache/...``), read at import and written back (atomically) at exit when this process
compiled a pattern it lacked. `derived()` keeps the
text of a pattern built in Python (the prefilter tries, ~10 ms each) the same way, by its inputs.

A file is never trusted blindly, as hscache.py's databases are not: it is read only where it is a
regular file of this user that nobody else may write, within MAX_BYTES, its header names this
interpreter build and its payload's CRC holds; ``_sre.compile`` validates the code again. A
pattern built from it must still equal (``==``: flags and code) what the stdlib would compile: a
test checks every pattern of the analyzer. Anything unexpected (another interpreter's internals,
a broken file, no cache dir) costs only the compile: `compile()` then is ``re.compile``.
"""
from __future__ import annotations

import atexit
import os
import re
import stat
import sys
from pathlib import Path
from typing import Any, Callable, Optional, Union

import _sre  # type: ignore[import-not-found]  # (CPython's regex engine: no stubs)
from array import array

MAGIC = b"gpudeck regex code 2\n"
SUFFIX = ".recode"
MAX_BYTES = 8 << 20           # the analyzer's patterns are ~0.5 MB of code: a larger file is no file of ours
# What a file is let grow to: a process reads it all at import (~1 ms a 100 KB). Past it (patterns and
# tries of earlier releases, of logs that named other anchors) it starts over with this process's own.
KEEP_BYTES = 1 << 20

_cache: Optional[dict] = None    # (pattern, flags) -> (flags, code, groups, groupindex, indexgroup); None: off
_used: dict = {}                 # the entries this process used or compiled: what a rewrite keeps
_dirty = False
# The code is kept as the bytes of an array of code words, turned into the list _sre.compile takes only
# when its pattern is compiled: marshal reads bytes at memory speed, a list of ints an object at a time
# (a 3.5 MB file of lists took 20 ms to read on the VM, its bytes ~1 ms).
_WORD: Any = next((t for t in "IL" if array(t).itemsize == _sre.CODESIZE), None)


def folder() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gpudeck" / "regex"


def _build() -> str:
    """What the compiled code depends on: the interpreter build and its regex engine's version."""
    return f"{sys.implementation.cache_tag} {sys.version} {_sre.MAGIC} {_sre.CODESIZE} {sys.byteorder}"


def _path() -> Path:
    import zlib
    return folder() / f"{sys.implementation.cache_tag}-{zlib.crc32(_build().encode()):08x}{SUFFIX}"


def compile(pattern: Union[str, bytes], flags: int = 0) -> "re.Pattern[Any]":
    """re.compile(pattern, flags), its code taken from the cache where this machine compiled it before."""
    global _dirty
    if _cache is None or flags & re.DEBUG:
        return re.compile(pattern, flags)
    key = (pattern, int(flags))
    entry = _cache.get(key)
    if entry is not None:
        try:
            rx = _sre.compile(pattern, entry[0], _code_list(entry[1]), entry[2], entry[3], entry[4])
            _used[key] = entry
            return rx
        except Exception:                       # a code this engine refuses: compiled anew below
            del _cache[key]
    try:
        entry = _compiled_entry(pattern, int(flags))
        rx = _sre.compile(pattern, entry[0], _code_list(entry[1]), entry[2], entry[3], entry[4])
    except Exception:                           # internals other than 3.11-3.13's: the stdlib's way, always
        _off()
        return re.compile(pattern, flags)
    _cache[key] = _used[key] = entry
    _dirty = True
    return rx


def derived(key: tuple, make: Callable[[], Any]) -> Any:
    """make() (a pattern's text built in Python: the prefilter tries), kept in the cache under key, which
    names everything make() reads; marshal-able values only."""
    global _dirty
    if _cache is None:
        return make()
    key = ("derived",) + key
    value = _cache.get(key)
    if value is None:
        value = _cache[key] = make()
        _dirty = True
    _used[key] = value
    return value


def _compiled_entry(pattern: Union[str, bytes], flags: int) -> tuple:
    """What re._compiler.compile hands _sre.compile for pattern (3.11-3.13): (flags, code, groups - 1,
    groupindex, indexgroup)."""
    from re import _compiler, _parser  # type: ignore[attr-defined]
    parsed = _parser.parse(pattern, flags)
    code = _compiler._code(parsed, flags)
    groupindex = dict(parsed.state.groupdict)
    indexgroup = [None] * parsed.state.groups
    for name, i in groupindex.items():
        indexgroup[i] = name
    return (int(flags | parsed.state.flags), array(_WORD, code).tobytes(), parsed.state.groups - 1, groupindex,
            tuple(indexgroup))


def _code_list(words: bytes) -> list[int]:
    code = array(_WORD)
    code.frombytes(words)
    return code.tolist()


def _off() -> None:
    global _cache, _dirty
    _cache, _dirty = None, False


def _digest(data: bytes) -> bytes:
    """A check of the payload against a file cut short or damaged (ownership is what keeps others out)."""
    import zlib
    return b"%08x" % zlib.crc32(data)


def load(path: Path) -> Optional[dict]:
    """The entries cached at path, or None where it is missing, not ours, foreign or broken."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if (not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022
                or st.st_size > MAX_BYTES):
            return None
        with os.fdopen(fd, "rb", closefd=False) as fh:
            blob = fh.read(MAX_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    build = _build().encode()
    head = MAGIC + build + b"\n"
    if not blob.startswith(head) or blob[len(head) + 8:len(head) + 9] != b"\n":
        return None
    payload = blob[len(head) + 9:]
    if _digest(payload) != blob[len(head):len(head) + 8]:
        return None
    import marshal
    try:
        entries = marshal.loads(payload)
    except Exception:
        return None
    return entries if isinstance(entries, dict) else None


def store(path: Path, entries: dict, fallback: Optional[dict] = None) -> None:
    """Write entries (fallback instead where they are over KEEP_BYTES) to path atomically; any failure
    leaves the cache as it was (never raises)."""
    import marshal
    import tempfile
    tmp: Optional[str] = None
    try:
        payload = marshal.dumps(entries)
        if len(payload) > KEEP_BYTES and fallback is not None:
            payload = marshal.dumps(fallback)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=SUFFIX)    # (mode 0600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(MAGIC + _build().encode() + b"\n" + _digest(payload) + b"\n" + payload)
        os.replace(tmp, path)
        tmp = None
    except Exception:                           # read-only home, full disk: compile next time
        pass
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def _write_back() -> None:
    """At exit: the file again with what this process compiled (only then), merged with what it holds now."""
    global _dirty
    if not _dirty or _cache is None or os.getpid() != _owner:
        return
    _dirty = False
    path = _path()
    store(path, {**(load(path) or {}), **_used}, fallback=_used)


def _start() -> None:
    global _cache, _owner
    if os.environ.get("GPUDECK_REGEX_CACHE", "1") == "0" or _WORD is None:
        return
    try:
        _cache = load(_path()) or {}
    except Exception:
        _cache = None
        return
    _owner = os.getpid()                        # (a forked worker writes nothing back)
    atexit.register(_write_back)


_owner = -1
_start()
