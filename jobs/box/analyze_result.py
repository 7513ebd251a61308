"""What a Box answers to `analyze`: a result of results.py's kind, in a module of its own so that
`gpudeck analyze` (one CLI run per log) loads it without the other results' dataclasses.
Stdlib only (the agent imports this module on the box)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class AnalyzeResult:
    """`gpudeck analyze FILE`: the analysis (`--json` form), unrounded for the text form, and whether it was cut."""
    analysis: dict
    raw: dict
    truncated: bool = False

    def log_analysis(self) -> Any:
        from gpudeck.jobs.logs.analyze import LogAnalysis
        return LogAnalysis.from_dict(self.raw)

    def to_json(self) -> dict:
        return {"analysis": self.analysis, "raw": self.raw, "truncated": self.truncated}

    @classmethod
    def from_json(cls, obj: Any) -> "AnalyzeResult":
        obj = _dict(obj)
        return cls(analysis=_dict(obj.get("analysis")), raw=_dict(obj.get("raw")), truncated=bool(obj.get("truncated")))


def _dict(value: Any) -> dict:
    return dict(value) if isinstance(value, dict) else {}
