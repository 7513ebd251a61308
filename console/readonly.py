"""Whether gpudeck may act: --readonly, $GPUDECK_READONLY, config.toml's readonly, a host's readonly, --demo.

One answer for the CLI (a mutating command refused in one line, exit 2) and for the
console (the acting keys hidden, each refusing with a notice): "actions off: demo" or
"actions off: read-only". The box's agent enforces a read-only connection on its own.
"""
from __future__ import annotations

import argparse
import os
from typing import Any, Optional

from gpudeck.console.errors import CliError

ENV = "GPUDECK_READONLY"
_OFF = ("", "0", "false", "no", "off")


def env_readonly() -> bool:
    """$GPUDECK_READONLY set to anything but 0/false/no/off/empty: a typo keeps the console watch-only."""
    return os.environ.get(ENV, "").strip().lower() not in _OFF


def readonly_source(args: argparse.Namespace) -> Optional[str]:
    """What made this invocation read-only ("--readonly", "GPUDECK_READONLY=1", "readonly = true in …"),
    or None. Read once per invocation (the config file is read only when neither flag says so)."""
    cached: object = getattr(args, "_readonly_source", False)
    if cached is None or isinstance(cached, str):       # False: not read yet
        return cached
    source: Optional[str] = None
    if getattr(args, "readonly", False):
        source = "--readonly"
    elif env_readonly():
        source = f"{ENV}={os.environ.get(ENV, '').strip()}"
    else:
        from gpudeck.console.config import config_path, load_console_config
        if load_console_config().readonly:
            source = f"readonly = true in {config_path()}"
    args._readonly_source = source
    return source


def refuse_mutation(args: argparse.Namespace, spec: Any = None) -> None:
    """A command that starts, stops or deletes, under read-only: one line, exit 2, nothing done."""
    source = readonly_source(args)
    if source is None and spec is not None and getattr(spec, "readonly", False):
        from gpudeck.jobs.hosts.config import hosts_file
        source = f"host {spec.name} has readonly = true in {hosts_file()}"
    if source is not None:
        raise CliError(f"{args.command}: read-only: {source}; nothing was done", code=2)


# -- the console -----------------------------------------------------------------------------------

DEMO = "demo"
READ_ONLY = "read-only"


def actions_off(app: Any) -> Optional[str]:
    """"demo" / "read-only" when the console must not act on any job, else None."""
    if getattr(app, "demo_replay", False):
        return DEMO
    if getattr(app, "readonly", None):
        return READ_ONLY
    return None


def refusal(app: Any, demo_reason: str = "these are recorded runs; nothing here starts or stops") -> str:
    """The one line an acting key says when actions are off."""
    off = actions_off(app)
    if off == DEMO:
        return f"actions off: demo ({demo_reason})"
    return f"actions off: read-only ({getattr(app, 'readonly', None) or 'read-only host'})"
