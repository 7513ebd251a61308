"""`gpudeck hosts [--json]` lists the hosts of hosts.toml; `gpudeck hosts trust NAME` records a host's key."""
from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from gpudeck.console.errors import CliError

if TYPE_CHECKING:
    from gpudeck.jobs.hosts.config import HostSpec


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("hosts", help="list the hosts of ~/.config/gpudeck/hosts.toml; `hosts trust NAME`",
                       description="Without arguments: every host (local first) with its SSH destination. "
                                   "`gpudeck hosts trust NAME` shows the host key NAME presents, with its "
                                   "SHA256 fingerprint, and records it in ~/.ssh/known_hosts if you say yes.")
    p.add_argument("action", nargs="?", choices=["list", "trust"], default="list")
    p.add_argument("name", nargs="?", metavar="NAME")
    p.add_argument("--yes", action="store_true", help="trust without asking (you checked the fingerprint)")
    p.add_argument("--json", action="store_true", help="print the hosts as JSON")
    p.set_defaults(handler=run_hosts, remote_ok=True)


def _hosts() -> dict[str, HostSpec]:
    from gpudeck.jobs.hosts.config import HostConfigError, load_hosts
    try:
        return load_hosts()
    except HostConfigError as exc:
        raise CliError(str(exc), code=2) from None


def run_hosts(args: argparse.Namespace) -> int:
    hosts = _hosts()
    if args.action == "trust":
        return _trust(args, hosts)
    if args.json:
        print(json.dumps({"hosts": [{"name": h.name, "ssh": h.ssh, "jobs": h.jobs, "python": h.python,
                                     "state_dir": h.state_dir, "simulated": h.simulated} for h in hosts.values()]},
                         indent=1))
        return 0
    from gpudeck.jobs.hosts.config import hosts_file
    for h in hosts.values():
        where = "this machine" if h.local else h.ssh
        extra = f"  jobs {h.jobs}" if h.jobs else ""
        print(f"{h.name:<16} {where}{extra}{'  SIMULATED' if h.simulated else ''}")
    if len(hosts) == 1:
        print(f"(no remote hosts: declare them in {hosts_file()})")
    return 0


def _trust(args: argparse.Namespace, hosts: dict) -> int:
    import asyncio

    from gpudeck.jobs.hosts.ssh import HostError, fetch_host_key, known_hosts_target, trust_host_key
    if not args.name:
        raise CliError("usage: gpudeck hosts trust NAME", code=2)
    spec = hosts.get(args.name)
    if spec is None:
        raise CliError(f"no host named {args.name!r} (hosts: {', '.join(hosts)})", code=2)
    if spec.local:
        raise CliError("the local machine needs no host key", code=2)
    try:
        key = asyncio.run(fetch_host_key(spec))
    except HostError as exc:
        raise CliError(str(exc)) from None
    name, port = known_hosts_target(spec)
    print(f"{spec.name} ({spec.ssh} -> {name}:{port}) presents a {key.get_algorithm()} key")
    print(f"fingerprint {key.get_fingerprint()}")
    if not args.yes:
        if not sys.stdin.isatty():
            raise CliError("not trusted: no terminal to ask on; check the fingerprint and pass --yes", code=2)
        answer = input("Trust this key and record it in ~/.ssh/known_hosts? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            print("not trusted")
            return 1
    path = trust_host_key(spec, key)
    print(f"trusted: recorded in {path}")
    return 0
