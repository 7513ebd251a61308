"""The Sampler: one call gathers GPU, host and port telemetry into a Snapshot, never raising."""
from __future__ import annotations

import dataclasses
import socket
import threading
import time
from typing import Any, Callable, Optional

from gpudeck.jobs.telemetry.snapshot import GpuSample, HostSample, PortListener, ProcInfo, Snapshot

Clock = Callable[[], float]


class Sampler:
    """Base sampler. `sample()` is safe from a worker thread (calls are serialised) and never
    raises because a source failed; `close()` releases NVML and background threads."""

    simulated = False

    def __init__(self, clock: Optional[Clock] = None) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._closed = False

    def _now(self) -> float:
        return self._clock() if self._clock is not None else time.time()

    def sample(self) -> Snapshot:
        with self._lock:
            return self._sample()

    def _sample(self) -> Snapshot:  # pragma: no cover - abstract
        raise NotImplementedError

    def prime_rates(self) -> None:
        """Take the first of the two readings rates need, and nothing else (no GPUs, no ports)."""

    def open_sources(self) -> None:
        """Open what the first sample needs (NVML) ahead of it, e.g. from a thread during a rate window."""

    def close(self) -> None:
        self._closed = True

    def __enter__(self) -> "Sampler":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# Listening sockets are re-listed at most this often (seconds); the last list is shown between.
# A LISTEN-only sock_diag dump walks the kernel's whole listening hash for each address family:
# 0.37 ms of CPU a tick on a 128 GiB H200 VM, ~12 % of a 1 s console tick's sampling, for a
# table that changes when a server starts or stops.
PORTS_INTERVAL_S = 2.0


class LiveSampler(Sampler):
    """This machine: NVML GPUs, psutil host, /proc listening sockets."""

    def __init__(self, clock: Optional[Clock] = None, *, gpu_source: Any = None, pcie: bool = True,
                 monotonic: Clock = time.monotonic, ports_interval_s: float = PORTS_INTERVAL_S) -> None:
        super().__init__(clock)
        self._monotonic = monotonic
        self._ports_interval_s = ports_interval_s
        self._ports_listed_at: Optional[float] = None
        self._ports_last: tuple[PortListener, ...] = ()
        # Imported here so `--demo` never touches a GPU driver or walks /proc.
        from gpudeck.jobs.telemetry.gpu import make_backend
        from gpudeck.jobs.telemetry.host import HostSampler
        from gpudeck.jobs.telemetry.ports import PortScanner
        from gpudeck.jobs.telemetry.procs import ProcTable

        self._gpu = gpu_source if gpu_source is not None else make_backend(pcie=pcie)
        self._host: Optional[HostSampler] = None
        self._host_error: Optional[str] = None
        try:
            self._host = HostSampler()
        except Exception as exc:  # noqa: BLE001 - a broken psutil still leaves GPUs worth showing
            self._host_error = str(exc)
        self._ports = PortScanner()
        self._procs = ProcTable()
        self._hostname = socket.gethostname()

    def _sample(self) -> Snapshot:
        now = self._now()
        extra: dict[str, Any] = {}
        host = self._read_host(extra)
        try:
            gpus, gpu_error = self._gpu.read()
        except Exception as exc:  # noqa: BLE001
            gpus, gpu_error = (), f"GPU read failed: {exc}"
        ports = self._read_ports(extra)
        gpus, ports = self._attach_procs(gpus, ports, extra)
        return Snapshot(time=now, host=host, gpus=gpus, gpu_error=gpu_error, ports=ports,
                        simulated=False, extra=extra)

    def _read_ports(self, extra: dict[str, Any]) -> tuple[PortListener, ...]:
        now = self._monotonic()
        if self._ports_listed_at is not None and now - self._ports_listed_at < self._ports_interval_s:
            return self._ports_last
        try:
            ports = self._ports.read()
        except Exception as exc:  # noqa: BLE001
            extra["ports_error"] = str(exc)
            return ()                             # not kept: the next tick tries again
        self._ports_listed_at, self._ports_last = now, ports
        return ports

    def open_sources(self) -> None:
        opener = getattr(self._gpu, "open", None)
        if opener is not None:
            opener()

    def prime_rates(self) -> None:
        with self._lock:
            if self._host is not None:
                try:
                    self._host.read()
                except Exception:  # noqa: BLE001 - the real sample reports it
                    pass

    def _read_host(self, extra: dict[str, Any]) -> HostSample:
        if self._host is not None:
            try:
                return self._host.read()
            except Exception as exc:  # noqa: BLE001
                extra["host_error"] = str(exc)
                return HostSample(name=self._hostname)
        extra["host_error"] = self._host_error
        return HostSample(name=self._hostname)

    def _attach_procs(self, gpus: tuple[GpuSample, ...], ports: tuple[PortListener, ...], extra: dict[str, Any]
                      ) -> tuple[tuple[GpuSample, ...], tuple[PortListener, ...]]:
        try:
            cache: dict[int, ProcInfo] = {}
            gpu_infos: dict[int, ProcInfo] = {}
            new_gpus = []
            for g in gpus:
                if g.processes:
                    procs = []
                    for p in g.processes:
                        info = gpu_infos.get(p.pid)
                        if info is None:
                            info = gpu_infos[p.pid] = self._procs.gpu_info(p.pid)
                            if info.known:
                                cache[p.pid] = info
                        procs.append(dataclasses.replace(p, proc=info))
                    g = dataclasses.replace(g, processes=tuple(procs))
                new_gpus.append(g)
            new_ports = []
            for lp in ports:
                if lp.pid is not None:
                    info = cache.get(lp.pid)
                    if info is None:
                        info = cache[lp.pid] = self._procs.info(lp.pid)
                    lp = dataclasses.replace(lp, proc=info)
                new_ports.append(lp)
            self._procs.prune(set(gpu_infos) | set(cache))
            return tuple(new_gpus), tuple(new_ports)
        except Exception as exc:  # noqa: BLE001 - process details are a bonus, the figures are not
            extra["procs_error"] = str(exc)
            return gpus, ports

    def close(self) -> None:
        if not self._closed:
            try:
                self._gpu.close()
            except Exception:  # noqa: BLE001
                pass
        super().close()


class SimulatedSampler(Sampler):
    """The SIMULATED box: each sample() advances one step; values depend only on (seed, step)."""

    simulated = True

    def __init__(self, seed: int = 0, clock: Optional[Clock] = None, start_step: int = 0) -> None:
        super().__init__(clock)
        from gpudeck.jobs.telemetry.simulated import SimulatedBox

        self.box = SimulatedBox(seed)
        self.step = start_step

    def _sample(self) -> Snapshot:
        snap = self.box.snapshot(self.step, self._now())
        self.step += 1
        return snap


def make_sampler(demo: bool = False, seed: int = 0, clock: Optional[Clock] = None, *, pcie: bool = True) -> Sampler:
    """The sampler for this machine (NVML + psutil + /proc), or the SIMULATED box when `demo`.

    `clock` supplies Snapshot.time (default time.time); `seed` only matters for the demo; `pcie=False`
    starts no PCIe throughput thread (a one-shot reader would only wait for it at close).
    """
    if demo:
        return SimulatedSampler(seed=seed, clock=clock)
    return LiveSampler(clock=clock, pcie=pcie)
