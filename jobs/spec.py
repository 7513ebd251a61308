"""jobs.toml: the declared jobs, loaded and validated (every error located as FILE:LINE:COL)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

JOB_KINDS = ("engine", "build", "train", "stage", "service")
ENGINES = ("vllm", "sglang")


@dataclass(frozen=True)
class JobSpec:
    """One `[jobs.NAME]` table, with defaults applied and `${vars}` expanded."""

    name: str
    cmd: Union[str, tuple[str, ...]]           # str: run with `bash -c`; tuple: argv
    cwd: Optional[str] = None
    env: dict[str, str] = field(default_factory=dict)
    kind: str = "stage"
    gpus: tuple[int, ...] = ()                  # -> CUDA_VISIBLE_DEVICES
    port: Optional[int] = None
    needs: tuple[str, ...] = ()
    done_when: Optional[str] = None             # a path; exists -> the stage counts as done
    stop_signal: str = "TERM"
    stop_timeout: float = 30.0                  # seconds
    stall_after: Optional[float] = None         # seconds; None -> a default per kind and phase
    log_keep: int = 20                          # runs of this job kept on disk
    engine: Optional[str] = None                # "vllm" | "sglang"
    python: Optional[str] = None                # interpreter of the engine's environment
    model: Optional[str] = None                 # for display and doctor's disk check
    health_path: Optional[str] = None
    metrics_path: Optional[str] = None
    on_alert: Optional[str] = None              # shell command fired with GPUDECK_ALERT_* env
    description: Optional[str] = None
    line: int = 0                               # where the table starts in jobs.toml (1-based)


@dataclass(frozen=True)
class JobsFile:
    path: Path
    jobs: dict[str, JobSpec]                    # in file order
    vars: dict[str, str] = field(default_factory=dict)
    on_alert: Optional[str] = None              # file-wide default for jobs without their own
