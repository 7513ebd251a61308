"""The agent zipapp: gpudeck's core packed reproducibly, named by its content hash, for boxes without gpudeck."""
from __future__ import annotations

import hashlib
import io
import zipfile
from functools import lru_cache
from pathlib import Path

_CORE = Path(__file__).resolve().parent.parent          # the folder installed as gpudeck.jobs
_MAIN = (b'"""gpudeck agent zipapp: gpudeck.jobs packed by `gpudeck --host`."""\n'
         b"from gpudeck.jobs.hosts.agent import main\n"
         b'raise SystemExit(main(via="zipapp"))\n')
# A fixed timestamp: the same sources always give the same bytes, hence the same name,
# so a box keeps one copy per gpudeck version and an upload happens once.
_EPOCH = (1980, 1, 1, 0, 0, 0)


@lru_cache(maxsize=1)
def agent_zipapp() -> tuple[str, bytes]:
    """(file name `agent-<sha256[:16]>.pyz`, bytes). Only .py sources: no caches, no data."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        def add(name: str, data: bytes) -> None:
            info = zipfile.ZipInfo(name, _EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, data)
        add("__main__.py", _MAIN)
        add("gpudeck/__init__.py", b"")
        for path in sorted(_CORE.rglob("*.py")):
            rel = path.relative_to(_CORE)
            if "__pycache__" in rel.parts or any(p.startswith(".") for p in rel.parts):
                continue
            add(f"gpudeck/jobs/{rel.as_posix()}", path.read_bytes())
    data = buf.getvalue()
    return f"agent-{hashlib.sha256(data).hexdigest()[:16]}.pyz", data
