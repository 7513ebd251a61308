"""The nvidia-smi GPU backend: what a box without nvidia-ml-py still has (the remote agent's path). Stdlib only."""
from __future__ import annotations

import shutil
import subprocess
from typing import Iterable, Optional

from gpudeck.jobs.strictjson import parse_number
from gpudeck.jobs.telemetry.gpu import DriverInfo, GpuFigures, GpuHolder, GpuMemory, GpuUnavailable
from gpudeck.jobs.telemetry.snapshot import GpuSample

# nvidia-smi is a process per call; a hung driver must not hang the caller.
SMI_TIMEOUT_S = 5.0
SMI_FIELDS = ("index", "name", "uuid", "utilization.gpu", "utilization.memory", "memory.used",
              "memory.total", "temperature.gpu", "power.draw", "power.limit", "clocks.sm", "clocks.mem",
              "fan.speed")
APP_FIELDS = ("gpu_uuid", "pid", "used_memory")
_MIB = 1 << 20


# A cell of nvidia-smi's CSV as a finite number; None for "[N/A]", "[Not Supported]" and the like.
smi_number = parse_number


def _mib(value: Optional[float]) -> Optional[int]:
    return int(value * _MIB) if value is not None else None


class SmiGpuSource:
    """GPUs from `nvidia-smi --query-gpu=... --format=csv`; nothing but `driver()` raises."""

    kind = "nvidia-smi"
    label = "nvidia-smi"
    visible_devices_var = "CUDA_VISIBLE_DEVICES"

    def __init__(self, binary: Optional[str] = None) -> None:
        self.binary = binary or shutil.which("nvidia-smi")
        self._error: Optional[str] = None

    def _query(self, *args: str) -> tuple[list[list[str]], Optional[str]]:
        """The CSV rows of one nvidia-smi call, or ([], one-line reason)."""
        if self.binary is None:
            return [], "no NVIDIA driver: nvidia-smi not found on this box"
        try:
            out = subprocess.run([self.binary, *args, "--format=csv,noheader,nounits"], capture_output=True,
                                 text=True, timeout=SMI_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return [], f"nvidia-smi failed: {exc}"
        if out.returncode != 0:
            return [], f"nvidia-smi failed: {(out.stderr or out.stdout).strip().splitlines()[-1:] or out.returncode}"
        return [[c.strip() for c in line.split(",")] for line in out.stdout.strip().splitlines()], None

    @property
    def error(self) -> Optional[str]:
        return self._error

    def open(self) -> None:
        pass

    def close(self) -> None:
        pass

    def available(self) -> bool:
        gpus, error = self.read()
        return error is None

    def read(self) -> tuple[tuple[GpuSample, ...], Optional[str]]:
        rows, error = self._query(f"--query-gpu={','.join(SMI_FIELDS)}")
        if error is not None:
            self._error = error
            return (), error
        gpus = []
        for cells in rows:
            if len(cells) != len(SMI_FIELDS):
                continue
            num = [smi_number(c) for c in cells]
            if num[0] is None:
                continue
            gpus.append(GpuSample(
                index=int(num[0]), name=cells[1], uuid=cells[2], util=num[3], mem_util=num[4],
                mem_used=_mib(num[5]), mem_total=_mib(num[6]), temp=num[7], power_w=num[8],
                power_limit_w=num[9], sm_clock_mhz=int(num[10]) if num[10] is not None else None,
                mem_clock_mhz=int(num[11]) if num[11] is not None else None, fan_pct=num[12]))
        self._error = None if gpus else "nvidia-smi reported no GPU"
        return tuple(gpus), self._error

    def holders(self) -> Optional[list[GpuHolder]]:
        gpus, error = self.read()
        if error is not None:
            return None
        index_of = {g.uuid: g.index for g in gpus}
        rows, error = self._query(f"--query-compute-apps={','.join(APP_FIELDS)}")
        if error is not None:
            self._error = error
            return None
        found: list[GpuHolder] = []
        for cells in rows:
            if len(cells) != len(APP_FIELDS) or cells[0] not in index_of or not cells[1].isdigit():
                continue
            found.append(GpuHolder(gpu=index_of[cells[0]], pid=int(cells[1]), mem_used=_mib(smi_number(cells[2]))))
        return found

    def memory(self) -> Optional[GpuMemory]:
        holders = self.holders()
        if holders is None:
            return None
        gpus, _ = self.read()
        return GpuMemory(holders=tuple(holders), used={g.index: g.mem_used for g in gpus if g.mem_used is not None})

    def figures(self, indices: Iterable[int]) -> dict[int, GpuFigures]:
        wanted = set(indices)
        gpus, _ = self.read() if wanted else ((), None)
        return {g.index: GpuFigures(util=g.util, mem_used=g.mem_used, power_w=g.power_w, power_limit_w=g.power_limit_w)
                for g in gpus if g.index in wanted}

    def driver(self) -> DriverInfo:
        rows, error = self._query("--query-gpu=driver_version,name")
        if error is not None:
            raise GpuUnavailable(error)
        if not rows:
            raise GpuUnavailable("nvidia-smi reported no GPU")
        return DriverInfo(version=rows[0][0], names=tuple(",".join(r[1:]) for r in rows))
