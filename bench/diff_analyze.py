"""Differential check: the analyzer of a git revision against today's, on every fixture and reference log.

Every difference must be a fix (named in a commit) or a regression to mend. The old analyzer is
read from git (`git show REV:jobs/logs/analyze/*.py`) into a temporary package, so both run in
one process on the same bytes (reference logs with their two header lines blanked, as the eval does).

    python bench/diff_analyze.py [REV] [--fields engine,phase,...] [--quiet]

Prints one line per differing field and a summary; exit 0 always (differences are for reading).
"""
from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gpudeck.jobs.logs.analyze import LogAnalyzer  # noqa: E402

# The analyzer as it was when the "read" issue was opened.
BASE = "6b3281a"
FIELDS = ("engine", "phase", "progress", "failure", "ready_line", "serving", "warnings")
REFERENCE = ROOT.parent / "shared" / "reference-logs"
FIXTURES = ROOT / "tests" / "fixtures" / "logs"


def load_old(rev: str, into: Path) -> Any:
    """The package jobs/logs/analyze of `rev`, importable as `old_analyze_<rev>`."""
    name = f"old_analyze_{rev}"
    pkg = into / name
    pkg.mkdir(parents=True, exist_ok=True)
    listing = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "--name-only", f"{rev}:jobs/logs/analyze"],
                             capture_output=True, text=True, check=True).stdout.split()
    for fname in listing:
        if fname.endswith(".py"):
            text = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:jobs/logs/analyze/{fname}"],
                                  capture_output=True, text=True, check=True).stdout
            (pkg / fname).write_text(text)
    sys.path.insert(0, str(into))
    return importlib.import_module(name)


def blank_header(data: bytes) -> bytes:
    lines = data.split(b"\n")
    for i in range(min(2, len(lines))):
        if lines[i].startswith(b"# "):
            lines[i] = b""
    return b"\n".join(lines)


def summary(result: Any) -> dict[str, Any]:
    j = result.to_json()
    prog = j["progress"]
    fail = j["failure"]
    return {"engine": j["engine"], "phase": j["phase"],
            "progress": prog and (prog["done"], prog["total"], prog["label"]),
            "failure": fail and (fail["cause"], fail["line"]), "ready_line": j["ready_line"],
            "serving": j["serving"], "warnings": sorted(w["code"] for w in j["warnings"])}


def plain(value: Any) -> Any:
    """A summary() value as JSON reads it back (tuples are lists)."""
    return json.loads(json.dumps(value))


def expectation(data: bytes) -> Optional[dict[str, Any]]:
    """A fixture's own expected reading, from its annotation header (the leading `#` lines the analyzer
    skips): `# expect: {...}`, fields of summary() as JSON (a failure [cause, line], a progress [done,
    total, label]), and `# fix: ROW`, the table row whose reading it is when it is new since BASE (the
    differential test takes those differences as that row's fix). None without an expect line."""
    expect, fix = None, None
    for line in data.split(b"\n", 8)[:8]:
        if not line.startswith(b"#"):
            break
        if line.startswith(b"# expect: "):
            expect = json.loads(line[len(b"# expect: "):])
        elif line.startswith(b"# fix: "):
            fix = line[len(b"# fix: "):].split()[0].decode()
    return None if expect is None else {"expect": expect, "fix": fix}


def run(analyzer_cls: Any, data: bytes) -> dict[str, Any]:
    a = analyzer_cls()
    a.feed(data)
    a.finish()
    return summary(a.result())


def corpus() -> list[tuple[str, bytes]]:
    files = [(f"fixture {p.name}", p.read_bytes()) for p in sorted(FIXTURES.glob("*.log"))]
    if REFERENCE.is_dir():
        files += [(f"reference {p.name}", blank_header(p.read_bytes())) for p in sorted(REFERENCE.glob("*.log"))]
    return files


def differences(rev: str) -> list[tuple[str, str, Any, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        old = load_old(rev, Path(tmp))
        out = []
        for name, data in corpus():
            before, after = run(old.LogAnalyzer, data), run(LogAnalyzer, data)
            for field in FIELDS:
                if before[field] != after[field]:
                    out.append((name, field, before[field], after[field]))
        return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rev", nargs="?", default=BASE)
    args = parser.parse_args(argv)
    diffs = differences(args.rev)
    for name, field, before, after in diffs:
        print(f"{name}: {field}: {before!r} -> {after!r}")
    print(f"{len(diffs)} difference(s) against {args.rev} on {len(corpus())} logs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
