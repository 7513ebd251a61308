"""The real single-node Slurm cluster of the Slurm tests, started once per session (tests/slurm/testcluster.py)."""
from __future__ import annotations

import fcntl
import os
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))               # testcluster.py


@pytest.fixture(scope="session")
def slurm_cluster():
    """munged + MariaDB + slurmdbd + slurmctld + slurmd on 127.0.0.1; SLURM_CONF points every client at it.

    Installs slurm-wlm, munge and mariadb-server with apt-get when missing; skips only
    when they cannot be installed (or not as root). Several test sessions may share
    the cluster: each holds a shared lock on it, and the last one out stops it if a
    test session started it (GPUDECK_SLURM_KEEP=1 keeps it for the next session; a
    cluster started by hand is left alone).
    """
    if os.environ.get("GPUDECK_SKIP_SLURM") == "1":
        pytest.skip("GPUDECK_SKIP_SLURM=1: Slurm tests skipped on request")
    import testcluster
    testcluster.BASE.mkdir(parents=True, exist_ok=True)
    lock_fd = os.open(testcluster.BASE / "users.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    # Exclusive while starting (two sessions must not both start daemons), shared while in use.
    fcntl.flock(lock_fd, fcntl.LOCK_EX)
    marker = testcluster.BASE / "started-by-tests"
    try:
        was_running = testcluster.running()
        started = time.monotonic()
        try:
            cluster = testcluster.start()
        except testcluster.ClusterUnavailable as exc:
            os.close(lock_fd)
            pytest.skip(f"no Slurm test cluster: {exc}")
        if not was_running:
            marker.touch()
            print(f"\n[slurm-test] cluster up in {time.monotonic() - started:.1f} s", file=sys.stderr)
    finally:
        fcntl.flock(lock_fd, fcntl.LOCK_SH)
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)
    yield cluster
    if previous is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = previous
    fcntl.flock(lock_fd, fcntl.LOCK_UN)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(lock_fd)              # another session still uses it
        return
    try:
        if marker.exists() and os.environ.get("GPUDECK_SLURM_KEEP") != "1":
            testcluster.stop()
            marker.unlink()
    finally:
        os.close(lock_fd)
