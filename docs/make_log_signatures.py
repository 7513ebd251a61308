"""Writes docs/LOG_SIGNATURES.md and jobs/logs/analyze/derived_anchors.py from the signature table
(jobs/logs/analyze/signatures.py).

    python docs/make_log_signatures.py          # rewrite both
    python docs/make_log_signatures.py --check  # exit 1 if either checked-in file is stale
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gpudeck.jobs.logs.analyze.signatures import derived_anchors_source, markdown  # noqa: E402

DOC = ROOT / "docs" / "LOG_SIGNATURES.md"
ANCHORS = ROOT / "jobs" / "logs" / "analyze" / "derived_anchors.py"


def main(argv: list[str]) -> int:
    stale = []
    for path, text in ((DOC, markdown()), (ANCHORS, derived_anchors_source())):
        if "--check" in argv:
            fresh = path.is_file() and path.read_text(encoding="utf-8") == text
            print(f"{path.name}: {'up to date' if fresh else 'stale: run python docs/make_log_signatures.py'}")
            stale += [] if fresh else [path]
        else:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
