"""The live sources on this machine: host rates, real listening sockets, process facts, no-GPU sampler."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from gpudeck.jobs.telemetry import gpu as gpu_seam

from gpudeck.jobs.telemetry.host import HostSampler
from gpudeck.jobs.telemetry.ports import PortScanner, read_proc_net_listeners, read_sock_diag_listeners
from gpudeck.jobs.telemetry.procs import ProcTable
from gpudeck.jobs.telemetry.sampler import LiveSampler, make_sampler
from gpudeck.jobs.telemetry.snapshot import PortListener
from runsupport import own_cmdline

HAS_PROC_NET = os.path.exists("/proc/net/tcp")




def listener(family=socket.AF_INET, host="127.0.0.1") -> socket.socket:
    s = socket.socket(family, socket.SOCK_STREAM)
    s.bind((host, 0))
    s.listen()
    return s


# -- host ------------------------------------------------------------------------------

def test_host_rates_absent_first_then_present():
    host = HostSampler()
    first = host.read()
    assert first.disk_read_bps is None and first.net_rx_bps is None
    assert first.cpu_count == os.cpu_count()
    assert 0 < first.mem_used < first.mem_total
    # cpu% needs >= 0.1 s of jiffies between readings: spend that window working, not sleeping.
    deadline = time.monotonic() + 0.2
    while time.monotonic() < deadline:
        sum(range(10000))
    second = host.read()
    for value in (second.disk_read_bps, second.disk_write_bps, second.net_rx_bps, second.net_tx_bps):
        assert value is not None and value >= 0
    assert second.cpu_percent is not None and 0 <= second.cpu_percent <= 100
    assert len(second.cpu_per_core) == os.cpu_count()


def write_diskstats(proc_root, read_bytes: int, written_bytes: int) -> None:
    """A /proc/diskstats whose one whole disk (vda) has read and written these many bytes;
    its partition vda1 and an unknown device carry other figures that must not count."""
    line = "{major} {minor} {name} 100 0 {rs} 50 200 0 {ws} 80 0 120 130 0 0 0 0 0 0\n"
    (proc_root / "diskstats").write_text(
        line.format(major=253, minor=0, name="vda", rs=read_bytes // 512, ws=written_bytes // 512)
        + line.format(major=253, minor=1, name="vda1", rs=read_bytes // 512, ws=written_bytes // 512)
        + line.format(major=7, minor=0, name="nosuchdev0", rs=10**9, ws=10**9))


def test_counters_that_go_backwards_give_no_rate_for_that_tick_never_a_negative_one(monkeypatch, tmp_path):
    # psutil's own wrap bookkeeping is off (nowrap=False): a NIC or disk that goes away, or a
    # counter that wraps, makes a sum smaller, and that tick shows no rate instead of a negative one.
    from types import SimpleNamespace

    import psutil

    proc_root, sys_block = tmp_path / "proc", tmp_path / "block"
    proc_root.mkdir()
    (sys_block / "vda").mkdir(parents=True)
    (proc_root / "meminfo").write_text("MemTotal: 1000 kB\nMemAvailable: 400 kB\nSwapTotal: 0 kB\nSwapFree: 0 kB\n")
    clock = [100.0]
    disk = [(5_120_000, 9_216_000)]                            # whole sectors
    nics = [{"lo": (10**9, 10**9), "eth0": (2_000_000, 3_000_000), "eth1": (7_000_000, 1_000_000)}]
    monkeypatch.setattr(psutil, "net_io_counters", lambda pernic=False, nowrap=True: {
        name: SimpleNamespace(bytes_recv=rx, bytes_sent=tx) for name, (rx, tx) in nics[0].items()})
    host = HostSampler(monotonic=lambda: clock[0], proc_root=str(proc_root), sys_block=str(sys_block))
    write_diskstats(proc_root, *disk[0])
    host.read()
    clock[0] += 2.0
    disk[0] = (5_529_600, 9_420_800)
    write_diskstats(proc_root, *disk[0])
    nics[0] = {"lo": (2 * 10**9, 2 * 10**9), "eth0": (2_600_000, 3_100_000), "eth1": (7_000_000, 1_000_000)}
    grown = host.read()
    # Loopback is not the box's network; rates are per second over the 2 s between reads.
    assert (grown.disk_read_bps, grown.disk_write_bps) == (204_800.0, 102_400.0)
    assert (grown.net_rx_bps, grown.net_tx_bps) == (300_000.0, 50_000.0)
    clock[0] += 2.0
    disk[0] = (512, 9_625_600)                                 # the read counter wrapped
    write_diskstats(proc_root, *disk[0])
    del nics[0]["eth1"]                                        # a NIC went away: both sums drop
    shrunk = host.read()
    assert shrunk.disk_read_bps is None and shrunk.disk_write_bps == 102_400.0
    assert shrunk.net_rx_bps is None and shrunk.net_tx_bps is None
    clock[0] += 1.0
    disk[0] = (1024, 9_728_000)
    write_diskstats(proc_root, *disk[0])
    nics[0]["eth0"] = (2_700_000, 3_200_000)
    again = host.read()                                       # the next tick measures from the new sums
    assert (again.disk_read_bps, again.disk_write_bps) == (512.0, 102_400.0)
    assert (again.net_rx_bps, again.net_tx_bps) == (100_000.0, 100_000.0)


def test_memory_and_disk_from_proc_equal_psutils_figures():
    # The host sampler reads /proc/meminfo and /proc/diskstats itself (one read each, sysfs asked
    # once per device name); psutil's figures, taken just before and just after, bound them.
    import psutil

    from gpudeck.jobs.telemetry.host import DiskstatsReader, read_meminfo

    if read_meminfo() is None or DiskstatsReader().read() is None:
        pytest.skip("no /proc/meminfo with MemAvailable or no /proc/diskstats here")
    reader = DiskstatsReader()
    for _ in range(3):                     # the second and third read answer from the cached sysfs lookups
        vm0, sw0, d0 = psutil.virtual_memory(), psutil.swap_memory(), psutil.disk_io_counters(nowrap=False)
        total, available, swap_total, swap_free = read_meminfo()
        read_bytes, written_bytes = reader.read()
        vm1, sw1, d1 = psutil.virtual_memory(), psutil.swap_memory(), psutil.disk_io_counters(nowrap=False)
        assert total == vm0.total == vm1.total and swap_total == sw0.total == sw1.total
        slack = 64 << 20                   # other processes allocate between the reads
        assert min(vm0.available, vm1.available) - slack <= available <= max(vm0.available, vm1.available) + slack
        assert min(sw0.free, sw1.free) - slack <= swap_free <= max(sw0.free, sw1.free) + slack
        assert d0.read_bytes <= read_bytes <= d1.read_bytes
        assert d0.write_bytes <= written_bytes <= d1.write_bytes


def test_diskstats_counts_whole_disks_only_and_unknown_shapes_fall_back(tmp_path):
    from gpudeck.jobs.telemetry.host import DiskstatsReader

    proc_root, sys_block = tmp_path / "proc", tmp_path / "block"
    proc_root.mkdir()
    (sys_block / "vda").mkdir(parents=True)
    (sys_block / "cciss!c0d0").mkdir()
    write_diskstats(proc_root, 1024, 2048)
    with open(proc_root / "diskstats", "a") as fh:
        fh.write("104 0 cciss/c0d0 1 0 4 1 1 0 6 1 0 1 1\n")      # a 14-field line, slash in the name
        fh.write("8 1 sda1 5 100 7 300\n")                          # the short partition form
    reader = DiskstatsReader(str(proc_root), str(sys_block))
    assert reader.read() == (1024 + 4 * 512, 2048 + 6 * 512)
    (proc_root / "diskstats").write_text("3 0 hda 8 8 8 8 8 8 8 8 8 8 8 8\n")   # 15 fields: Linux 2.4
    assert reader.read() is None
    assert DiskstatsReader(str(tmp_path / "nowhere")).read() is None


def test_meminfo_without_memavailable_leaves_it_to_psutil(tmp_path):
    from gpudeck.jobs.telemetry.host import read_meminfo

    (tmp_path / "meminfo").write_text("MemTotal: 2048 kB\nMemFree: 1024 kB\nSwapTotal: 512 kB\nSwapFree: 256 kB\n")
    assert read_meminfo(str(tmp_path)) is None
    (tmp_path / "meminfo").write_text("MemTotal: 2048 kB\nMemFree: 1024 kB\nMemAvailable: 1536 kB\n"
                                      "SwapTotal: 512 kB\nSwapFree: 256 kB\n")
    assert read_meminfo(str(tmp_path)) == (2048 * 1024, 1536 * 1024, 512 * 1024, 256 * 1024)


# -- ports -----------------------------------------------------------------------------

def test_own_listeners_v4_and_v6_are_found_with_our_pid():
    v4 = listener()
    try:
        v6 = listener(socket.AF_INET6, "::1")
    except OSError:
        v6 = None
    try:
        found = {(p.port, p.address): p for p in PortScanner().read()}
        p4 = found[(v4.getsockname()[1], "127.0.0.1")]
        assert p4.pid == os.getpid() and p4.process
        if v6 is not None:
            p6 = found[(v6.getsockname()[1], "::1")]
            assert p6.pid == os.getpid()
    finally:
        v4.close()
        if v6 is not None:
            v6.close()


@pytest.mark.skipif(not HAS_PROC_NET, reason="needs /proc/net/tcp")
def test_netlink_and_proc_net_agree():
    socks = [listener(), listener(host="0.0.0.0")]
    try:
        socks.append(listener(socket.AF_INET6, "::"))
    except OSError:
        pass
    try:
        via_netlink = read_sock_diag_listeners()
        if via_netlink is None:
            pytest.skip("sock_diag netlink not available here")
        via_proc = read_proc_net_listeners()
        # Only our sockets: other processes on this machine may open and close theirs in between.
        ours = {s.getsockname()[1] for s in socks}
        mine_netlink = sorted(r for r in via_netlink if r[0] in ours)
        assert len(mine_netlink) == len(socks)
        assert mine_netlink == sorted(r for r in via_proc if r[0] in ours)
    finally:
        for s in socks:
            s.close()


def test_closed_listener_disappears():
    scanner = PortScanner()
    s = listener()
    port = s.getsockname()[1]
    assert port in {p.port for p in scanner.read()}
    s.close()
    assert port not in {p.port for p in scanner.read()}


def test_socket_shared_by_a_forked_tree_is_owned_by_the_root():
    # The parent listens, then forks a child that inherits the socket (as uvicorn/gunicorn workers do).
    code = (
        "import os, socket, sys, time\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
        "child = os.fork()\n"
        "if child == 0:\n"
        "    time.sleep(60); os._exit(0)\n"
        "print(s.getsockname()[1], child, flush=True)\n"
        "sys.stdin.read()\n"
        "os.kill(child, 9)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        port, child = map(int, proc.stdout.readline().split())
        rows = [p for p in PortScanner().read() if p.port == port]
        assert [r.pid for r in rows] == [proc.pid], rows
        assert child != proc.pid
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


@pytest.mark.skipif(not HAS_PROC_NET, reason="needs /proc/net/tcp")
def test_listener_whose_owner_cannot_be_read_is_still_listed(tmp_path):
    # A /proc as a non-root user sees it: the socket table is readable, other users' fds are not.
    (tmp_path / "net").mkdir()
    (tmp_path / "net" / "tcp").write_text(
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
        "   0: 00000000:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 77001 1\n"
        "   1: 0100007F:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 77002 1\n"
        "   2: 0100007F:9C40 0100007F:1F40 01 00000000:00000000 00:00000000 00000000  1000        0 77003 1\n")
    (tmp_path / "net" / "tcp6").write_text(
        "  sl  local_address                         remote_address                        st tx_queue rx_queue"
        " tr tm->when retrnsmt   uid  timeout inode\n"
        "   0: 00000000000000000000000001000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000"
        " 00:00000000 00000000  1000        0 77004 1\n")
    (tmp_path / "4242").mkdir()          # a process whose fd directory is missing (unreadable)
    assert read_proc_net_listeners(str(tmp_path)) == [(8000, "0.0.0.0", 77001), (22, "127.0.0.1", 77002),
                                                      (8080, "::1", 77004)]
    ports = PortScanner(proc_root=str(tmp_path)).read()
    assert [(p.port, p.address, p.pid) for p in ports] == [(22, "127.0.0.1", None), (8000, "0.0.0.0", None),
                                                            (8080, "::1", None)]


# -- processes -------------------------------------------------------------------------

@pytest.mark.parametrize("proc_root", ["/proc", "/nonexistent-proc"], ids=["proc-stat", "psutil-fallback"])
def test_proc_info_for_ourselves_and_cpu_percent_spans_ticks(proc_root):
    table = ProcTable(proc_root=proc_root)
    first = table.info(os.getpid())
    assert first.known and first.cpu_percent is None       # one reading is not a rate
    assert first.cmdline == own_cmdline() and first.rss > 0 and first.age_s >= 0
    deadline = time.monotonic() + 0.3
    while time.monotonic() < deadline:
        sum(range(10000))
    second = table.info(os.getpid())
    assert second.cpu_percent is not None and second.cpu_percent > 10


def test_proc_stat_facts_equal_psutils_for_a_busy_child():
    # The per-tick facts come from one read of /proc/PID/stat: CPU% over the same window and
    # the resident size must be what psutil says (its cpu_percent and memory_info().rss).
    import psutil

    child = subprocess.Popen([sys.executable, "-c",
                              "import sys, time\nblock = bytearray(48 << 20)\nsys.stdout.write('r\\n'); sys.stdout.flush()\n"
                              "end = time.monotonic() + 60\nwhile time.monotonic() < end: open('/proc/self/stat').read()"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "r\n"
        table, theirs = ProcTable(), psutil.Process(child.pid)
        table.info(child.pid)
        theirs.cpu_percent(None)
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            sum(range(10000))
        mine = table.info(child.pid)
        their_cpu, their_rss = theirs.cpu_percent(None), theirs.memory_info().rss
        # > 5: the child is busy (a loaded 2-core CI box gave it 17 %); the comparison below is the test.
        assert mine.known and mine.cpu_percent is not None and their_cpu > 5
        # A busy loop, in user and system time: both near one core; jiffies and the few µs between
        # the calls differ.
        assert abs(mine.cpu_percent - their_cpu) <= 15
        assert mine.rss >= 48 << 20 and abs(mine.rss - their_rss) <= 1 << 20
    finally:
        child.kill()
        child.wait(timeout=30)
    assert table.info(child.pid).known is False


def test_absent_pid_is_unknown_not_guessed():
    info = ProcTable().info(4_000_000)
    assert info.known is False and info.cmdline is None and info.name is None


def test_pid_reuse_is_a_new_process():
    table = ProcTable()
    a = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        # Right after fork the child may still show the parent's command line: facts of a young
        # process are re-read, so polling the same table must reach the exec'd one.
        deadline = time.monotonic() + 30
        while "sys.stdin.read" not in (table.info(a.pid).cmdline or "") and time.monotonic() < deadline:
            time.sleep(0.01)
        assert "sys.stdin.read" in table.info(a.pid).cmdline
    finally:
        a.stdin.close()
        a.wait(timeout=30)
    assert table.info(a.pid).known is False


def test_gpu_pid_in_a_container_namespace_needs_proof():
    # Outside the host PID namespace a local PID is only trusted if it holds /dev/nvidia* open.
    table = ProcTable(host_namespace=False)
    assert table.gpu_info(os.getpid()).known is False
    assert ProcTable(host_namespace=True).gpu_info(os.getpid()).known is True


# -- the whole live sampler ------------------------------------------------------------

@pytest.mark.skipif(gpu_seam.local().available(), reason="this machine has a working NVIDIA driver")
def test_no_gpu_machine_says_why():
    sampler = make_sampler()
    try:
        snap = sampler.sample()
    finally:
        sampler.close()
    assert snap.gpus == () and snap.simulated is False
    assert snap.gpu_error and "\n" not in snap.gpu_error
    assert "NVIDIA" in snap.gpu_error or "GPU" in snap.gpu_error
    assert snap.host.cpu_count == os.cpu_count()


class ExplodingGpu:
    def read(self):
        raise RuntimeError("driver fell over")

    def close(self):
        raise RuntimeError("and again")


def test_a_failing_source_degrades_instead_of_raising():
    sampler = LiveSampler(gpu_source=ExplodingGpu())
    snap = sampler.sample()
    sampler.close()
    assert snap.gpus == () and "driver fell over" in snap.gpu_error
    assert snap.host.mem_total > 0


def test_listening_ports_are_relisted_every_interval_and_a_failure_is_retried_at_once():
    class CountingScanner:
        def __init__(self):
            self.calls, self.fail = 0, False

        def read(self):
            self.calls += 1
            if self.fail:
                raise OSError("netlink refused")
            return (PortListener(port=8000 + self.calls, address="0.0.0.0", pid=None, process=None),)

    clock = [50.0]
    sampler = LiveSampler(gpu_source=ExplodingGpu(), monotonic=lambda: clock[0], ports_interval_s=2.0)
    sampler._ports = scanner = CountingScanner()
    try:
        assert [p.port for p in sampler.sample().ports] == [8001]
        clock[0] += 1.9
        assert [p.port for p in sampler.sample().ports] == [8001] and scanner.calls == 1   # the last list
        clock[0] += 0.1
        assert [p.port for p in sampler.sample().ports] == [8002]
        scanner.fail = True
        clock[0] += 2.0
        failed = sampler.sample()
        assert failed.ports == () and "netlink refused" in failed.extra["ports_error"]
        scanner.fail = False
        clock[0] += 0.1                                      # a failed listing is not kept: asked again
        assert [p.port for p in sampler.sample().ports] == [8004]
    finally:
        sampler.close()


def test_sample_is_safe_from_several_threads():
    s = listener()
    sampler = make_sampler()
    results, errors = [], []

    def worker():
        try:
            for _ in range(3):
                results.append(sampler.sample())
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    sampler.close()
    s.close()
    assert not errors and len(results) == 12
    assert all(any(p.pid == os.getpid() for p in r.ports) for r in results)
