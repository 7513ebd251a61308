"""The hyperscan databases, compiled once per machine: cached on disk, loaded in ~0.1 ms instead of compiled.

Compiling the table's databases (matcher.py's failure rows, sparse.py's two anchor sets) costs
~1.2 G instructions (~0.35 s of CPU on the 2-core VM) in every process that scans a failure line
or a large chunk: a third of a `gpudeck analyze` of 10 MB. A compiled database is stored with hyperscan's
serialisation under ``$XDG_CACHE_HOME/gpudeck/hyperscan/`` (``~/.cache/...``), one file per
key: a hash of what was compiled (expressions, ids, flags, mode), the hyperscan module's version
and the CPU (a database is built for the CPU it was compiled on; a home directory may be shared
by machines of several kinds).

A file is never trusted blindly. It is read only where it is a regular file of this user that
nobody else may write, its header names the same key and its payload's SHA-256 matches; then
hyperscan's own deserialisation checks its version and platform. Anything else (missing,
truncated, corrupt, foreign, unreadable) is ignored: the database is compiled and the file
written again, atomically (a temporary file in the same folder, then os.replace). A cache that
cannot be written costs only the compile. Without hyperscan nothing here runs: the stdlib
backend (matcher.py's "re") never compiles a database.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any, Optional, Sequence

from .matcher import _hs

MAGIC = b"gpudeck hyperscan database 1\n"
SUFFIX = ".hsdb"
MAX_BYTES = 16 << 20          # a database of the table is ~0.2 MB: a larger file is no file of ours
KEEP = 12                     # files kept in the folder (the table changes with releases; a home may be shared)


def folder() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gpudeck" / "hyperscan"


def _cpu() -> bytes:
    """What the compiled database depends on of this machine: its architecture and CPU features."""
    machine = os.uname().machine.encode()
    try:
        with open("/proc/cpuinfo", "rb") as fh:
            head = fh.read(1 << 16)
    except OSError:
        return machine
    for line in head.splitlines():
        if line.startswith((b"flags", b"Features")):
            return machine + b" " + line
    return machine


def _sha256(data: bytes) -> str:
    import hashlib                              # (only where a database is wanted: the runner's logs import lean)
    return hashlib.sha256(data).hexdigest()


def key(expressions: Sequence[bytes], ids: Sequence[int], flags: Sequence[int], mode: int) -> str:
    """The cache key: what was compiled, by which hyperscan, for which CPU."""
    what = repr((str(getattr(_hs, "__version__", "?")), mode, list(ids), list(flags), list(expressions)))
    return _sha256(MAGIC + what.encode() + b"\n" + _cpu())


def compile_database(expressions: Sequence[bytes], ids: Sequence[int], flags: Sequence[int]) -> Any:
    """A block-mode database of these expressions: the cached one where it is sound, else compiled (and
    cached). Raises what Database.compile raises (the callers degrade)."""
    mode = _hs.HS_MODE_BLOCK
    k = key(expressions, ids, flags, mode)
    path = folder() / (k + SUFFIX)
    db = load(path, k, mode)
    if db is None:
        db = _hs.Database()                     # (block mode, as loadb is asked for)
        db.compile(expressions=list(expressions), ids=list(ids), elements=len(expressions), flags=list(flags))
        store(path, k, db)
    return db


def load(path: Path, k: str, mode: int) -> Any:
    """The database cached at path under key k, or None (see the module's docstring)."""
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
    payload = _payload(blob, k)
    if payload is None:
        return None
    try:
        db = _hs.loadb(payload, mode)
        db.scratch = _hs.Scratch(db)            # loadb leaves none: scanning would fail
    except Exception:                           # hyperscan's own checks (version, platform, bytecode)
        return None
    return db


def _payload(blob: bytes, k: str) -> Optional[bytes]:
    """The serialised database of a cache file's bytes, where its header names key k and its digest holds."""
    if not blob.startswith(MAGIC):
        return None
    header_end = len(MAGIC) + 64 + 1 + 64 + 1
    header = blob[len(MAGIC):header_end]
    if len(header) != 130 or header[64:65] != b"\n" or header[129:130] != b"\n" or header[:64] != k.encode():
        return None
    payload = blob[header_end:]
    if _sha256(payload).encode() != header[65:129]:
        return None
    return payload


def store(path: Path, k: str, db: Any) -> None:
    """Write db's serialisation to path atomically; any failure leaves the cache as it was (never raises)."""
    import tempfile                             # (only where a database was compiled: its import costs ~2 ms)
    tmp: Optional[str] = None
    try:
        payload = _hs.dumpb(db)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=SUFFIX)   # (mode 0600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(MAGIC + k.encode() + b"\n" + _sha256(payload).encode() + b"\n" + payload)
        os.replace(tmp, path)
        tmp = None
        _prune(path.parent)
    except Exception:                           # read-only home, full disk, a refusing dumpb: compile next time
        pass
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def _prune(where: Path) -> None:
    """Keep the KEEP most recently written databases (older tables' files would pile up)."""
    files = [p for p in where.glob("*" + SUFFIX) if not p.name.startswith(".tmp-")]
    files.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    for old in files[KEEP:]:
        old.unlink(missing_ok=True)
