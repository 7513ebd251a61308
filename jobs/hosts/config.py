"""hosts.toml: the boxes gpudeck reaches over SSH, by name; `local` is always this machine."""
from __future__ import annotations

import math
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

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
         "connect_timeout_s", "agent", "readonly"}


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
    # Watch only: the agent is started with --readonly and refuses every op that changes the box,
    # whatever a client sends it on that connection; the console offers no acting key for the host.
    readonly: bool = False

    @property
    def local(self) -> bool:
        return self.ssh is None

    def destination(self) -> tuple[Optional[str], str, Optional[int]]:
        """(user, host-or-alias, port) from `user@box`, `box`, `box:2222`, `ssh://user@box:2222`,
        `user@[::1]:22` or a bare `::1`; ValueError (saying why) for what no connection could use."""
        dest = self.ssh or ""
        if dest.startswith("ssh://"):
            dest = dest[len("ssh://"):]
        user, _, host = dest.rpartition("@")
        port_text = None
        if host.startswith("["):
            # IPv6 (or any host) in brackets, as ssh:// URLs and known_hosts write it: [::1]:22
            host, closed, rest = host[1:].partition("]")
            if not closed or (rest and not rest.startswith(":")):
                raise ValueError("a bracketed host is written [::1] or [::1]:22")
            port_text = rest[1:] if rest else None
        elif host.count(":") == 1:
            host, _, port_text = host.partition(":")
        # (more than one ':' unbracketed: a bare IPv6 address, no port)
        if not host:
            raise ValueError("no host name")
        port = None
        if port_text is not None:
            if not (port_text.isascii() and port_text.isdigit()):
                raise ValueError(f"port {port_text!r} is not a number")
            port = int(port_text)
            if not 1 <= port <= 65535:
                raise ValueError(f"port {port} is out of range (1-65535)")
        return (user or None), host, port


def hosts_file() -> Path:
    explicit = os.environ.get("GPUDECK_HOSTS")
    return Path(explicit).expanduser() if explicit else paths.config_dir() / "hosts.toml"


def load_hosts(path: Optional[Path] = None) -> dict[str, HostSpec]:
    """Every host: `local` first, then hosts.toml's `[hosts.NAME]` tables in file order.

    Errors are one line, located like jobs.toml's: `FILE:LINE:COL: message`.
    """
    path = hosts_file() if path is None else path
    hosts = {LOCAL: HostSpec(LOCAL)}
    if not path.exists():
        return hosts
    # The spec's locator, only when there is a file to read: `status` without hosts.toml stays light.
    # (tomllib too: ~5 ms of every command's start on the VM where no hosts.toml is read)
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on 3.10 only
        import tomli as tomllib
    from gpudeck.jobs.spec import SpecError, _Locator, _toml_error
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise HostConfigError(f"{path}: {exc}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise HostConfigError(str(_toml_error(path, text, exc))) from None
    locator = _Locator(text)

    def fail(message: str, at: tuple, part: str = "value") -> HostConfigError:
        line, col = locator.where(at, part)
        return HostConfigError(str(SpecError(path, line, col, message)))

    table = data.get("hosts", {})
    if not isinstance(table, dict):
        raise fail("[hosts] must be a table of [hosts.NAME] tables", ("hosts",))
    for name, entry in table.items():
        at = ("hosts", name)
        where = f"hosts.{name}"
        if not _NAME.match(name) or name == LOCAL:
            raise fail(f"{where}: host names are letters, digits, '.', '_', '-' (and not 'local')", at, "key")
        if not isinstance(entry, dict):
            raise fail(f"{where}: must be a table", at)
        unknown = [key for key in entry if key not in _KEYS]
        if unknown:
            raise fail(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(_KEYS))})",
                       at + (unknown[0],), "key")
        ssh = entry.get("ssh")
        if not isinstance(ssh, str) or not ssh.strip():
            raise fail(f"{where}: needs ssh = \"user@box\" or an alias from ~/.ssh/config",
                       at + ("ssh",) if "ssh" in entry else at, "value" if "ssh" in entry else "key")
        kwargs: dict[str, Any] = {}           # each value's type is checked against HostSpec's below
        for key, kind in (("jobs", str), ("python", str), ("state_dir", str), ("simulated", bool),
                          ("keepalive_s", (int, float)), ("keepalive_count", int),
                          ("connect_timeout_s", (int, float)), ("agent", str), ("readonly", bool)):
            if key in entry:
                value = entry[key]
                if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
                    raise fail(f"{where}: {key} has the wrong type ({type(value).__name__})", at + (key,))
                kwargs[key] = value
        # A nan timeout never fires, inf waits forever, 0 or less fails every connection
        # at once (and keepalive 0 switches keepalive off: a dead link would hang reads).
        for key in ("keepalive_s", "connect_timeout_s"):
            if key in kwargs and not (math.isfinite(kwargs[key]) and kwargs[key] > 0):
                raise fail(f"{where}: {key} must be a number of seconds above 0 (not {kwargs[key]})", at + (key,))
        if "keepalive_count" in kwargs and kwargs["keepalive_count"] < 1:
            raise fail(f"{where}: keepalive_count must be 1 or more", at + ("keepalive_count",))
        if kwargs.get("agent", "auto") not in ("auto", "installed", "zipapp"):
            raise fail(f"{where}: agent must be auto, installed or zipapp", at + ("agent",))
        spec = HostSpec(name=name, ssh=ssh.strip(), **kwargs)
        try:
            spec.destination()
        except ValueError as exc:
            raise fail(f"{where}: bad ssh destination {ssh!r}: {exc}", at + ("ssh",)) from None
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
