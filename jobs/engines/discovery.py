"""Every inference engine on the box, gpudeck's or not: processes grouped per engine, port, GPU memory, owner.

A process belongs to gpudeck when its environment carries GPUDECK_RUN_ID (the
runner sets it, and it is inherited by EngineCore, workers and schedulers even
after they are orphaned), or when its pid is one a live run recorded. Everything
else that looks like vLLM or SGLang is *foreign*, orphans under PID 1 included.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Iterable, Mapping, Optional

from gpudeck.jobs.engines.profiles import PROFILES, find_invocation, parse_launch

RUN_TAG = "GPUDECK_RUN_ID"
JOB_TAG = "GPUDECK_JOB"
# Wrappers whose command line merely contains an engine command (`bash -c "vllm serve …"`,
# `timeout 600 vllm serve …`) are not engine processes themselves; the engine is their child.
_NOT_ENGINES = {"bash", "sh", "dash", "zsh", "fish", "timeout", "tmux", "screen", "ssh", "sudo",
                "grep", "pgrep", "less", "tail", "watch", "strace", "gdb", "py-spy"}


@dataclass(frozen=True)
class EngineMember:
    pid: int
    title: str                       # process title (VLLM::Worker_TP3) or program name
    gpu_mem: Optional[int] = None    # bytes on all GPUs; None when NVML does not say
    create_time: float = 0.0         # with pid, names this very process (a PID is reused)


@dataclass(frozen=True)
class EngineProcess:
    """One engine: its root process and every process under it."""

    pid: int                         # the root (launcher, or an orphaned EngineCore/scheduler)
    engine: str                      # "vllm" | "sglang"
    port: Optional[int]              # a port one of its processes listens on
    gpu_mem: Optional[int]           # bytes, summed over members; None when unknown
    cmdline: str
    managed: bool
    job: Optional[str] = None
    run_id: Optional[str] = None
    orphan: bool = False             # root's launcher is gone (ppid 1 or a subreaper)
    create_time: float = 0.0
    model: Optional[str] = None
    members: tuple[EngineMember, ...] = ()
    gpus: tuple[int, ...] = ()       # GPU indices its members hold memory on

    def to_dict(self) -> dict:
        d = asdict(self)
        d["members"] = [asdict(m) for m in self.members]
        d["gpus"] = list(self.gpus)
        return d

    def describe(self) -> str:
        who = f"job {self.job}" if self.managed else "not started by gpudeck"
        return f"PID {self.pid} ({self.members[0].title if self.members else self.engine}), {who}"


def classify(name: str, cmdline: list[str]) -> Optional[tuple[str, str]]:
    """(engine, role) for an engine process, role "launcher" | "worker"; None otherwise."""
    if not cmdline and not name:
        return None
    joined = " ".join(cmdline)
    for profile in PROFILES.values():
        for prefix in profile.title_prefixes:
            # setproctitle rewrites argv, so the title is cmdline[0]; name() is it cut to 15 chars.
            if name.startswith(prefix) or (cmdline and cmdline[0].startswith(prefix)):
                return profile.name, "worker"
    base = os.path.basename(cmdline[0]) if cmdline else name
    if base in _NOT_ENGINES or name in _NOT_ENGINES:
        return None
    if cmdline:
        inv = find_invocation(cmdline)
        if inv is not None:
            return inv.engine, "launcher"
    for profile in PROFILES.values():
        if any(m in joined for m in profile.helper_markers):
            return profile.name, "worker"
    return None


def _title(name: str, cmdline: list[str]) -> str:
    if cmdline and "::" in cmdline[0]:
        return cmdline[0].strip()
    return name or (os.path.basename(cmdline[0]) if cmdline else "?")


def gpu_memory_by_pid() -> tuple[dict[int, int], dict[int, set[int]]]:
    """({pid: bytes}, {pid: {gpu index}}) from NVML; empty when NVML is unavailable."""
    try:
        from gpudeck.jobs.telemetry import gpu
        holders = gpu.local().holders()
    except Exception:
        holders = None
    mem: dict[int, int] = {}
    gpus: dict[int, set[int]] = {}
    for h in holders or ():
        mem[h.pid] = mem.get(h.pid, 0) + (h.mem_used or 0)
        gpus.setdefault(h.pid, set()).add(h.gpu)
    return mem, gpus


def listening_ports_by_pid() -> dict[int, set[int]]:
    import psutil
    out: dict[int, set[int]] = {}
    try:
        conns = psutil.net_connections(kind="inet")
    except (psutil.AccessDenied, OSError):
        return out
    for c in conns:
        if c.status == psutil.CONN_LISTEN and c.pid and c.laddr:
            out.setdefault(c.pid, set()).add(c.laddr.port)
    return out


@dataclass
class _Proc:
    pid: int
    ppid: int
    name: str
    cmdline: list[str]
    create_time: float
    engine: Optional[str] = None
    role: Optional[str] = None
    children: list[int] = field(default_factory=list)


def _process_table() -> dict[int, _Proc]:
    table = _proc_fs_table() if os.path.isfile("/proc/self/stat") else None
    if table is None:
        table = _psutil_table()
    for proc in table.values():
        parent = table.get(proc.ppid)
        if parent is not None:
            parent.children.append(proc.pid)
    return table


def _psutil_table() -> dict[int, _Proc]:
    import psutil
    table: dict[int, _Proc] = {}
    for p in psutil.process_iter(["pid", "ppid", "name", "cmdline", "create_time", "status"]):
        info = p.info
        if info["status"] == psutil.STATUS_ZOMBIE:
            continue                  # exited, holds nothing; its parent has not reaped it yet
        table[info["pid"]] = _Proc(info["pid"], info["ppid"] or 0, info["name"] or "",
                                   list(info["cmdline"] or ()), info["create_time"] or 0.0)
    return table


def _proc_fs_table() -> Optional[dict[int, _Proc]]:
    """The same table from two reads per process of /proc (stat, cmdline), the facts psutil gives.

    psutil's process_iter costs ~45 us a process here (a Process object, one-shot caches, three
    reads); `gpudeck status` scans every process of a busy box inside its 0.1 s rate window, and
    on a big box the scan outlasted the window. Equality with psutil, field by field, is a test.
    None when /proc cannot be read as expected (then psutil does it).
    """
    try:
        with open("/proc/stat", "rb") as f:
            boot = next(float(line.split()[1]) for line in f if line.startswith(b"btime"))
        ticks = os.sysconf("SC_CLK_TCK")
        pids = [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]
    except (OSError, StopIteration, ValueError):
        return None
    table: dict[int, _Proc] = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue                  # gone since the listing
        close = stat.rfind(b")")
        fields = stat[close + 2:].split()
        if len(fields) < 20 or fields[0] == b"Z":
            continue                  # a zombie holds nothing; its parent has not reaped it yet
        name = os.fsdecode(stat[stat.find(b"(") + 1:close])
        cmdline = _read_cmdline(pid)
        if len(name) >= 15 and cmdline:
            # comm is cut to 15 bytes; the program's own name is more telling when it starts the same.
            program = os.path.basename(cmdline[0])
            if program.startswith(name):
                name = program
        table[pid] = _Proc(pid, int(fields[1]), name, cmdline, int(fields[19]) / ticks + boot)
    return table


def _read_cmdline(pid: int) -> list[str]:
    """argv as /proc shows it: NUL-separated, or space-separated after a setproctitle rewrite."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            data = os.fsdecode(f.read())
    except OSError:
        return []
    if not data:
        return []
    sep = "\x00" if data.endswith("\x00") else " "
    if data.endswith(sep):
        data = data[:-1]
    argv = data.split(sep)
    if sep == "\x00" and len(argv) == 1 and " " in data:
        argv = data.split(" ")
    return argv


