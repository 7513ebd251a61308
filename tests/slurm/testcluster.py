"""A real single-node Slurm cluster for the tests: installs slurm-wlm/munge/MariaDB if missing, writes its config, starts and stops it.

Everything lives under one directory (default /tmp/gpudeck-slurm-test): its own munged
socket, MariaDB datadir, slurm.conf and daemons on ports of their own, so the system's
/etc/slurm and /etc/munge are never touched. Clients find it through SLURM_CONF.

    python tests/slurm/testcluster.py up      # install what is missing, start, wait until the node is idle
    python tests/slurm/testcluster.py down    # stop every daemon it started
    python tests/slurm/testcluster.py env     # print `export SLURM_CONF=...`

Why each setting (a container with 2 cores, cgroup v1, no systemd):
- ProctrackType=proctrack/linuxproc: no process-tracking cgroups (freezer) of our own to manage.
- TaskPlugin=task/cgroup with ConstrainRAMSpace (cgroup/v1): the job's --mem becomes a memory cgroup
  limit, the kernel OOM-kills inside it and Slurm ends the job OUT_OF_MEMORY. Where no writable cgroup v1
  memory hierarchy exists, task/none + JobAcctGatherParams=OverMemoryKill (RSS polled each second) kill
  the job instead, which Slurm records as FAILED (`Cluster.oom_state` says which).
- JobAcctGatherType=jobacct_gather/linux every second: sstat/sacct CPU and RSS.
- slurmdbd on a private MariaDB: sacct (final states, exit codes, MaxRSS) needs real accounting.
- KillWait=2, OverTimeLimit=0: a job past its 1-minute limit is TIMEOUT within seconds of the minute.
- SchedulerParameters=batch_sched_delay=0: a batch job (and a dependent one, once its dependency ends) is
  scheduled at once, not up to 3 s later (Slurm's default, for clusters taking thousands of submissions).
- GPUs are GRES on character devices made with mknod (copies of /dev/null): Slurm hands them out and sets
  CUDA_VISIBLE_DEVICES exactly as on a GPU node (where mknod is not allowed: GRES by count only,
  `Cluster.gpu_files` is False).
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

BASE = Path(os.environ.get("GPUDECK_SLURM_TEST_DIR", "/tmp/gpudeck-slurm-test"))
PACKAGES = {"slurmctld": "slurmctld", "slurmd": "slurmd", "slurmdbd": "slurmdbd", "sbatch": "slurm-client",
            "munged": "munge", "mariadbd": "mariadb-server"}
SBIN = ("/usr/sbin", "/usr/bin", "/sbin", "/bin")
# Ports of our own: a system Slurm or MariaDB on the defaults is left alone.
CTLD_PORT, SLURMD_PORT, DBD_PORT, DB_PORT = 16817, 16818, 16819, 16820
GPUS = 4
CPUS = 8            # more than this VM has: slurmd accepts it with SlurmdParameters=config_overrides
REAL_MEMORY_MB = 4000


class ClusterUnavailable(Exception):
    """The packages cannot be installed here: tests skip with this reason."""


def _which(name: str) -> Optional[str]:
    found = shutil.which(name)
    if found:
        return found
    for d in SBIN:
        if os.access(os.path.join(d, name), os.X_OK):
            return os.path.join(d, name)
    return None


def ensure_packages(log=sys.stderr) -> None:
    """apt-get install whatever of Slurm, munge and MariaDB is missing; ClusterUnavailable if that is impossible."""
    missing = sorted({pkg for binary, pkg in PACKAGES.items() if _which(binary) is None})
    if not missing:
        return
    if os.geteuid() != 0:
        raise ClusterUnavailable(f"packages {' '.join(missing)} missing and not root to apt-get install them")
    if _which("apt-get") is None:
        raise ClusterUnavailable(f"packages {' '.join(missing)} missing and no apt-get on this machine")
    print(f"[slurm-test] apt-get install {' '.join(missing)}", file=log)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, timeout=600)
    done = subprocess.run(["apt-get", "install", "-y", "-q", "-o", "DPkg::Lock::Timeout=600",
                           "--no-install-recommends", *missing], env=env, capture_output=True, timeout=1200)
    still = sorted({pkg for binary, pkg in PACKAGES.items() if _which(binary) is None})
    if done.returncode != 0 or still:
        tail = (done.stderr or done.stdout).decode(errors="replace").strip().splitlines()[-1:] or ["?"]
        raise ClusterUnavailable(f"apt-get install {' '.join(missing)} failed: {tail[0]}")


@dataclass(frozen=True)
class Cluster:
    base: Path
    node: str
    partition: str = "gpu"
    gpu_files: bool = True           # GPUs are device files (Slurm sets CUDA_VISIBLE_DEVICES)
    oom_state: str = "OUT_OF_MEMORY"  # how Slurm records a job killed for its --mem here

    @property
    def conf(self) -> Path:
        return self.base / "etc" / "slurm.conf"

    def env(self, env: Optional[dict] = None) -> dict:
        out = dict(os.environ if env is None else env)
        out["SLURM_CONF"] = str(self.conf)
        return out

    def log(self, name: str) -> str:
        try:
            return (self.base / "log" / f"{name}.log").read_text(errors="replace")[-4000:]
        except OSError:
            return ""


def _node_name() -> str:
    return socket.gethostname().split(".")[0]


def write_config(base: Path = BASE) -> Cluster:
    node = _node_name()
    for sub in ("etc", "log", "state", "spool", "munge", "mysql", "dev", "run"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    os.chmod(base / "munge", 0o700)
    key = base / "munge" / "munge.key"
    if not key.exists():
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o600)
    devs = []
    try:
        for i in range(GPUS):
            dev = base / "dev" / f"gpu{i}"
            if not dev.exists():
                os.mknod(dev, 0o666 | 0o020000, os.makedev(1, 3))    # a character device, like /dev/nvidiaN
            devs.append(dev)
    except PermissionError:          # no CAP_MKNOD: GPUs as a GRES count
        devs = []
    cgroup = _cgroup_v1_memory()
    munge_socket = base / "munge" / "munge.socket"
    (base / "etc" / "slurm.conf").write_text(f"""# generated by tests/slurm/testcluster.py
