"""hosts.toml: the boxes gpudeck reaches over SSH, by name; `local` is always this machine."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    import tomli as tomllib  # type: ignore[no-redef]

from gpudeck.jobs import paths

LOCAL = "local"
# SSH defaults: asyncssh has neither keepalive nor a connect timeout of its own, and
# without keepalive a read on a dead link hangs forever. 15 s x 3: a dead box is
# DOWN within 45 s; a laptop lid closed for a minute costs one reconnect.
KEEPALIVE_S = 15.0
KEEPALIVE_COUNT = 3
CONNECT_TIMEOUT_S = 10.0
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_KEYS = {"ssh", "jobs", "python", "state_dir", "simulated", "keepalive_s", "keepalive_count",
         "connect_timeout_s", "agent"}


class HostConfigError(Exception):
    """hosts.toml is missing a host, malformed, or names an unknown key: one line for the operator."""


@dataclass(frozen=True)
class HostSpec:
    name: str
    ssh: Optional[str] = None               # None: the local machine
    jobs: Optional[str] = None              # the jobs file on that box (else its own default lookup)
    python: str = "python3"
    state_dir: Optional[str] = None         # the state dir on that box (else its XDG default)
    simulated: bool = False                 # the agent reports the SIMULATED 8-GPU box (tests, bench)
    keepalive_s: float = KEEPALIVE_S
    keepalive_count: int = KEEPALIVE_COUNT
    connect_timeout_s: float = CONNECT_TIMEOUT_S
    agent: str = "auto"                     # auto: installed gpudeck if it speaks our protocol, else the zipapp

    @property
    def local(self) -> bool:
        return self.ssh is None

    def destination(self) -> tuple[Optional[str], str, Optional[int]]:
        """(user, host-or-alias, port) from `user@box`, `box`, `box:2222` or `ssh://user@box:2222`."""
        dest = self.ssh or ""
        if dest.startswith("ssh://"):
            dest = dest[len("ssh://"):]
        user, _, host = dest.rpartition("@")
        port = None
        if host.count(":") == 1:
            host, _, port_text = host.partition(":")
            port = int(port_text)
        return (user or None), host, port


def hosts_file() -> Path:
    explicit = os.environ.get("GPUDECK_HOSTS")
    return Path(explicit).expanduser() if explicit else paths.config_dir() / "hosts.toml"


def load_hosts(path: Optional[Path] = None) -> dict[str, HostSpec]:
    """Every host: `local` first, then hosts.toml's `[hosts.NAME]` tables in file order."""
    path = hosts_file() if path is None else path
    hosts = {LOCAL: HostSpec(LOCAL)}
    if not path.exists():
        return hosts
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise HostConfigError(f"{path}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise HostConfigError(f"{path}: {exc}") from None
    table = data.get("hosts", {})
    if not isinstance(table, dict):
        raise HostConfigError(f"{path}: [hosts] must be a table of [hosts.NAME] tables")
    for name, entry in table.items():
        where = f"{path}: hosts.{name}"
        if not _NAME.match(name) or name == LOCAL:
            raise HostConfigError(f"{where}: host names are letters, digits, '.', '_', '-' (and not 'local')")
        if not isinstance(entry, dict):
            raise HostConfigError(f"{where}: must be a table")
        unknown = set(entry) - _KEYS
        if unknown:
            raise HostConfigError(f"{where}: unknown key {sorted(unknown)[0]!r} (known: {', '.join(sorted(_KEYS))})")
        ssh = entry.get("ssh")
        if not isinstance(ssh, str) or not ssh.strip():
            raise HostConfigError(f"{where}: needs ssh = \"user@box\" or an alias from ~/.ssh/config")
        kwargs = {}
        for key, kind in (("jobs", str), ("python", str), ("state_dir", str), ("simulated", bool),
                          ("keepalive_s", (int, float)), ("keepalive_count", int),
                          ("connect_timeout_s", (int, float)), ("agent", str)):
            if key in entry:
                value = entry[key]
                if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
                    raise HostConfigError(f"{where}: {key} has the wrong type ({type(value).__name__})")
                kwargs[key] = value
        if kwargs.get("agent", "auto") not in ("auto", "installed", "zipapp"):
            raise HostConfigError(f"{where}: agent must be auto, installed or zipapp")
        spec = HostSpec(name=name, ssh=ssh.strip(), **kwargs)
        try:
            spec.destination()
        except ValueError:
            raise HostConfigError(f"{where}: bad ssh destination {ssh!r}") from None
        hosts[name] = spec
    return hosts


def resolve_host(name: Optional[str], path: Optional[Path] = None) -> HostSpec:
    """--host NAME, else $GPUDECK_HOST, else local."""
    name = name or os.environ.get("GPUDECK_HOST") or LOCAL
    hosts = load_hosts(path)
    if name not in hosts:
        where = hosts_file() if path is None else path
        known = ", ".join(hosts)
        raise HostConfigError(f"no host named {name!r} in {where} (hosts: {known})")
    return hosts[name]
