"""Bench: `analyze` and `pivot` with --host against the same commands run locally, over a real local sshd.

    .venv/bin/python bench/bench_ssh_commands.py [--mb 64] [--rounds 3]

One OpenSSH server on 127.0.0.1 behind a byte-counting TCP relay (bench_ssh.Relay), the
agent as the zipapp under this venv's python (psutil there, for pivot). analyze: a log of
--mb MiB (fixture logs repeated) analysed here and on the box: wall time of the CLI, and
the bytes that crossed the wire for the remote one (only the answer should). pivot: two
SGLang stand-ins (tests/engines/sglang_standin.py, 0.3 s load), pivoted back and forth
with --yes --wait locally and with --host: wall time of the CLI and the pivot overhead it
prints (time outside the engines' own stop and start-to-ready).
"""
from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "ssh"))
sys.path.insert(0, str(REPO / "tests"))          # runsupport, which sshsupport uses
sys.path.insert(0, str(REPO / "bench"))

from bench_ssh import Relay  # noqa: E402
from sshsupport import ClientHome, Sshd, ensure_openssh  # noqa: E402

STANDIN = REPO / "tests" / "engines" / "sglang_standin.py"
LOGS = ["vllm_startup_ready_spec_bad.log", "hf_trainer_total_steps_loss_step.log", "sglang_kv_retract_v0_spec.log"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli(argv: list[str], env: dict) -> tuple[float, str]:
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "gpudeck.console.cli", *argv], env=env, cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    took = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {out.stderr.strip()}")
    return took, out.stdout


def make_log(path: Path, mib: int) -> int:
    body = b"".join((REPO / "tests" / "fixtures" / "logs" / name).read_bytes() for name in LOGS)
    with open(path, "wb") as fh:
        while fh.tell() < mib * 2**20:
            fh.write(body)
    return path.stat().st_size


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    reason = ensure_openssh()
    if reason:
        raise SystemExit(reason)
    root = Path(tempfile.mkdtemp(prefix="gpudeck-bench-sshcmd-"))
    home = ClientHome(root / "laptop")
    sshd = Sshd(root / "box", home.pub).start()
    env: dict = {}
    try:
        relay = Relay(sshd.port)
        relayed = Sshd.__new__(Sshd)
        relayed.port = relay.port
        home.add_alias("box", relayed)
        with open(home.known_hosts, "a") as fh:
            fh.write(f"[127.0.0.1]:{relay.port} {sshd.host_pub()}\n")
        ports = {"eng-a": free_port(), "eng-b": free_port()}
        jobs = root / "jobs.toml"
        jobs.write_text("".join(
            f'[jobs.{n}]\nengine = "sglang"\nport = {p}\nstop_timeout = "10s"\n'
            f'cmd = ["{sys.executable}", "{STANDIN}", "--model-path", "/models/stand-in", "--port", "{p}", '
            f'"--enable-metrics", "--load-seconds", "0.3"]\n\n' for n, p in ports.items()))
        home.write_hosts(f'[hosts.box]\nssh = "box"\njobs = "{jobs}"\nstate_dir = "{root / "state-box"}"\n'
                         f'python = "{sys.executable}"\nagent = "zipapp"\n')
        env = {**home.env(), "GPUDECK_SKIP_VLLM": "1"}
        env.pop("SSH_AUTH_SOCK", None)
        local_env = dict(env, GPUDECK_STATE_DIR=str(root / "state-local"))
        print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
        cli(["--host", "box", "jobs"], env)                 # the link keeper and the agent upload, once

        log = root / "big.log"
        size = make_log(log, args.mb)
        here, there, wire = [], [], []
        for _ in range(args.rounds):
            took, local_out = cli(["analyze", "--json", str(log)], local_env)
            here.append(took)
            before = relay.up + relay.down
            took, remote_out = cli(["--host", "box", "analyze", "--json", str(log)], env)
            there.append(took)
            wire.append(relay.up + relay.down - before)
        print(f"\nanalyze --json of a {size / 2**20:.0f} MiB log, median of {args.rounds}:")
        print(f"  here {statistics.median(here):.2f} s, --host box {statistics.median(there):.2f} s; "
              f"on the wire for the remote one: {statistics.median(wire) / 1024:.1f} KiB "
              f"(the answer is {len(remote_out.encode()) / 1024:.1f} KiB as printed)")

        res: dict[str, list[float]] = {"local wall": [], "local overhead": [], "ssh wall": [], "ssh overhead": []}
        for where, e, base in (("local", dict(local_env), ["--jobs", str(jobs)]), ("ssh", env, ["--host", "box"])):
            cli([*base, "start", "eng-a"], e)
            cur = "eng-a"
            for _ in range(args.rounds * 2):
                nxt = "eng-b" if cur == "eng-a" else "eng-a"
                took, out = cli([*base, "pivot", nxt, "--yes", "--wait", "--timeout", "120"], e)
                res[f"{where} wall"].append(took)
                res[f"{where} overhead"].append(float(re.search(r"pivot overhead ([0-9.]+) s", out).group(1)))
                cur = nxt
            cli([*base, "stop", cur], e)
        print(f"\npivot between two stand-ins with --yes --wait, median of {args.rounds * 2}:")
        for where in ("local", "ssh"):
            print(f"  {'here' if where == 'local' else '--host box'}: CLI wall "
                  f"{statistics.median(res[where + ' wall']):.2f} s, pivot overhead (printed) "
                  f"{statistics.median(res[where + ' overhead']):.2f} s")
    finally:
        for name in ("eng-a", "eng-b"):
            if env:
                subprocess.run([sys.executable, "-m", "gpudeck.console.cli", "--host", "box", "stop", name],
                               env=env, capture_output=True, timeout=120)
                subprocess.run([sys.executable, "-m", "gpudeck.console.cli", "--jobs", str(root / "jobs.toml"),
                                "stop", name], env=dict(env, GPUDECK_STATE_DIR=str(root / "state-local")),
                               capture_output=True, timeout=120)
        home.stop_keepers()
        sshd.stop()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
