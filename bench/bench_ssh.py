"""Bench: SSH bandwidth per host at 1 Hz and what an action over SSH adds, against a real local sshd.

    .venv/bin/python bench/bench_ssh.py [--seconds 30]

Starts an OpenSSH server on 127.0.0.1 (as the SSH tests do), with the remote agent
reporting the SIMULATED 8-GPU box, and puts a byte-counting TCP relay between gpudeck
and sshd, so the bandwidth is what crosses the wire: SSH framing, MACs and keepalives
included. Target: <= 2 KB/s per host at 1 Hz. Then times `start` + `stop` of a short job
through the CLI on the local box (`gpudeck --jobs FILE start/stop`, the baseline, measured in
the same run, interleaved) and with `--host box`: through the link keeper (the default), with
a new connection per command (GPUDECK_SSH_MUX=0), and over a kept link in-process (the
console's path). Each prints what --host adds and its ratio to the local baseline.
Target: <= 0.3 s added to start + stop.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "ssh"))
sys.path.insert(0, str(REPO / "tests"))          # runsupport, which sshsupport uses

from sshsupport import ClientHome, Sshd, ensure_openssh  # noqa: E402


class Relay:
    """127.0.0.1:port -> target port, counting the bytes each way."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.up = 0          # client -> server
        self.down = 0        # server -> client
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        threading.Thread(target=self._run, args=(ready,), daemon=True).start()
        ready.wait(10)

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)

        async def pipe(reader, writer, count):
            try:
                while data := await reader.read(65536):
                    count(len(data))
                    writer.write(data)
                    await writer.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                writer.close()

        async def handle(cr, cw):
            sr, sw = await asyncio.open_connection("127.0.0.1", self.target)
            await asyncio.gather(pipe(cr, sw, self._add_up), pipe(sr, cw, self._add_down))

        async def main():
            server = await asyncio.start_server(handle, "127.0.0.1", 0)
            self.port = server.sockets[0].getsockname()[1]
            ready.set()
            await server.serve_forever()

        self.loop.run_until_complete(main())

    def _add_up(self, n: int) -> None:
        self.up += n

    def _add_down(self, n: int) -> None:
        self.down += n


def bandwidth(lab_home: ClientHome, seconds: float, interval: float) -> dict:
    from gpudeck.jobs.hosts.config import load_hosts
    from gpudeck.jobs.hosts.fleet import Fleet
    fleet = Fleet([load_hosts()["boxr"]], interval=interval).start()
    try:
        deadline = time.monotonic() + 60
        while fleet.views()["boxr"].state != "LIVE" or not fleet.views()["boxr"].status:
            if time.monotonic() > deadline:
                raise SystemExit(f"boxr never came up: {fleet.views()['boxr'].error}")
            time.sleep(0.1)
        time.sleep(3 * interval)                     # past the first full payloads
        relay = RELAY
        up0, down0 = relay.up, relay.down
        in0, out0 = fleet.views()["boxr"].bytes_in, fleet.views()["boxr"].bytes_out
        t0 = time.monotonic()
        time.sleep(seconds)
        dt = time.monotonic() - t0
        view = fleet.views()["boxr"]
        return {"wire_down": (relay.down - down0) / dt, "wire_up": (relay.up - up0) / dt,
                "payload_in": (view.bytes_in - in0) / dt, "payload_out": (view.bytes_out - out0) / dt,
                "state": view.state}
    finally:
        fleet.close()


def timed(argv: list[str], env: dict) -> float:
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "gpudeck.console.cli", *argv], env=env, cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    took = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {out.stderr.strip()}")
    return took


KEYS = ("local start", "ssh start", "local stop", "ssh stop", "local start+stop", "ssh start+stop")


def medians(res: dict[str, list[float]]) -> dict:
    """Each figure's median; start+stop is the median of each round's sum (one action pair)."""
    for where in ("local", "ssh"):
        res[f"{where} start+stop"] = [a + b for a, b in zip(res[f"{where} start"], res[f"{where} stop"])]
    return {k: statistics.median(v) for k, v in res.items()}


def actions(env: dict, jobs: Path, rounds: int) -> dict:
    """`gpudeck start/stop nap` on the local box (--jobs, its own state dir) and with --host box, interleaved."""
    local_env = dict(env, GPUDECK_STATE_DIR=str(jobs.parent / "local-state"))
    res: dict[str, list[float]] = {k: [] for k in KEYS[:4]}
    for _ in range(rounds):
        res["local start"].append(timed(["--jobs", str(jobs), "start", "nap"], local_env))
        res["ssh start"].append(timed(["--host", "box", "start", "nap"], env))
        res["local stop"].append(timed(["--jobs", str(jobs), "stop", "nap"], local_env))
        res["ssh stop"].append(timed(["--host", "box", "stop", "nap"], env))
    return medians(res)


def print_actions(title: str, res: dict, remote: str = "--host") -> None:
    print(title)
    for op in ("start", "stop", "start+stop"):
        here, there = res[f"local {op}"], res[f"ssh {op}"]
        target = "  (target <= +0.300 s)" if op == "start+stop" else ""
        print(f"  {op:<10} local {here:.3f} s, {remote} {there:.3f} s: added {there - here:+.3f} s, "
              f"{there / here:.2f}x local{target}")


