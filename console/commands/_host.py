"""Shared by the commands that work over SSH: resolve --host, call the host's agent, one-line errors."""
from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any, Callable, Optional, ParamSpec, TypeVar

from gpudeck.console.errors import CliError

if TYPE_CHECKING:                       # imported lazily below: `gpudeck --help` loads no SSH code
    from gpudeck.jobs.hosts.config import HostSpec
    from gpudeck.jobs.hosts.remote import RemoteHost

P = ParamSpec("P")
T = TypeVar("T")


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


class Remote:
    """A RemoteHost whose failures are CliErrors (exit 1 for the box, 2 for a request the box refused)."""

    def __init__(self, spec: HostSpec) -> None:
        from gpudeck.jobs.hosts.remote import RemoteHost
        self.spec = spec
        self.host: RemoteHost = RemoteHost(spec)

    def _guard(self, fn: Callable[P, T], *a: P.args, **kw: P.kwargs) -> T:
        from gpudeck.jobs.hosts.errors import HostError, RemoteError
        try:
            return fn(*a, **kw)
        except RemoteError as exc:
            raise CliError(str(exc), code=2) from None
        except HostError as exc:
            raise CliError(str(exc), code=1) from None

    def call(self, op: str, params: Optional[dict] = None) -> Any:
        return self._guard(self.host.call, op, params)

    def action(self, op: str, params: dict) -> Any:
        return self._guard(self.host.action, op, params)

    def agent_info(self) -> dict:
        return self._guard(self.host.agent_info)

    def follow_log(self, job: str, write: Callable[[bytes], None], **kw: Any) -> int:
        """RemoteHost.follow_log (run, tail, follow, wait_s, reconnect_timeout_s), with one-line errors."""
        return self._guard(self.host.follow_log, job, write, **kw)

    def close(self) -> None:
        try:
            self.host.close()
        except Exception:  # noqa: BLE001 - closing a dead link must not mask the real result
            pass

    def __enter__(self) -> "Remote":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
