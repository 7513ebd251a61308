"""The `status` payload: one Snapshot as the JSON dict and the plain-text table every face shares."""
from __future__ import annotations

import time
from typing import Any, Optional

from gpudeck.jobs.telemetry.snapshot import GpuProcess, PortListener, ProcInfo, Snapshot, to_jsonable

_PROC_FIELDS = ("name", "cmdline", "user", "cpu_percent", "rss", "age_s", "known")
_CORE_KEYS = ("time", "simulated", "host", "gpus", "gpu_error", "ports")


def _proc_fields(proc: Optional[ProcInfo]) -> dict[str, Any]:
    if proc is None:
        return {name: None for name in _PROC_FIELDS}
    return {name: getattr(proc, name) for name in _PROC_FIELDS}


def _gpu_process(p: GpuProcess) -> dict[str, Any]:
    # Flat: pid and mem_used at top level, the /proc facts beside them (known=False: not visible here).
    out: dict[str, Any] = {"pid": p.pid, "mem_used": p.mem_used, "sm_util": p.sm_util}
    out.update(_proc_fields(p.proc))
    return out


def _port(lp: PortListener) -> dict[str, Any]:
    proc = lp.proc
    return {"port": lp.port, "address": lp.address, "pid": lp.pid, "process": lp.process,
            "cmdline": proc.cmdline if proc else None, "user": proc.user if proc else None}


def status_payload(snapshot: Snapshot) -> dict[str, Any]:
    """The `gpudeck status --json` object.

    Keys: time, simulated, host{...HostSample}, gpus[{...GpuSample, processes[{pid, mem_used,
    sm_util, name, cmdline, user, cpu_percent, rss, age_s, known}]}], gpu_error,
    ports[{port, address, pid, process, cmdline, user}], then every key of snapshot.extra
    (later layers: "engines", "jobs", ...) that does not collide with those.
    """
    gpus = []
    for g in snapshot.gpus:
        d = to_jsonable(g)
        d["processes"] = [_gpu_process(p) for p in g.processes]
        gpus.append(d)
    payload: dict[str, Any] = {
        "time": snapshot.time,
        "simulated": snapshot.simulated,
        "host": to_jsonable(snapshot.host),
        "gpus": gpus,
        "gpu_error": snapshot.gpu_error,
        "ports": [_port(lp) for lp in snapshot.ports],
    }
    for key, value in snapshot.extra.items():
        if key not in _CORE_KEYS:
            payload[str(key)] = to_jsonable(value)
    return payload


def snapshot_from_payload(payload: dict[str, Any]) -> Snapshot:
    """The inverse of `status_payload`: a remote host's payload back into a Snapshot for the same faces."""
    import dataclasses

    from gpudeck.jobs.telemetry.snapshot import GpuSample, HostSample

    def build(cls: Any, data: dict[str, Any], **over: Any) -> Any:
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in names}
        kwargs.update(over)
        return cls(**kwargs)

    def proc(data: dict[str, Any]) -> ProcInfo:
        return build(ProcInfo, data, known=bool(data.get("known", True)))

    gpus = []
    for g in payload.get("gpus") or []:
        procs = tuple(GpuProcess(pid=p["pid"], mem_used=p.get("mem_used"), sm_util=p.get("sm_util"),
                                 proc=proc(p) if p.get("name") or p.get("cmdline") else None)
                      for p in g.get("processes") or [])
        gpus.append(build(GpuSample, g, processes=procs))
    ports = tuple(PortListener(port=p["port"], address=p.get("address") or "", pid=p.get("pid"),
                               process=p.get("process"),
                               proc=ProcInfo(pid=p["pid"], cmdline=p.get("cmdline"), user=p.get("user"))
                               if p.get("pid") is not None else None)
                  for p in payload.get("ports") or [])
    extra = {k: v for k, v in payload.items() if k not in _CORE_KEYS}
    return Snapshot(time=payload.get("time") or time.time(), host=build(HostSample, payload.get("host") or {"name": "?"}),
                    gpus=tuple(gpus), gpu_error=payload.get("gpu_error"), ports=ports,
                    simulated=bool(payload.get("simulated")), extra=extra)


# -- plain-text face ----------------------------------------------------------------------

def _bytes(n: Optional[float]) -> str:
    if n is None:
        return "n/a"
    for unit, size in (("TiB", 1024 ** 4), ("GiB", 1024 ** 3), ("MiB", 1024 ** 2), ("KiB", 1024)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def _rate(n: Optional[float]) -> str:
    return "n/a" if n is None else f"{_bytes(n)}/s"


def _num(v: Optional[float], fmt: str = "{:.0f}", suffix: str = "") -> str:
    return "n/a" if v is None else fmt.format(v) + suffix


def _mem_pair(used: Optional[int], total: Optional[int]) -> str:
    if used is None and total is None:
        return "n/a"
    if total is None:
        return _bytes(used)
    gib = 1024 ** 3
    used_s = "n/a" if used is None else f"{used / gib:.1f}"
    return f"{used_s}/{total / gib:.1f} GiB"


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]


