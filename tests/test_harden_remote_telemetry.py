"""Issue harden 14, the hosts view: a box without psutil reports disk and network rates, read from /proc (stdlib only).

Before, the agent's /proc sampler sent CPU, RAM and load only: every real box whose
python3 has no psutil showed `disk read n/a write n/a  net rx n/a tx n/a` in its tab.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from gpudeck.jobs.hosts.agent import HELLO
from gpudeck.jobs.hosts.bundle import agent_zipapp
from gpudeck.jobs.hosts.protocol import encode, unpack_status
from gpudeck.jobs.hosts.telemetry import ProcHostSampler

_NET_HEAD = ("Inter-|   Receive                                                |  Transmit\n"
             " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls "
             "carrier compressed\n")


def _fake_proc(root: Path, disk_sectors: tuple[int, int], eth_bytes: tuple[int, int], lo_bytes: int) -> None:
    (root / "net").mkdir(parents=True, exist_ok=True)
    (root / "stat").write_text("cpu  100 0 100 800 0 0 0 0 0 0\ncpu0 100 0 100 800 0 0 0 0 0 0\nintr 1\n")
    (root / "meminfo").write_text("MemTotal: 1000 kB\nMemFree: 100 kB\nMemAvailable: 400 kB\n"
                                  "SwapTotal: 0 kB\nSwapFree: 0 kB\n")
    (root / "loadavg").write_text("0.50 0.40 0.30 1/100 4242\n")
    r, w = disk_sectors
    (root / "diskstats").write_text(
        f" 252       0 vda 10 0 {r} 5 20 0 {w} 9 0 30 40 0 0 0 0 0 0\n"
        f" 252       1 vda1 10 0 {r} 5 20 0 {w} 9 0 30 40 0 0 0 0 0 0\n"     # a partition: counted in vda
        "   8       0 sdz 1 2 3 4\n")                                         # an old short line: skipped
    rx, tx = eth_bytes
    (root / "net" / "dev").write_text(
        _NET_HEAD
        + f"    lo: {lo_bytes} 10 0 0 0 0 0 0 {lo_bytes} 10 0 0 0 0 0 0\n"
        + f"  eth0: {rx} 10 0 0 0 0 0 0 {tx} 10 0 0 0 0 0 0\n")


def test_proc_sampler_reports_disk_and_network_rates(tmp_path):
    proc, block = tmp_path / "proc", tmp_path / "block"
    (block / "vda").mkdir(parents=True)               # a whole disk; vda1 has no /sys/block entry
    clock = iter([100.0, 102.0])
    sampler = ProcHostSampler(proc_root=str(proc), sys_block=str(block), monotonic=lambda: next(clock))
    _fake_proc(proc, (1000, 2000), (10_000, 20_000), 5_000)
    first = sampler.read()
    assert first.disk_read_bps is None and first.net_rx_bps is None      # a rate needs two reads
    # 2 s later: 4096 sectors read, 2048 written; eth0 +2 MB in, +1 MB out; loopback traffic ignored.
    _fake_proc(proc, (1000 + 4096, 2000 + 2048), (10_000 + 2_000_000, 20_000 + 1_000_000), 9_000_000)
    second = sampler.read()
    assert second.disk_read_bps == 4096 * 512 / 2 and second.disk_write_bps == 2048 * 512 / 2
    assert second.net_rx_bps == 1_000_000 and second.net_tx_bps == 500_000
    assert second.mem_total == 1000 * 1024 and second.load_avg == (0.5, 0.4, 0.3)


def test_proc_sampler_without_the_files_has_no_rates_and_no_error(tmp_path):
    proc = tmp_path / "proc"
    _fake_proc(proc, (1, 1), (1, 1), 1)
    (proc / "diskstats").unlink()
    (proc / "net" / "dev").write_text("garbage\n")
    clock = iter([1.0, 2.0])
    sampler = ProcHostSampler(proc_root=str(proc), sys_block=str(tmp_path), monotonic=lambda: next(clock))
    sampler.read()
    again = sampler.read()
    assert again.disk_read_bps is None and again.net_rx_bps == 0


def test_a_box_without_psutil_shows_disk_and_network_in_its_hosts_tab(tmp_path):
    from gpudeck.console.screens.hosts import detail_text
    from gpudeck.jobs.hosts.fleet import HostView
    name, data = agent_zipapp()
    zipapp = tmp_path / name
    zipapp.write_bytes(data)
    # -I -S: no site-packages: psutil and nvidia-ml-py cannot be imported, as on a bare box.
    proc = subprocess.Popen([sys.executable, "-I", "-S", str(zipapp), "--state-dir", str(tmp_path / "st")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert json.loads(proc.stdout.readline())["hello"] == HELLO
        status = None
        for rid in (1, 2):
            proc.stdin.write(encode({"id": rid, "op": "status", "params": {}}))
            proc.stdin.flush()
            status = unpack_status(json.loads(proc.stdout.readline())["result"]["full"])
            time.sleep(0.3)
        assert status["source"]["host"] == "/proc"
        host = status["host"]
        for key in ("disk_read_bps", "disk_write_bps", "net_rx_bps", "net_tx_bps"):
            assert isinstance(host[key], (int, float)) and host[key] >= 0, (key, host)
        view = HostView(name="box", ssh="box", state="LIVE", data_age_s=0.1, status=status)
        shown = str(detail_text(view.summary(), status, None, {}))
        line = next(ln for ln in shown.splitlines() if ln.startswith("disk read"))
        assert "n/a" not in line, line
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