ClusterName=gpudeck
SlurmctldHost={node}(127.0.0.1)
SlurmUser=root
SlurmctldPort={CTLD_PORT}
SlurmdPort={SLURMD_PORT}
AuthType=auth/munge
AuthInfo=socket={munge_socket}
CredType=cred/munge
StateSaveLocation={base}/state
SlurmdSpoolDir={base}/spool
SlurmctldPidFile={base}/run/slurmctld.pid
SlurmdPidFile={base}/run/slurmd.pid
SlurmctldLogFile={base}/log/slurmctld.log
SlurmdLogFile={base}/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin={"task/cgroup" if cgroup else "task/none"}
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=task=1
{"" if cgroup else "JobAcctGatherParams=OverMemoryKill"}
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort={DBD_PORT}
AccountingStoragePass={munge_socket}
AccountingStorageTRES=gres/gpu
GresTypes=gpu
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0
MpiDefault=none
MailProg=/bin/true
SwitchType=switch/none
MinJobAge=300
KillWait=2
OverTimeLimit=0
MessageTimeout=10
ReturnToService=2
SlurmdParameters=config_overrides
NodeName={node} NodeAddr=127.0.0.1 CPUs={CPUS} RealMemory={REAL_MEMORY_MB} Gres=gpu:{GPUS} State=UNKNOWN
PartitionName=gpu Nodes={node} Default=YES DefMemPerCPU=256 MaxTime=INFINITE State=UP
""")
    (base / "etc" / "gres.conf").write_text(
        "".join(f"NodeName={node} Name=gpu File={dev}\n" for dev in devs) if devs
        else f"NodeName={node} Name=gpu Count={GPUS}\n")
    (base / "etc" / "cgroup.conf").write_text(
        "CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\nConstrainRAMSpace=yes\n"
        "ConstrainSwapSpace=yes\nConstrainCores=no\nConstrainDevices=no\n")
    dbd = base / "etc" / "slurmdbd.conf"
    dbd.write_text(f"""# generated by tests/slurm/testcluster.py
AuthType=auth/munge
AuthInfo=socket={munge_socket}
DbdHost=localhost
DbdPort={DBD_PORT}
SlurmUser=root
PidFile={base}/run/slurmdbd.pid
LogFile={base}/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={DB_PORT}
StorageUser=root
StorageLoc=slurm_acct_db
""")
    os.chmod(dbd, 0o600)          # slurmdbd refuses a config others can read (it may hold a password)
    return Cluster(base=base, node=node, gpu_files=bool(devs), oom_state="OUT_OF_MEMORY" if cgroup else "FAILED")


def _cgroup_v1_memory() -> bool:
    """A cgroup v1 memory hierarchy we may create groups in (task/cgroup's memory limits need it)."""
    probe = Path("/sys/fs/cgroup/memory") / f"gpudeck-probe-{os.getpid()}"
    try:
        probe.mkdir()
        probe.rmdir()
        return True
    except OSError:
        return False


def _pid_alive(pidfile: Path) -> Optional[int]:
    try:
        pid = int(pidfile.read_text().split()[0])
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError, IndexError):
        return None


def _wait(predicate, timeout: float, what: str, cluster: Optional[Cluster] = None, logname: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            tail = cluster.log(logname) if cluster and logname else ""
            raise RuntimeError(f"test cluster: timed out after {timeout:.0f}s waiting for {what}\n{tail}")
        time.sleep(0.2)


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _spawn(argv: list[str], cluster: Cluster, logname: str) -> None:
    with open(cluster.base / "log" / f"{logname}.out", "ab") as out:
        subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=cluster.env(),
                         start_new_session=True, close_fds=True)


