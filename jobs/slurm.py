"""The Slurm backend: a run submitted with sbatch, followed through squeue/sstat/sacct, stopped with scancel.

A Slurm run keeps the local runner's contract, so every view reads it unchanged:
its run directory holds meta.json (backend "slurm", slurm_job_id), output.log (sbatch
--output points there: the cluster shares this filesystem), times, samples.jsonl,
events.jsonl, health.json and, once Slurm reports a final state, exit.json.

The runner's counterpart is the watcher, `python -m gpudeck.jobs.slurm --detach RUN_DIR`:
a small detached stdlib-only process that follows output.log by byte offset, polls
squeue (state, reason, nodes) and sstat (CPU, RSS) every POLL_S, runs the health
monitors once the job runs, and writes exit.json from sacct when the job ends. Slurm,
not the watcher, runs and sequences the jobs: `needs` become --dependency=afterok, so
a queued pipeline advances with no gpudeck process alive. A watcher that died is
replaced by the next reader (`reconcile`), which finalises a run that ended meanwhile.

Slurm's CLIs are read in their pipe-separated forms (sacct/sstat --parsable2, squeue
and sinfo with a '|'-separated format): those are the same from Slurm 20 to 24, while
the --json documents change schema with each release's OpenAPI plugin.
"""
from __future__ import annotations

import fcntl
import os
import re
import select
import shlex
import signal
import socket
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from gpudeck.jobs.procs import RUN_TAG, ProcessId, identity, is_alive, signal_name, signal_number
from gpudeck.jobs.runs import Run, append_jsonl, open_private, read_json, run_dir_main, write_json_atomic
from gpudeck.jobs.strictjson import parse_integer

LIVE = "slurm.json"              # the watcher's latest reading of the job (state, reason, nodes)
SCRIPT = "job.sbatch"
TICK_S = 1.0
# squeue and sstat once every 2 s per run: a state change shows within 2 s, and a
# few watchers cost slurmctld less than one user's `watch squeue`.
POLL_S = 2.0
CLI_TIMEOUT_S = 30.0
# After the job leaves squeue's final states, how long sacct may lag behind slurmctld
# (accounting reaches slurmdbd asynchronously) before the record is written without it.
SACCT_LAG_S = 15.0
# A job neither squeue nor sacct knows for this long is recorded as gone.
UNKNOWN_GIVE_UP_S = 60.0
# How long `stop` waits for Slurm to report a final state after the last scancel.
STOP_VERIFY_S = 30.0

PENDING_STATES = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
                            "RESV_DEL_HOLD", "SUSPENDED", "STOPPED"})
FINAL_STATES = frozenset({"COMPLETED", "FAILED", "TIMEOUT", "OUT_OF_MEMORY", "CANCELLED", "NODE_FAIL",
                          "PREEMPTED", "BOOT_FAIL", "DEADLINE", "REVOKED", "SPECIAL_EXIT"})
# What each final state means, in the words `jobs` and the exit record use.
FINAL_NOTES = {
    "COMPLETED": "completed",
    "FAILED": "failed (non-zero exit)",
    "TIMEOUT": "killed by Slurm at its time limit",
    "OUT_OF_MEMORY": "killed by Slurm for exceeding its memory limit (OUT_OF_MEMORY)",
    "CANCELLED": "cancelled",
    "NODE_FAIL": "its node failed",
    "PREEMPTED": "preempted",
    "BOOT_FAIL": "its node failed to boot",
    "DEADLINE": "missed its deadline",
}


class SlurmError(Exception):
    """A Slurm command failed; str() is one line naming the command and Slurm's own message."""


# -- Slurm's command line tools --------------------------------------------------

def _cli(argv: list[str], *, env: Optional[dict] = None, timeout: float = CLI_TIMEOUT_S) -> str:
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, env=env, timeout=timeout)
    except FileNotFoundError:
        raise SlurmError(f"{argv[0]} not found: is Slurm's client (slurm-client) installed here?") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{argv[0]} did not answer within {timeout:.0f}s (slurmctld down?)") from None
    out = done.stdout.decode("utf-8", "replace")
    if done.returncode != 0:
        err = done.stderr.decode("utf-8", "replace").strip().splitlines()
        message = err[-1].strip() if err else f"exit status {done.returncode}"
        # Slurm's tools name themselves ("sbatch: error: ..."): one name is enough.
        if not message.startswith(f"{argv[0]}: "):
            message = f"{argv[0]}: {message}"
        raise SlurmError(message)
    return out


