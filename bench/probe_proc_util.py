"""Probe (device only, not kept): cold per-call CPU of NVML process util variants and of /proc readers."""
import ctypes, os, socket, statistics as st, sys, time
sys.path[:0] = ["/tmp/gd"]
import psutil
import pynvml as N
from gpudeck.jobs.telemetry import ports

N.nvmlInit()
h = N.nvmlDeviceGetHandleByIndex(0)
fn = N._nvmlGetFunctionPointer("nvmlDeviceGetProcessUtilization")
spent = {}
info = {}
last = 0
buf = (N.c_nvmlProcessUtilizationSample_t * 256)()

def rec(name, dt, note=None):
    spent.setdefault(name, []).append(dt * 1e3)
    if note is not None:
        info.setdefault(name, []).append(note)

def timed(name, f):
    t0 = time.thread_time()
    try:
        r = f()
    except Exception as e:
        r = e
    rec(name, time.thread_time() - t0)
    return r

def raw(path):
    with open(path, "rb") as fh:
        return fh.read()

for i in range(30):
    # NVML: the size call and the fill, with timestamp 0 and the last seen
    for mode in ("ts0", "tslast"):
        ts = 0 if mode == "ts0" else last
        c = ctypes.c_uint(0)
        t0 = time.thread_time(); ret = fn(h, None, ctypes.byref(c), ctypes.c_ulonglong(ts)); t1 = time.thread_time()
        rec(f"nvml {mode} size-call", t1 - t0, (ret, c.value))
        n = max(c.value, 1)
        arr = (N.c_nvmlProcessUtilizationSample_t * n)()
        t0 = time.thread_time(); ret = fn(h, arr, ctypes.byref(c), ctypes.c_ulonglong(ts)); t1 = time.thread_time()
        rec(f"nvml {mode} fill-call", t1 - t0, (ret, c.value))
        t0 = time.thread_time()
        for s in arr[0:c.value]:
            if s.timeStamp > last:
                last = s.timeStamp
        rec(f"nvml {mode} python slice+loop", time.thread_time() - t0)
    c = ctypes.c_uint(256)
    t0 = time.thread_time(); ret = fn(h, buf, ctypes.byref(c), ctypes.c_ulonglong(last)); t1 = time.thread_time()
    rec("nvml tslast one call, 256 buffer", t1 - t0, (ret, c.value))
    timed("pynvml GetProcessUtilization(last)", lambda: N.nvmlDeviceGetProcessUtilization(h, last))
    timed("pynvml GetProcessesUtilizationInfo(last)", lambda: N.nvmlDeviceGetProcessesUtilizationInfo(h, last))
    timed("pynvml GetComputeRunningProcesses", lambda: N.nvmlDeviceGetComputeRunningProcesses(h))
    # /proc readers
    for path in ("/proc/stat", "/proc/meminfo", "/proc/vmstat", "/proc/diskstats", "/proc/net/dev"):
        timed(f"read {path}", lambda: raw(path))
    timed("psutil.cpu_times(percpu)", lambda: psutil.cpu_times(percpu=True))
    timed("psutil.virtual_memory", psutil.virtual_memory)
    timed("psutil.swap_memory", psutil.swap_memory)
    timed("psutil.disk_io_counters", lambda: psutil.disk_io_counters(nowrap=False))
    timed("psutil.net_io_counters", lambda: psutil.net_io_counters(pernic=True, nowrap=False))
    timed("sock_diag, new socket", ports.read_sock_diag_listeners)
    timed("netlink socket()+close", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, 4).close())
    timed("os.access /sys/block/vda", lambda: os.access("/sys/block/vda", os.F_OK))
    timed("os.getloadavg", os.getloadavg)
    time.sleep(0.3)

for name, v in spent.items():
    notes = info.get(name)
    extra = f"  (ret,count) first {notes[0]} last {notes[-1]}" if notes else ""
    print(f"{name:45s} median {st.median(v):.3f} ms  min {min(v):.3f}  max {max(v):.3f}{extra}")
print("stat bytes", len(raw("/proc/stat")), "diskstats lines", raw("/proc/diskstats").count(b"\n"))