def running(base: Path = BASE) -> bool:
    """Every daemon of this directory's cluster is up (a test session may reuse it)."""
    return (_pid_alive(base / "run" / "munged.pid") is not None
            and all(_port_open(p) for p in (DB_PORT, DBD_PORT, CTLD_PORT, SLURMD_PORT)))


def start(base: Path = BASE, log=sys.stderr) -> Cluster:
    """Start (or find running) munged, MariaDB, slurmdbd, slurmctld and slurmd; returns when the node is idle."""
    if os.geteuid() != 0:
        raise ClusterUnavailable("slurmd and munged of the test cluster must run as root")
    ensure_packages(log)
    cluster = write_config(base)
    run = base / "run"
    munge_socket = base / "munge" / "munge.socket"
    if _pid_alive(run / "munged.pid") is None:
        subprocess.run([_which("munged"), "--force", f"--key-file={base}/munge/munge.key",
                        f"--socket={munge_socket}", f"--pid-file={run}/munged.pid",
                        f"--log-file={base}/log/munged.log", f"--seed-file={base}/munge/munged.seed"],
                       check=True, capture_output=True, timeout=30)
    _wait(munge_socket.exists, 15, "munged's socket", cluster, "munged")
    datadir = base / "mysql"
    if not (datadir / "mysql").is_dir():
        subprocess.run([_which("mariadb-install-db"), "--user=root", f"--datadir={datadir}",
                        "--auth-root-authentication-method=normal", "--skip-test-db"],
                       check=True, capture_output=True, timeout=300)
    if not _port_open(DB_PORT):
        # skip-grant-tables: a throwaway database on 127.0.0.1 only, root without a password.
        _spawn([_which("mariadbd"), "--no-defaults", "--user=root", f"--datadir={datadir}",
                f"--socket={run}/mysqld.sock", f"--pid-file={run}/mysqld.pid", "--bind-address=127.0.0.1",
                f"--port={DB_PORT}", "--skip-grant-tables", "--innodb-buffer-pool-size=32M",
                f"--log-error={base}/log/mariadb.log"], cluster, "mariadb")
        _wait(lambda: _port_open(DB_PORT), 60, "MariaDB", cluster, "mariadb")
    if not _port_open(DBD_PORT):
        _spawn([_which("slurmdbd"), "-D"], cluster, "slurmdbd")
        _wait(lambda: _port_open(DBD_PORT), 60, "slurmdbd", cluster, "slurmdbd")
    if not _port_open(CTLD_PORT):
        _spawn([_which("slurmctld"), "-D", "-i"], cluster, "slurmctld")
        _wait(lambda: _port_open(CTLD_PORT), 60, "slurmctld", cluster, "slurmctld")
    if not _port_open(SLURMD_PORT):
        _spawn([_which("slurmd"), "-D", "-N", cluster.node], cluster, "slurmd")
        _wait(lambda: _port_open(SLURMD_PORT), 60, "slurmd", cluster, "slurmd")

    def node_idle() -> bool:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], env=cluster.env(), capture_output=True,
                             text=True, timeout=30)
        return out.returncode == 0 and out.stdout.strip().rstrip("*") in ("idle", "mixed", "allocated")

    _wait(node_idle, 60, "the node to register idle", cluster, "slurmd")
    return cluster


def stop(base: Path = BASE) -> None:
    """Cancel every job of the cluster, then stop its daemons (by their pid files), slurmd first."""
    run = base / "run"
    if _pid_alive(run / "slurmctld.pid") is not None:
        # A job left running would outlive its slurmd as an orphaned slurmstepd.
        env = dict(os.environ, SLURM_CONF=str(base / "etc" / "slurm.conf"))
        subprocess.run(["scancel", f"--user={os.geteuid()}"], env=env, capture_output=True, timeout=30)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            left = subprocess.run(["squeue", "-h", "-o", "%i"], env=env, capture_output=True, text=True, timeout=30)
            if left.returncode != 0 or not left.stdout.strip():
                break
            time.sleep(0.2)
    for name in ("slurmd", "slurmctld", "slurmdbd", "mysqld", "munged"):
        pid = _pid_alive(run / f"{name}.pid")
        if pid is None:
            continue
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and _running(pid):
            time.sleep(0.1)
        if _running(pid):
            os.kill(pid, signal.SIGKILL)


def _running(pid: int) -> bool:
    """Alive and not a zombie (a daemon this process started stays one until reaped: reap it)."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    except ChildProcessError:
        pass
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def main(argv: list[str]) -> int:
    what = argv[1] if len(argv) > 1 else "up"
    if what == "up":
        started = time.monotonic()
        try:
            cluster = start()
        except ClusterUnavailable as exc:
            print(f"slurm test cluster unavailable: {exc}", file=sys.stderr)
            return 3
        print(f"cluster up in {time.monotonic() - started:.1f}s; export SLURM_CONF={cluster.conf}")
        return 0
    if what == "down":
        stop()
        return 0
    if what == "env":
        print(f"export SLURM_CONF={BASE / 'etc' / 'slurm.conf'}")
        return 0
    print("usage: testcluster.py up|down|env", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