def parse_time(text: str) -> Optional[float]:
    """Unix time from Slurm's 2026-12-01T04:21:39 (the cluster's local time); None for Unknown/None."""
    try:
        return time.mktime(time.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S"))
    except (ValueError, OverflowError):
        return None


_SIZE = re.compile(r"^([\d.]+)([KMGTP]?)$")
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40, "P": 2**50}


def parse_size(text: str) -> Optional[int]:
    """Bytes from Slurm's 44.50M / 3244K / 0; None when empty or unreadable."""
    match = _SIZE.match(text.strip())
    if not match:
        return None
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def parse_duration(text: str) -> Optional[float]:
    """Seconds from Slurm's [D-][HH:]MM:SS[.mmm] (TotalCPU, Elapsed, cpu= in TRES); None if unreadable."""
    text = text.strip()
    if not text:
        return None
    days = 0
    if "-" in text:
        d, _, text = text.partition("-")
        if not d.isdigit():
            return None
        days = int(d)
    try:
        parts = [float(p) for p in text.split(":")]
    except ValueError:
        return None
    seconds = 0.0
    for part in parts:
        seconds = seconds * 60 + part
    return days * 86400 + seconds


def parse_exit(text: str) -> tuple[Optional[int], Optional[int]]:
    """(exit code, signal) from Slurm's "3:0" / "0:9"."""
    code, _, sig = text.strip().partition(":")
    try:
        return int(code), int(sig or 0)
    except ValueError:
        return None, None


@dataclass(frozen=True)
class SlurmJob:
    """One reading of a job from squeue (while slurmctld still holds it)."""

    job_id: str
    state: str
    reason: Optional[str]
    nodes: Optional[str]
    start: Optional[float]
    end: Optional[float]

    @property
    def final(self) -> bool:
        return self.state in FINAL_STATES


def squeue(job_id: str, env: Optional[dict] = None) -> Optional[SlurmJob]:
    """The job as slurmctld sees it now, final states included; None once it has been purged."""
    try:
        out = _cli(["squeue", "-h", "--states=all", "-j", job_id, "-o", "%i|%T|%r|%N|%S|%e"], env=env)
    except SlurmError as exc:
        if "Invalid job id" in str(exc):
            return None
        raise
    for line in out.splitlines():
        parts = line.split("|")
        if len(parts) == 6 and parts[0] == job_id:
            state = parts[1].split()[0] if parts[1].strip() else "UNKNOWN"
            reason = parts[2] if parts[2] not in ("", "None", "(null)") else None
            return SlurmJob(job_id, state, reason, parts[3] or None, parse_time(parts[4]), parse_time(parts[5]))
    return None


@dataclass(frozen=True)
class Accounting:
    """What sacct recorded of a job: its state, exit and usage (None where accounting does not say)."""

    state: str
    exit_code: Optional[int]
    signal: Optional[int]
    reason: Optional[str]
    nodes: Optional[str]
    start: Optional[float]
    end: Optional[float]
    cpu_s: Optional[float]
    max_rss: Optional[int]

    @property
    def final(self) -> bool:
        return self.state in FINAL_STATES


SACCT_FIELDS = "JobID,State,ExitCode,Reason,NodeList,Start,End,TotalCPU,MaxRSS"


def sacct(job_id: str, env: Optional[dict] = None) -> Optional[Accounting]:
    """The job line of `sacct -j ID`, with exit and usage completed from its batch step; None if unknown."""
    out = _cli(["sacct", "-n", "--parsable2", "-j", job_id,
                "-o", SACCT_FIELDS], env=env)
    job = batch = None
    max_rss = 0
    for line in out.splitlines():
        parts = line.split("|")
        if len(parts) != 9:
            continue
        if parts[0] == job_id:
            job = parts
        elif parts[0] == f"{job_id}.batch":
            batch = parts
        if parts[0].startswith(f"{job_id}."):
            max_rss = max(max_rss, parse_size(parts[8]) or 0)
    if job is None:
        return None
    state = job[1].split()[0] if job[1].strip() else "UNKNOWN"      # "CANCELLED by 0" -> CANCELLED
    code, sig = parse_exit(job[2])
    if (code, sig) == (0, 0) and batch is not None and state != "COMPLETED":
        # TIMEOUT and CANCELLED leave 0:0 on the job line; the batch step has the signal it died of.
        code, sig = parse_exit(batch[2])
    return Accounting(state=state, exit_code=code, signal=sig,
                      reason=job[3] if job[3] not in ("", "None") else None,
                      nodes=job[4] if job[4] not in ("", "None assigned") else None,
                      start=parse_time(job[5]), end=parse_time(job[6]), cpu_s=parse_duration(job[7]),
                      max_rss=max_rss or None)