def cold_breakdown(rounds: int) -> dict:
    """Where a cold `--host` command's extra time goes: importing asyncssh, the SSH handshake, the agent's start."""
    def py(code: str) -> float:
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
        return time.perf_counter() - t0
    res: dict[str, list[float]] = {k: [] for k in ("import asyncssh", "connect", "agent start")}
    from gpudeck.jobs.hosts.config import load_hosts
    from gpudeck.jobs.hosts.ssh import AgentChannel, open_connection
    spec = load_hosts()["box"]

    async def one() -> None:
        t0 = time.perf_counter()
        conn = await open_connection(spec)
        t1 = time.perf_counter()
        channel = await AgentChannel.open(spec, conn)
        t2 = time.perf_counter()
        await channel.close()
        res["connect"].append(t1 - t0)
        res["agent start"].append(t2 - t1)

    for _ in range(rounds):
        res["import asyncssh"].append(py("import asyncssh") - py("pass"))
        asyncio.run(one())
    return {k: statistics.median(v) for k, v in res.items()}


def warm_actions(rounds: int) -> dict:
    """start/stop over one kept link (the console's path), against the same Box calls on a LocalBox here."""
    from gpudeck.jobs.box.local import LocalBox
    from gpudeck.jobs.hosts.config import load_hosts
    from gpudeck.jobs.hosts.ssh import HostLink
    spec = load_hosts()["box"]
    # What the agent serves on the box: a LocalBox (its jobs file read for each request, as there).
    box = LocalBox(jobs_file=spec.jobs, state_dir=Path(spec.state_dir).parent / "local-state-warm")
    res: dict[str, list[float]] = {k: [] for k in KEYS[:4]}

    async def run() -> None:
        link = HostLink(spec)
        await link.call("ping", timeout=30)
        for _ in range(rounds):
            for where in ("local", "ssh"):
                for op in ("start", "stop"):
                    t0 = time.perf_counter()
                    if where == "local":
                        getattr(box, op)("nap")
                    else:
                        await link.call(op, {"job": "nap"}, timeout=120, retry=False)
                    res[f"{where} {op}"].append(time.perf_counter() - t0)
        await link.close()

    asyncio.run(run())
    return medians(res)


RELAY: Relay


def main() -> int:
    global RELAY
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    reason = ensure_openssh()
    if reason:
        raise SystemExit(reason)
    root = Path(tempfile.mkdtemp(prefix="gpudeck-bench-ssh-"))
    home = ClientHome(root / "laptop")
    sshd = Sshd(root / "box", home.pub).start()
    try:
        RELAY = Relay(sshd.port)
        home.add_alias("box", sshd)
        relayed = Sshd.__new__(Sshd)            # the same server, reached through the relay's port
        relayed.port = RELAY.port
        home.add_alias("boxr", relayed)
        home.trust(sshd)
        with open(home.known_hosts, "a") as fh:
            fh.write(f"[127.0.0.1]:{RELAY.port} {sshd.host_pub()}\n")
        jobs = root / "jobs.toml"
        jobs.write_text('[jobs.nap]\ncmd = "exec sleep 600"\nstop_timeout = 5\n')
        hosts = "".join(f'[hosts.{n}]\nssh = "{n}"\njobs = "{jobs}"\nstate_dir = "{root / "state"}"\nsimulated = true\n\n'
                        for n in ("box", "boxr"))
        home.write_hosts(hosts)
        env = home.env()
        for key, value in env.items():
            os.environ[key] = value
        os.environ.pop("SSH_AUTH_SOCK", None)
        print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
              f"OpenSSH {subprocess.run(['ssh', '-V'], capture_output=True, text=True).stderr.strip()}")
        bw = bandwidth(home, args.seconds, args.interval)
        print(f"\nbandwidth, one host, SIMULATED 8-GPU box, status+jobs every {args.interval:g} s, "
              f"{args.seconds:g} s measured:")
        wire = bw["wire_down"] + bw["wire_up"]
        print(f"  on the wire (TCP, both SSH directions): {bw['wire_down']:.0f} B/s down + {bw['wire_up']:.0f} B/s up"
              f" = {wire:.0f} B/s, {wire / 2048:.2f}x the target (<= 2048 B/s; the local box sends nothing)")
        print(f"  agent payload (JSON lines):             {bw['payload_in']:.0f} B/s in + {bw['payload_out']:.0f} B/s out")
        first = timed(["--host", "box", "jobs"], env)
        print(f"\nfirst `gpudeck --host box jobs` (starts the host's link keeper): {first:.3f} s")
        kept = actions(env, jobs, args.rounds)
        print_actions(f"the CLI, local box vs --host box through the link keeper (the default), "
                      f"median of {args.rounds}:", kept)
        cold = actions(dict(env, GPUDECK_SSH_MUX="0"), jobs, args.rounds)
        print_actions(f"the CLI without the keeper (GPUDECK_SSH_MUX=0: a new connection each), "
                      f"median of {args.rounds}:", cold)
        parts = cold_breakdown(args.rounds)
        print("  of which: " + ", ".join(f"{k} {v:.3f} s" for k, v in parts.items()))
        warm = warm_actions(args.rounds)
        print()
        print_actions(f"in-process over a kept link (the console's path) vs a LocalBox here, "
                      f"median of {args.rounds}:", warm, remote="over SSH")
    finally:
        home.stop_keepers()
        sshd.stop()
        import shutil
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
