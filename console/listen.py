"""The one reading of a `--listen HOST:PORT` option (gpudeck exporter, gpudeck web) and of "is it loopback"."""
from __future__ import annotations

import ipaddress

from gpudeck.console.errors import CliError


def parse_listen(text: str, default: str, *, any_free_port: bool = False) -> tuple[str, int]:
    """'127.0.0.1:9402', '[::1]:9402', 'localhost:80', '0.0.0.0:80' -> (host, port); CliError (exit 2) else.

    The address is always named: ':9402' is refused rather than read as every address, so listening
    beyond this machine is never an accident of a missing word. Port 0 (the kernel picks a free one)
    only where the command prints the port it got (`any_free_port`).
    """
    lowest = 0 if any_free_port else 1
    host, sep, port_text = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not (port_text.isascii() and port_text.isdigit()) or not lowest <= int(port_text) <= 65535:
        raise CliError(f"--listen wants HOST:PORT with a port {lowest}-65535 (e.g. {default}), got {text!r}", code=2)
    return host, int(port_text)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