def sstat(job_id: str, env: Optional[dict] = None) -> tuple[Optional[float], Optional[int]]:
    """(CPU seconds, RSS bytes) of the running batch step from sstat; (None, None) when it cannot say."""
    try:
        out = _cli(["sstat", "-n", "--parsable2", "-j", f"{job_id}.batch", "-o", "JobID,MaxRSS,TresUsageInTot"],
                   env=env)
    except SlurmError:
        return None, None
    for line in out.splitlines():
        parts = line.split("|")
        if len(parts) == 3:
            tres = dict(item.partition("=")[::2] for item in parts[2].split(",") if "=" in item)
            return parse_duration(tres.get("cpu", "")), parse_size(parts[1])
    return None, None


def scancel(job_id: str, sig: Optional[str] = None, env: Optional[dict] = None) -> None:
    """scancel the job; with a signal, deliver only that to the batch shell and everything it started."""
    argv = ["scancel"]
    if sig is not None:
        argv += ["--full", f"--signal={sig}"]
    _cli(argv + [job_id], env=env)


def sinfo(partitions: list[str], env: Optional[dict] = None) -> list[dict]:
    """The nodes of the partitions (all when empty): state, CPUs, GPUs configured and in use."""
    argv = ["sinfo", "-h", "-N", "-O", "NodeHost:|,Partition:|,StateLong:|,CPUsState:|,Gres:|,GresUsed:|"]
    if partitions:
        argv += ["-p", ",".join(partitions)]
    nodes = []
    for line in _cli(argv, env=env).splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) < 6:
            continue
        cpus = parts[3].split("/")           # allocated/idle/other/total
        nodes.append({
            "node": parts[0], "partition": parts[1].rstrip("*"), "state": parts[2],
            "cpus_alloc": _int(cpus[0]) if len(cpus) == 4 else None,
            "cpus": _int(cpus[3]) if len(cpus) == 4 else None,
            "gpus": _gpu_count(parts[4]), "gpus_used": _gpu_count(parts[5]),
        })
    return nodes


def cluster_status(jobs_file: Any) -> Optional[dict]:
    """`status`'s Slurm part: the nodes and GPUs of the partitions the Slurm jobs use; None without Slurm jobs."""
    specs = [spec for spec in jobs_file.jobs.values() if spec.backend == "slurm"]
    if not specs:
        return None
    # A job without a partition goes to the cluster's default one: then every partition is of interest.
    partitions = sorted({spec.partition for spec in specs if spec.partition}) if all(
        spec.partition for spec in specs) else []
    try:
        nodes = sinfo(partitions)
    except SlurmError as exc:
        return {"partitions": partitions, "nodes": [], "gpus": None, "gpus_used": None, "error": str(exc)}
    return {"partitions": partitions or sorted({n["partition"] for n in nodes}), "nodes": nodes,
            "gpus": sum(n["gpus"] for n in nodes), "gpus_used": sum(n["gpus_used"] for n in nodes), "error": None}


def status_lines(data: dict) -> list[str]:
    """The Slurm part of `status` as text: one line per partition's summary, one per node."""
    if data.get("error"):
        return [f"slurm: {data['error']}"]
    nodes = data.get("nodes") or []
    lines = [f"slurm partition {','.join(data.get('partitions') or []) or '(default)'}: {len(nodes)} node"
             f"{'s' if len(nodes) != 1 else ''}, GPUs {data.get('gpus_used')}/{data.get('gpus')} in use"]
    for n in nodes:
        lines.append(f"  {n['node']:<16} {n['partition']:<10} {n['state']:<12} CPUs {n['cpus_alloc']}/{n['cpus']}"
                     f"  GPUs {n['gpus_used']}/{n['gpus']}")
    return lines


