"""The real single-node Slurm cluster of the Slurm tests, started once per session (tests/slurm/testcluster.py)."""
from __future__ import annotations

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
    when they cannot be installed (or not as root). Stopped at the end unless it was
    already running (or GPUDECK_SLURM_KEEP=1 keeps it for the next session).
    """
    if os.environ.get("GPUDECK_SKIP_SLURM") == "1":
        pytest.skip("GPUDECK_SKIP_SLURM=1: Slurm tests skipped on request")
    import testcluster
    was_running = testcluster.running()
    started = time.monotonic()
    try:
        cluster = testcluster.start()
    except testcluster.ClusterUnavailable as exc:
        pytest.skip(f"no Slurm test cluster: {exc}")
    if not was_running:
        print(f"\n[slurm-test] cluster up in {time.monotonic() - started:.1f} s", file=sys.stderr)
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)
    yield cluster
    if previous is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = previous
    if not was_running and os.environ.get("GPUDECK_SLURM_KEEP") != "1":
        testcluster.stop()