def _environ_tags(pid: int) -> tuple[Optional[str], Optional[str]]:
    import psutil
    try:
        env = psutil.Process(pid).environ()
    except (psutil.Error, OSError):
        return None, None
    return env.get(RUN_TAG), env.get(JOB_TAG)


def discover_engines(live_runs: Optional[Mapping[int, tuple[str, str]]] = None, *,
                     with_gpu: bool = True) -> list[EngineProcess]:
    """All engine processes on this box, grouped per engine, sorted by root pid.

    live_runs: {pid: (job, run_id)} of processes gpudeck's live runs recorded — the
    fallback when a process's environment cannot be read.
    """
    # The table comes from /proc, but engines' sockets and environments come through psutil: a box
    # without it fails here, before any work, the same way whether or not an engine runs (pivot
    # over SSH turns this ImportError into its one line).
    import psutil  # noqa: F401
    live_runs = dict(live_runs or {})
    table = _process_table()
    for proc in table.values():
        if proc.pid == os.getpid():
            continue
        hit = classify(proc.name, proc.cmdline)
        if hit:
            proc.engine, proc.role = hit
    roots: list[_Proc] = []
    for proc in table.values():
        if proc.engine is None:
            continue
        parent = table.get(proc.ppid)
        if parent is not None and parent.engine is not None:
            continue                  # a member of its parent's engine
        roots.append(proc)
    if not roots:
        return []
    ports = listening_ports_by_pid()
    mem, gpus = gpu_memory_by_pid() if with_gpu else ({}, {})
    engines = []
    for root in sorted(roots, key=lambda p: p.pid):
        engine = root.engine
        assert engine is not None                    # roots are engine processes
        members = _subtree(table, root.pid)
        run_id, job = None, None
        for m in members:
            run_id, job = _environ_tags(m.pid)
            if run_id:
                break
        if not run_id:
            for m in members:
                if m.pid in live_runs:
                    job, run_id = live_runs[m.pid]
                    break
        member_ports = sorted(set().union(*(ports.get(m.pid, set()) for m in members)))
        launch = parse_launch(root.cmdline) if root.role == "launcher" else None
        port = None
        if member_ports:
            declared = launch.port if launch and launch.port else PROFILES[engine].default_port
            if declared in member_ports:
                port = declared
            elif root.role == "launcher":
                port = member_ports[0]
            # else: an orphaned core's sockets are internal (ZMQ), not an API port
        known = [mem[m.pid] for m in members if m.pid in mem]
        # An EngineCore, worker or scheduler as root means its launcher died: it was
        # orphaned, re-parented to PID 1 or to a subreaper (gpudeck's runner is one).
        orphan = root.role == "worker"
        engines.append(EngineProcess(
            pid=root.pid, engine=engine, port=port,
            gpu_mem=sum(known) if known else None,
            cmdline=" ".join(root.cmdline).strip() or root.name,
            managed=run_id is not None, job=job, run_id=run_id, orphan=orphan,
            create_time=root.create_time, model=launch.model if launch else None,
            members=tuple(EngineMember(m.pid, _title(m.name, m.cmdline), mem.get(m.pid), m.create_time)
                          for m in members),
            gpus=tuple(sorted(set().union(*(gpus.get(m.pid, set()) for m in members))))))
    return engines


def _subtree(table: dict[int, _Proc], root: int) -> list[_Proc]:
    out, stack, seen = [], [root], set()
    while stack:
        pid = stack.pop(0)
        if pid in seen or pid not in table:
            continue
        seen.add(pid)
        out.append(table[pid])
        stack.extend(sorted(table[pid].children))
    return out


def engines_payload(engines: Iterable[EngineProcess]) -> list[dict]:
    """The `engines` list of `gpudeck status --json`."""
    return [{"pid": e.pid, "engine": e.engine, "port": e.port, "gpu_mem": e.gpu_mem,
             "cmdline": e.cmdline, "managed": e.managed, "job": e.job, "run_id": e.run_id,
             "orphan": e.orphan, "model": e.model, "gpus": list(e.gpus),
             "members": [{"pid": m.pid, "title": m.title, "gpu_mem": m.gpu_mem} for m in e.members]}
            for e in engines]