_int = parse_integer        # the one strict number rule (strictjson) for a field of Slurm's text


_GPU_GRES = re.compile(r"(?:^|,)gpu(?::(?:\(null\)|[A-Za-z0-9_.-]+))?:(\d+)")


def _gpu_count(gres: str) -> int:
    """GPUs in a GRES string: "gpu:4", "gpu:h100:8(S:0-1)", "gpu:a100:2(IDX:0-1),nic:1" -> the sum."""
    return sum(int(n) for n in _GPU_GRES.findall(gres))


# -- submitting ----------------------------------------------------------------------

def batch_script(command: Any) -> str:
    """The sbatch script for a job's cmd: exec'd, so the stop signal reaches the job itself."""
    if isinstance(command, str):
        body = f"exec bash -c {shlex.quote(command)}"
    else:
        body = "exec " + shlex.join(str(c) for c in command)
    return f"#!/bin/bash\n# written by gpudeck; the job's cmd from jobs.toml\n{body}\n"


def sbatch_filename(path: Any) -> str:
    """A path as sbatch's --output reads it: its filename patterns (%j, %x, %N, %%...) would turn a state dir
    with a '%' into some other path, and the log would be written where nobody looks; %% is a literal %.
    A backslash sbatch drops (and no escape brings it back): such a path is refused, not silently lost."""
    text = str(path)
    if "\\" in text:
        raise SlurmError(f"sbatch cannot write the log to {text!r}: it drops the backslash from --output paths; "
                         "use a state dir without one (GPUDECK_STATE_DIR)")
    return text.replace("%", "%%")


def sbatch_argv(spec: Any, run: Run, cwd: str, after: list[str]) -> list[str]:
    argv = ["sbatch", "--parsable", f"--job-name={spec.name}", f"--output={sbatch_filename(run.log_path)}",
            "--open-mode=append", f"--chdir={cwd}"]
    if spec.partition:
        argv.append(f"--partition={spec.partition}")
    if spec.nodes:
        argv.append(f"--nodes={spec.nodes}")
    if spec.gpus_per_node:
        argv.append(f"--gres=gpu:{spec.gpus_per_node}")
    if spec.time:
        argv.append(f"--time={spec.time}")
    if spec.account:
        argv.append(f"--account={spec.account}")
    if after:
        # A failed dependency cancels the dependants: the queued pipeline ends instead of pending forever.
        argv += [f"--dependency=afterok:{':'.join(after)}", "--kill-on-invalid-dep=yes"]
    argv += list(spec.sbatch_args)
    argv.append(str(run.path / SCRIPT))
    return argv


