"""The one place a command's box is chosen: --host / $GPUDECK_HOST names it, every command then speaks to a Box."""
from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Optional

from gpudeck.console.errors import CliError

if TYPE_CHECKING:                       # imported lazily below: `gpudeck --help` loads no SSH code
    from gpudeck.jobs.box import Box
    from gpudeck.jobs.hosts.config import HostSpec


def host_spec(args: argparse.Namespace) -> HostSpec:
    """The HostSpec of --host / $GPUDECK_HOST (local when neither is given)."""
    from gpudeck.jobs.hosts.config import HostConfigError, resolve_host
    try:
        spec = resolve_host(getattr(args, "host", None))
    except HostConfigError as exc:
        raise CliError(str(exc), code=2) from None
    if not spec.local and not spec.readonly:
        from gpudeck.console.readonly import readonly_source
        if readonly_source(args) is not None:
            import dataclasses
            # A read-only invocation reaches the box through an agent that refuses to act.
            spec = dataclasses.replace(spec, readonly=True)
    return spec


def remote_spec(args: argparse.Namespace) -> Optional[HostSpec]:
    """The remote HostSpec, or None for the local machine."""
    spec = host_spec(args)
    return None if spec.local else spec


def open_box(args: argparse.Namespace) -> Box:
    """The box this command runs against: this machine (with --jobs) or the --host one over SSH.

    Use it as a context manager (a remote box's link is let go at the end); its BoxErrors are
    printed by the CLI as one line with their exit code."""
    from gpudeck.jobs.box import open_box as open_named_box
    return open_named_box(host_spec(args), jobs_file=getattr(args, "jobs_file", None))
