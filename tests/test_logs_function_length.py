"""No function in jobs/logs/ is over 80 lines (the "read" issue: freeze the micro-tuning, keep the reader readable)."""
from __future__ import annotations

import ast
from pathlib import Path

LOGS = Path(__file__).resolve().parents[1] / "jobs" / "logs"
LIMIT = 80


def test_no_function_in_jobs_logs_is_over_80_lines() -> None:
    long = []
    for path in sorted(LOGS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1       # type: ignore[operator]
                if lines > LIMIT:
                    long.append(f"{path.relative_to(LOGS)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, long