def submit(run: Run, spec: Any, cwd: str, env: dict, after: list[str]) -> str:
    """sbatch the job into `run`; returns the Slurm job id. SlurmError when sbatch refuses."""
    # sbatch reads the script and hands Slurm a copy: it needs no exec bit, and stays private like the run.
    with open(open_private(run.path / SCRIPT, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "w") as fh:
        fh.write(batch_script(spec.cmd if isinstance(spec.cmd, str) else list(spec.cmd)))
    job_env = dict(os.environ)
    job_env.update(env)
    job_env.update({RUN_TAG: run.run_id, "GPUDECK_JOB": run.job, "GPUDECK_RUN_DIR": str(run.path)})
    argv = sbatch_argv(spec, run, cwd, after)
    run.add_event("SlurmSubmitting", argv=argv)
    out = _cli(argv, env=job_env).strip()
    job_id = out.split(";")[0]            # --parsable prints "ID" or "ID;CLUSTER"
    if not job_id.isdigit():
        raise SlurmError(f"sbatch printed no job id: {out[:200]!r}")
    return job_id


# -- the exit record ------------------------------------------------------------------

def exit_record(job_id: str, state: str, acct: Optional[Accounting], stopped: bool,
                job: Optional[SlurmJob] = None) -> dict:
    """exit.json for a final Slurm state: exit_code/signal as for local runs, plus Slurm's own words.

    A job that did not COMPLETE never reads as exit 0 (a TIMEOUT whose script caught
    SIGTERM and exited 0 still failed), so a pipeline never advances past it.
    """
    code = sig = None
    if acct is not None:
        code, sig = acct.exit_code, acct.signal
    exit_code: Optional[int] = code
    sig_name: Optional[str] = None
    if state == "OUT_OF_MEMORY" and not (sig and 0 < sig < 65):
        sig = 9               # Slurm's 0:125 marks the OOM kill; what the process got was the kernel's SIGKILL
    if sig and 0 < sig < 65:                 # other markers (Slurm's 125...) are not signals
        exit_code, sig_name = 128 + sig, signal_name(sig)
    if state != "COMPLETED" and exit_code == 0:
        exit_code = None
    ended = (acct.end if acct else None) or (job.end if job else None) or time.time()
    record: dict[str, Any] = {
        "exit_code": exit_code, "signal": sig_name, "ended_at": ended,
        # Asked to stop, it ended by our scancel, or by the stop signal (FAILED), or cleanly on it
        # (COMPLETED); a TIMEOUT or NODE_FAIL meanwhile is still Slurm's doing.
        "stopped_by_request": stopped and state in ("CANCELLED", "FAILED", "COMPLETED"), "leftovers": [],
        "backend": "slurm", "slurm_job_id": job_id, "slurm_state": state,
        "note": f"Slurm: {FINAL_NOTES.get(state, state.lower())}",
    }
    if acct is not None:
        # slurmctld's reason is the later word (DependencyNeverSatisfied; sacct still says Dependency).
        record.update(slurm_reason=(job.reason if job is not None and job.reason else acct.reason),
                      nodes=acct.nodes, cpu_s=acct.cpu_s, max_rss=acct.max_rss, started_at=acct.start)
    elif job is not None:
        record.update(slurm_reason=job.reason, nodes=job.nodes, started_at=job.start)
    return record


def _locked(run: Run) -> int:
    fd = open_private(run.path / ".slurm.lock", os.O_WRONLY | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def finalize(run: Run, state: str, acct: Optional[Accounting], job: Optional[SlurmJob] = None) -> dict:
    """Write exit.json and JobExited once, whoever (watcher, stop, a reader) sees the end first."""
    fd = _locked(run)
    try:
        existing = run.exit_record()
        if existing is not None:
            return existing
        meta = run.meta()
        record = exit_record(str(meta.get("slurm_job_id")), state, acct, run.stop_requested(), job)
        if not meta.get("started_at") and record.get("started_at"):
            # It ran between two polls: its runtime is Slurm's, not the time since submission.
            run.update_meta(started_at=record["started_at"], nodes=record.get("nodes"))
        run.write_exit(record)
        run.add_event("JobExited", exit_code=record["exit_code"], signal=record["signal"],
                      stopped_by_request=record["stopped_by_request"], slurm_state=state,
                      slurm_job_id=record["slurm_job_id"], note=record["note"])
        write_live(run, {"state": state, "reason": record.get("slurm_reason"), "nodes": record.get("nodes")})
        return record
    finally:
        os.close(fd)


def accounting_when_final(job_id: str, wait_s: float, env: Optional[dict] = None) -> Optional[Accounting]:
    """sacct's record once it shows a final state, waiting out its lag behind slurmctld; else slurmctld's own
    record (`scontrol show job`: a cluster without accounting, or sacct still behind); None if neither is final."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            acct = sacct(job_id, env)
        except SlurmError:
            break                   # no accounting on this cluster: slurmctld's record is all there is
        if acct is not None and acct.final:
            return acct
        if time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    try:
        acct = scontrol_job(job_id, env)
    except SlurmError:
        return None
    return acct if acct is not None and acct.final else None


def scontrol_job(job_id: str, env: Optional[dict] = None) -> Optional[Accounting]:
    """The job as slurmctld keeps it for MinJobAge after its end (no usage figures); None once purged."""
    try:
        out = _cli(["scontrol", "show", "job", "-o", job_id], env=env)
    except SlurmError as exc:
        if "Invalid job id" in str(exc):
            return None
        raise
    fields: dict[str, str] = {}
    for token in out.split():
        key, sep, value = token.partition("=")
        if sep and key not in fields:
            fields[key] = value
    if fields.get("JobId") != job_id or not fields.get("JobState"):
        return None
    code, sig = parse_exit(fields.get("ExitCode", ""))
    reason = fields.get("Reason")
    nodes = fields.get("NodeList")
    return Accounting(state=fields["JobState"], exit_code=code, signal=sig,
                      reason=reason if reason not in (None, "", "None") else None,
                      nodes=nodes if nodes not in (None, "", "(null)") else None,
                      start=parse_time(fields.get("StartTime", "")), end=parse_time(fields.get("EndTime", "")),
                      cpu_s=None, max_rss=None)


# -- the live reading ------------------------------------------------------------------

def live(run: Run) -> dict:
    """The latest reading of the job (state, reason, nodes, polled_at) from slurm.json."""
    return read_json(run.path / LIVE) or {}


def write_live(run: Run, fields: dict) -> None:
    data = live(run)
    data.update(fields)
    data["polled_at"] = round(time.time(), 3)
    write_json_atomic(run.path / LIVE, data)


def describe(data: dict) -> str:
    """`PENDING (Dependency)`, `RUNNING on node12`, `TIMEOUT`: Slurm's own state for the views."""
    state = data.get("state")
    if not state:
        return "submitted"
    if state in PENDING_STATES and data.get("reason"):
        return f"{state} ({data['reason']})"
    if state not in FINAL_STATES and data.get("nodes"):
        return f"{state} on {data['nodes']}"
    return state


# -- stop ------------------------------------------------------------------------------

def stop(run: Run, stop_signal: str, timeout: float) -> dict:
    """Stop signal through scancel, scancel after `timeout`, then wait until Slurm says the job is final.

    Returns {"signal", "escalated", "state", "final"}; SlurmError if Slurm cannot be reached.
    """
    job_id = str(run.meta().get("slurm_job_id"))
    job = squeue(job_id)
    result: dict[str, Any] = {"signal": None, "escalated": False, "state": job.state if job else None,
                              "final": bool(job and job.final), "was_running": bool(job and not job.final)}
    if job is None:
        acct = accounting_when_final(job_id, 0)
        result.update(state=acct.state if acct else None, final=acct is not None)
        return result
    if job.final:
        return result
    try:
        sig = signal_name(signal_number(stop_signal or "TERM"))[3:]
    except (AttributeError, ValueError):
        sig = "TERM"
    if job.state in PENDING_STATES:
        # Nothing runs yet: there is no process to give a grace period to.
        run.add_event("StopRequested", by="supervisor", pid=os.getpid(), slurm_job_id=job_id, signal=None)
        scancel(job_id)
    else:
        run.add_event("StopRequested", by="supervisor", pid=os.getpid(), slurm_job_id=job_id, signal=f"SIG{sig}",
                      timeout_s=timeout)
        scancel(job_id, sig)
        result["signal"] = f"SIG{sig}"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            job = squeue(job_id)
            if job is None or job.final:
                break
            time.sleep(0.25)
        if job is not None and not job.final:
            # scancel without a signal: Slurm's own SIGTERM, KillWait, SIGKILL of the whole job.
            run.add_event("StopEscalated", by="supervisor", slurm_job_id=job_id, command="scancel")
            scancel(job_id)
            result["escalated"] = True
    # Gone means gone: slurmctld holds the job COMPLETING until its processes are dead.
    deadline = time.monotonic() + STOP_VERIFY_S
    while time.monotonic() < deadline:
        job = squeue(job_id)
        if job is None or job.final:
            break
        time.sleep(0.25)
    acct = accounting_when_final(job_id, STOP_VERIFY_S)
    if acct is not None:
        result.update(state=acct.state, final=True)
        finalize(run, acct.state, acct)
    else:
        job = squeue(job_id)
        result.update(state=job.state if job else None, final=bool(job and job.final))
        if job is not None and job.final:
            finalize(run, job.state, None, job)
    return result


def doomed(run: Run) -> bool:
    """Slurm has ended the run, or will never start it (a dependency failed)."""
    if run.exit_record() is not None:
        return True
    try:
        job = squeue(str(run.meta().get("slurm_job_id") or ""))
    except SlurmError:
        return False
    return job is None or job.final or job.reason == "DependencyNeverSatisfied"


# -- readers -----------------------------------------------------------------------------

def reconcile(run: Run) -> None:
    """A Slurm run with no exit record and no live watcher: finalise it if Slurm says it ended, else re-watch it."""
    meta = run.meta()
    job_id = meta.get("slurm_job_id")
    if not job_id or run.exit_record() is not None:
        return
    watcher = ProcessId.from_jsonable(meta.get("runner"))
    if watcher is not None and is_alive(watcher.pid, watcher.start):
        return
    try:
        job = squeue(str(job_id))
        if job is None or job.final:
            acct = accounting_when_final(str(job_id), 0)
            if acct is not None:
                finalize(run, acct.state, acct, job)
                return
            if job is not None:
                finalize(run, job.state, None, job)
                return
        else:
            write_live(run, {"state": job.state, "reason": job.reason, "nodes": job.nodes})
    except SlurmError:
        return                       # Slurm unreachable: the run reads as it last did
    launch_watcher(run)


def launch_watcher(run: Run) -> None:
    """Start the detached watcher for a run (it forks away; this returns at once)."""
    from gpudeck.jobs.paths import child_launch
    env = {k: v for k, v in os.environ.items() if k not in (RUN_TAG, "GPUDECK_JOB", "GPUDECK_RUN_DIR")}
    # From a checkout, an install, or the SSH agent's zipapp on a login node alike.
    cwd, env = child_launch(env)
    with open(open_private(run.path / "runner.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT), "ab") as diag:
        launcher = subprocess.Popen([sys.executable, "-m", "gpudeck.jobs.slurm", "--detach", str(run.path)],
                                    cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=diag,
                                    stderr=diag, start_new_session=True, close_fds=True)
    try:
        launcher.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


# -- the watcher ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Tick:
    """What a monitor sees each second: the fields of the runner's Tick, so the same monitors serve both."""

    now: float
    run: Run
    meta: dict
    log_size: int
    log_grew: bool
    last_output_at: Optional[float]
    sample: dict
    job_alive: bool


class Watcher:
    """Follows one Slurm run until Slurm reports its end: times, samples, health, exit record."""

    def __init__(self, run_dir: str | Path, tick_s: float = TICK_S, poll_s: float = POLL_S) -> None:
        self.run = Run(Path(run_dir))
        self.tick_s = tick_s
        self.poll_s = poll_s
        self.job_id = ""
        self.monitors: list[Any] = []
        self._stop = False
        self._last_size = 0
        self._recorded = 0
        self._last_state: Optional[str] = None
        self._started = False
        self._unknown_since: Optional[float] = None
        self._cpu_s: Optional[float] = None
        self._rss: Optional[int] = None

    def _on_term(self, *_: Any) -> None:
        self._stop = True

    def main(self) -> int:
        # A watcher that is told to go just stops watching: the job is Slurm's, and the
        # next reader starts another watcher.
        signal.signal(signal.SIGHUP, lambda *_: None)
        signal.signal(signal.SIGINT, lambda *_: None)
        signal.signal(signal.SIGTERM, self._on_term)
        me = identity(os.getpid())
        meta = self.run.update_meta(runner=me.to_jsonable() if me else None, runner_host=socket.gethostname())
        self.job_id = str(meta.get("slurm_job_id") or "")
        if not self.job_id or self.run.exit_record() is not None:
            return 0
        self._last_size = self._recorded = self._log_size()
        self._started = bool(meta.get("started_at"))
        next_poll = 0.0
        while not self._stop:
            now = time.time()
            size, grew = self._update_times(now)
            if time.monotonic() >= next_poll:
                next_poll = time.monotonic() + self.poll_s
                if self._poll(now):
                    return 0
            if self._started:
                self._tick(now, size, grew, alive=True)
            self._sleep(self.tick_s)
        return 0

    def _sleep(self, seconds: float) -> None:
        try:
            select.select([], [], [], seconds)
        except InterruptedError:
            pass

    def _log_size(self) -> int:
        try:
            return os.stat(self.run.log_path).st_size
        except OSError:
            return self._last_size

    def _update_times(self, now: float) -> tuple[int, bool]:
        size = self._log_size()
        grew = size > self._last_size
        self._last_size = size
        if size > self._recorded:
            try:
                with open(open_private(self.run.times_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "a",
                          encoding="ascii") as fh:
                    fh.write(f"{size} {int(now)}\n")
            except OSError:
                pass          # a full disk or a planted symlink costs the arrival index, not the watch
            self._recorded = size
        return size, grew

    def _poll(self, now: float) -> bool:
        """One squeue (and sstat while running); True when the run has ended and is recorded."""
        if self.run.exit_record() is not None:
            return True                  # `stop` (or a reader) recorded the end first
        try:
            job = squeue(self.job_id)
        except SlurmError as exc:
            self._note_unreachable(str(exc))
            return False
        if job is None or job.final:
            return self._end(job, now)
        self._unknown_since = None
        if job.state != self._last_state:
            self.run.add_event("SlurmState", slurm_job_id=self.job_id, state=job.state, reason=job.reason,
                               nodes=job.nodes, previous=self._last_state)
            self._last_state = job.state
        write_live(self.run, {"job_id": self.job_id, "state": job.state, "reason": job.reason,
                              "nodes": job.nodes, "start": job.start})
        if job.state not in PENDING_STATES and not self._started:
            self._started = True
            self.run.update_meta(started_at=job.start or now, nodes=job.nodes)
            self.run.add_event("JobStarted", slurm_job_id=self.job_id, nodes=job.nodes)
            self.monitors = load_monitors(self.run)
        if self._started:
            self._cpu_s, self._rss = sstat(self.job_id)
        return False

    def _note_unreachable(self, error: str) -> None:
        if self._last_state != "UNREACHABLE":
            self.run.add_event("SlurmUnreachable", error=error)
            self._last_state = "UNREACHABLE"

    def _end(self, job: Optional[SlurmJob], now: float) -> bool:
        acct = accounting_when_final(self.job_id, SACCT_LAG_S if job is not None else 0)
        if acct is None and job is None:
            # Purged from slurmctld and unknown to accounting: wait a while, it may be a hiccup.
            if self._unknown_since is None:
                self._unknown_since = now
            if now - self._unknown_since < UNKNOWN_GIVE_UP_S:
                return False
            state = "UNKNOWN"
        elif acct is not None:
            state = acct.state
        else:
            assert job is not None
            state = job.state
        if not self._started and state != "CANCELLED":
            self._started = True
            self.monitors = load_monitors(self.run)
        self._update_times(time.time())
        record = finalize(self.run, state, acct, job)
        if self.monitors:
            self._tick(time.time(), self._last_size, False, alive=False)
            for monitor in list(self.monitors):
                self._call(monitor, "finished", self.run, record)
        else:
            index_at_end(self.run)          # never ran (cancelled while queued): still a run of the history
        return True

    def _tick(self, now: float, size: int, grew: bool, alive: bool) -> None:
        sample: dict[str, Any] = {"t": round(now, 3), "procs": None, "pids": [], "cpu_s": self._cpu_s, "rss": self._rss,
                  "read_bytes": None, "write_bytes": None, "log_bytes": size, "slurm_state": self._last_state}
        try:
            append_jsonl(self.run.samples_path, sample)
        except OSError:
            pass
        tick = Tick(now=now, run=self.run, meta=self.run.meta(), log_size=size, log_grew=grew,
                    last_output_at=None, sample=sample, job_alive=alive)
        for monitor in list(self.monitors):
            self._call(monitor, "tick", tick)

    def _call(self, monitor: Any, method: str, *args: Any) -> None:
        try:
            getattr(monitor, method)(*args)
        except Exception as exc:
            if monitor in self.monitors:
                self.monitors.remove(monitor)
            self.run.add_event("MonitorFailed", monitor=type(monitor).__name__, method=method, error=repr(exc),
                               traceback=traceback.format_exc(limit=5))


def index_at_end(run: Run) -> None:
    try:
        from gpudeck.jobs.history.index import index_run_at_end
        index_run_at_end(run.path)
    except Exception as exc:             # the history is rebuilt from run dirs; a failure here loses nothing
        run.add_event("MonitorFailed", monitor="history index", error=repr(exc))


def load_monitors(run: Run) -> list[Any]:
    """The runner's monitors (health, history), told that the job's port is not on this box (it runs on a node)."""
    meta = dict(run.meta())
    meta["port"] = None
    spec = dict(meta.get("spec") or {})
    spec["port"] = None
    meta["spec"] = spec
    try:
        from gpudeck.jobs.runner_monitors import make_monitors
        return list(make_monitors(run, meta))
    except Exception as exc:             # a broken monitor must not stop the run being followed
        run.add_event("MonitorFailed", monitor="gpudeck.jobs.runner_monitors", error=repr(exc))
        return []


def main(argv: Optional[list[str]] = None) -> int:
    return run_dir_main(argv, "gpudeck.jobs.slurm", Watcher)


if __name__ == "__main__":
    raise SystemExit(main())
