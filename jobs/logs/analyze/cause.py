"""The root-cause rule: which failure candidate of a log names why the run ended (ranks as data, one rule).

The rule, in order:

1. A warning never decides: a record logged at WARNING/INFO level, or a Python warning
   (``UserWarning: …``, ``FutureWarning: …``), makes no candidate, whatever it names
   (pip prints ``No module named 'numpy'`` as a torch UserWarning long before the
   CMake error that fails the build). Nor does a line that is no event of the run
   (``NOT_EVENTS``): a command echoed with its flags (``--watchdog-timeout 3600``),
   environment settings (``VLLM_ENGINE_ITERATION_TIMEOUT_S=3600``), Python source (a pasted
   repro's ``except torch.cuda.OutOfMemoryError:``).
2. Each candidate line has a *rank* (``Rank``, the row's ``rank`` in signatures.FAILURES):
   a specific signature (CUDA OOM, NCCL, a compiler error) > a Python exception or a
   crash > a wrapper's *envelope* ("see above": pip's ``× … did not run successfully``,
   torchrun's ChildFailedError, ``ninja: build stopped``, a traceback header) > a bare
   ERROR-level line.
3. The highest rank wins; among equals the earliest: the first specific error ended the
   run, the ones after it are its consequences (a dead worker, then the NCCL timeout of
   the ranks waiting on it). Except where the later error cannot be the earlier one's
   consequence: after a build error, a GPU's own failure (a CUDA OOM, an Xid) means the job
   got past it (a probe's failed link test, as DeepSpeed's op builder prints), a build error after
   an NCCL error means the NCCL one was a configure probe's, and a GPU's
   hardware fault (an Xid, a GPU off the bus) explains the CUDA and NCCL errors around it,
   even where a paste puts its dmesg lines after them: that failure decides. And a hang read
   from repeated stall notices names no culprit: an NCCL timeout, a CUDA error or a GPU fault
   after them says what hung.
4. An envelope defers to the error inside it: when no candidate outranks it, the first
   ERROR line above it names the line (its cause stays the envelope's). A traceback's
   header is an envelope of its final line: an envelope that ends the traceback (a build
   tool's CalledProcessError: a setup.py or ``cmake --build`` wrapping ninja) replaces it,
   while an envelope printed before the traceback (``ninja: build stopped``) stays first. A
   traceback nested in a wrapper's output (pip's ``╰─> [N lines of output]`` block) ends on an
   indented exception line: that line is the error inside, not quoted source.
5. Progress past a logged error (``RECOVERY_ADVANCES`` updates of the series it was logged in,
   or where none ran yet, of the first one after it, counted from the error held: a wrapper such as
   pip prints its envelope before the output it wraps), a phase marker that moves the job on to
   another phase (where what is held may be a logged fallback, ``FALLBACK_CAUSES``: an OOM or
   an NCCL error is not undone by another rank's marker; or a build error as a marker moves the job on
   to training: a probe's compile or link test, DeepSpeed's op builder), or serving proves the job carried on:
   the candidates so far are dropped (an ``error_recovered`` warning remains). Only serving is
   proof: what a marker or progress dropped (another rank may log those while the one that raised
   the error died) is named again by an envelope after it, as in rule 4.
6. A server's request error is no failure: a plain exception (a traceback's final line, its
   header) within 40 lines after a line saying one request failed (uvicorn's ``Exception in ASGI
   application``, vLLM's ``Error in preprocessing prompt inputs``) is that request's, which the
   server answered: a ``request_error`` warning. That traceback ends on its exception line, or runs
   on through a chain's joint (``The above exception was the direct cause …``); a traceback after it
   that no joint links (the engine's own, dying a few lines later) is the run's. So is a client library's status error
   (``openai.BadRequestError``, ``httpx.HTTPStatusError``: ``CLIENT_STATUS_ERROR``) once the server was
   ready, and the traceback header it ends: a client's traceback pasted after the server's log. A
   specific cause there (a CUDA error) still decides; a client's connection error or timeout stays
   a failure (the server may have died or hung).

Which row decides one *line* that several rows match is the rows' ``priority`` (higher
first), so the table, not the order of code, says that "CUDA error … NCCL watchdog"
is a CUDA error.
"""
from __future__ import annotations

import re
from enum import IntEnum
from typing import Optional

from . import regexcache


class Spec(IntEnum):
    """A candidate's rank: how specifically its line names the cause of the run's end."""
    ERROR_LEVEL = 0    # an ERROR-level line, no signature
    UMBRELLA = 1       # an envelope, "see above": a wrapper / launcher / traceback header
    EXCEPTION = 2      # a Python exception line, a crash
    SPECIFIC = 3       # a specific signature (CUDA OOM, NCCL, ...)


# The causes of what a job logs and carries on from (rule 5: an optional import that failed, a caught
# exception, then "falling back to ..."): a phase marker after one proves recovery.
FALLBACK_CAUSES = frozenset(("exception", "import_error"))
# Levels whose records never make a candidate (rule 1).
WARNING_LEVELS = ("INFO", "DEBUG", "NOTICE", "WARNING", "WARN")
# A Python warning as `warnings` prints it: "path.py:276: UserWarning: …", "FutureWarning: …".
PY_WARNING = regexcache.compile(r"(?:^|[\s:])(?:[A-Z]\w*)?Warning: ")


# Lines that are no event of the run, whatever they name (rule 1): a command echoed (a shell prompt, a
# launcher with its flags: `--watchdog-timeout 3600`), environment settings (`…_TIMEOUT_S=3600`), Python
# source (a handler, a raise: a pasted repro script), and vLLM's version fallback (`No module named
# 'vllm._version'`, the second line of a source build's RuntimeWarning).
_LAUNCHERS = r"(?:python\d?(?:\.\d+)?|vllm|sglang|torchrun|deepspeed|accelerate|srun|sbatch|docker|podman|uv|pip\d?)"
NOT_EVENTS = regexcache.compile(
    r"^\s*(?:\$ "
    r"|(?:[A-Z][A-Z0-9_]*=\S*\s+)*[A-Z][A-Z0-9_]*=\S*\s*$"
    r"|(?:[A-Z][A-Z0-9_]*=\S*\s+)+" + _LAUNCHERS + r"\s"
    r"|" + _LAUNCHERS + r"\s(?!.*: error: ).*\s--[a-z]"        # (not argparse's `vllm serve: error: argument --x`)
    r"|except\b.*:\s*$|raise [\w.]+(?:\(|\s*$)"
    r"|\[--?[A-Za-z][\w\-]*(?:[ =][^\]]*)?\](?:\s|$))"    # argparse's usage text: `[--watchdog-timeout WATCHDOG_TIMEOUT]`
    r"|No module named 'vllm\._version'")


def is_no_event(body: str) -> bool:
    """Rule 1: True if this record is a command, settings or source code, which never names the cause."""
    return NOT_EVENTS.search(body) is not None


def is_warning(body: str, level: Optional[str]) -> bool:
    """Rule 1: True if this record is a warning, which never names the cause."""
    if level in WARNING_LEVELS:
        return True
    return "Warning: " in body and PY_WARNING.search(body) is not None


def outranks(new_spec: int, held_spec: Optional[int]) -> bool:
    """Rule 3: does a candidate of rank new_spec replace the held one (earliest of the highest rank)?"""
    return held_spec is None or new_spec > held_spec
