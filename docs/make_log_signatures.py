"""Writes docs/LOG_SIGNATURES.md from the signature table (jobs/logs/analyze/signatures.py).

    python docs/make_log_signatures.py          # rewrite the doc
    python docs/make_log_signatures.py --check  # exit 1 if the checked-in doc is stale
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gpudeck.jobs.logs.analyze.signatures import markdown  # noqa: E402

DOC = ROOT / "docs" / "LOG_SIGNATURES.md"


def main(argv: list[str]) -> int:
    text = markdown()
    if "--check" in argv:
        stale = not DOC.is_file() or DOC.read_text(encoding="utf-8") != text
        print(f"{DOC.name}: {'stale: run python docs/make_log_signatures.py' if stale else 'up to date'}")
        return 1 if stale else 0
    DOC.write_text(text, encoding="utf-8")
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