def _short(text: Optional[str], width: int = 60) -> str:
    if not text:
        return "-"
    return text if len(text) <= width else text[: width - 1] + "…"


def render_status_text(snapshot: Snapshot) -> str:
    """A compact human table (plain text, no colour) of one snapshot."""
    h = snapshot.host
    lines = []
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(snapshot.time))
    title = f"{h.name}  {stamp}"
    if snapshot.simulated:
        title += "  SIMULATED (demo data, not this machine)"
    lines.append(title)
    load = " ".join(f"{x:.2f}" for x in h.load_avg)
    lines.append(f"CPU {_num(h.cpu_percent, '{:.1f}', '%')} of {h.cpu_count} cores  load {load}  "
                 f"RAM {_mem_pair(h.mem_used, h.mem_total)}  swap {_mem_pair(h.swap_used, h.swap_total)}")
    lines.append(f"disk read {_rate(h.disk_read_bps)} write {_rate(h.disk_write_bps)}  "
                 f"net rx {_rate(h.net_rx_bps)} tx {_rate(h.net_tx_bps)}")
    lines.append("")
    if snapshot.gpu_error and not snapshot.gpus:
        lines.append(f"GPUs: none ({snapshot.gpu_error})")
    else:
        rows = [["GPU", "NAME", "UTIL", "MEM", "TEMP", "POWER", "SM MHz", "THROTTLE"]]
        for g in snapshot.gpus:
            power = (f"{_num(g.power_w)}/{_num(g.power_limit_w)} W" if g.power_limit_w is not None
                     else _num(g.power_w, suffix=" W"))
            rows.append([str(g.index), g.name or "n/a", _num(g.util, suffix="%"), _mem_pair(g.mem_used, g.mem_total),
                         _num(g.temp, suffix="C"), power, _num(g.sm_clock_mhz),
                         ",".join(g.throttle_reasons) or "-"])
        lines.extend(_table(rows))
        procs = [["GPU", "PID", "GPU MEM", "SM", "USER", "COMMAND"]]
        for g in snapshot.gpus:
            for p in g.processes:
                proc = p.proc
                if proc is not None and not proc.known:
                    command = "(not visible from here: other PID namespace)"
                else:
                    command = _short(proc.cmdline if proc else None)
                procs.append([str(g.index), str(p.pid), _bytes(p.mem_used), _num(p.sm_util, suffix="%"),
                              (proc.user if proc and proc.user else "-"), command])
        if len(procs) > 1:
            lines.append("")
            lines.extend(_table(procs))
    lines.append("")
    if snapshot.ports:
        rows = [["PORT", "ADDRESS", "PID", "PROCESS"]]
        for lp in snapshot.ports:
            rows.append([str(lp.port), lp.address, str(lp.pid) if lp.pid is not None else "?",
                         lp.process or "(owner not readable)"])
        lines.extend(_table(rows))
    elif snapshot.extra.get("ports_error"):
        # Not "no ports": they may well listen, this reading just could not see them.
        lines.append(f"ports: unknown ({snapshot.extra['ports_error']})")
    else:
        lines.append("no listening TCP ports")
    return "\n".join(lines)


def render_engines_text(engines: Optional[list[dict]], error: Optional[str] = None) -> str:
    """The `engines` list of the status payload as a plain table: gpudeck's (job) and foreign ones."""
    if engines is None:
        return f"engines: unknown ({error})" if error else ""
    if not engines:
        return "engines: none (no vLLM or SGLang process on this box)"
    rows = [["ENGINE", "PID", "OWNER", "STATE", "PORT", "GPUS", "GPU MEM", "MODEL"]]
    for e in engines:
        if e.get("managed"):
            owner = f"job {e.get('job') or '?'}" + (f" (run {e['run_id']})" if e.get("run_id") else "")
        else:
            owner = "FOREIGN (not started by gpudeck)"
        state = f"listening on :{e['port']}" if e.get("port") is not None else "not listening"
        if e.get("orphan"):
            state += ", orphaned (its launcher is gone)"
        gpus = ",".join(str(g) for g in e.get("gpus") or []) or "-"
        rows.append([str(e.get("engine") or "?"), str(e.get("pid")), owner, state,
                     str(e["port"]) if e.get("port") is not None else "-", gpus,
                     _bytes(e.get("gpu_mem")), _short(e.get("model"), 50)])
    return "\n".join(_table(rows))
