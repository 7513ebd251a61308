"""A remote host for synchronous callers (the CLI): calls that block, through the host's link keeper or directly."""
from __future__ import annotations

import base64
from typing import Any, Callable, Optional

from gpudeck.jobs.hosts import mux
from gpudeck.jobs.hosts.config import HostSpec
from gpudeck.jobs.hosts.errors import HostError

# Actions wait this long for their answer: a stop may spend its whole grace period
# plus the SIGKILL sweep and the GPU-release check on the box.
ACTION_TIMEOUT_S = 600.0
QUERY_TIMEOUT_S = 60.0


class RemoteHost:
    """`call(op, ...)` on the host's agent; `follow_log` streams a run's output by offset across reconnects.

    By default requests go through the host's link keeper (`mux`: one kept SSH link per
    host, so a command costs a Unix-socket round trip, not an SSH handshake); with
    GPUDECK_SSH_MUX=0 this process holds its own link for its lifetime.
    """

    def __init__(self, spec: HostSpec, *, use_mux: Optional[bool] = None) -> None:
        self.spec = spec
        self.use_mux = mux.enabled(spec) if use_mux is None else use_mux
        self._loop: Any = None
        self._link: Any = None
        self.hello: dict = {}

    @property
    def link(self) -> Any:
        """The in-process HostLink (only without the keeper)."""
        if self._link is None:
            import asyncio

            from gpudeck.jobs.hosts.ssh import HostLink
            self._loop = asyncio.new_event_loop()
            self._link = HostLink(self.spec)
        return self._link

    def call(self, op: str, params: Optional[dict] = None, *, timeout: float = QUERY_TIMEOUT_S,
             retry: bool = True) -> Any:
        if self.use_mux:
            return mux.call(self.spec, op, params, timeout=timeout, retry=retry)
        link = self.link
        result = self._loop.run_until_complete(link.call(op, params, timeout=timeout, retry=retry))
        self.hello = link.hello
        return result

    def agent_info(self) -> dict:
        """The agent's hello (via, version, python, hostname)."""
        if self.use_mux:
            return self.call("hello")
        return dict(self.link.hello)

    def action(self, op: str, params: dict) -> Any:
        """start/stop/restart: never re-sent after a lost answer (it may have happened: say so)."""
        try:
            return self.call(op, params, timeout=ACTION_TIMEOUT_S, retry=False)
        except HostError as exc:
            if "cannot connect" in str(exc) or "host key" in str(exc).lower():
                raise
            raise HostError(f"{exc} during {op}; it may have taken effect on the box: check "
                            f"`gpudeck --host {self.spec.name} jobs`") from None

    def follow_log(self, job: str, write: Callable[[bytes], None], *, run: Optional[str] = None,
                   tail: Optional[int] = None, follow: bool = False, wait_s: float = 5.0,
                   reconnect_timeout_s: float = 3600.0) -> int:
        """Write the run's bytes from the start (or the last `tail` lines) to `write`; with `follow`,
        until the run ends. Returns the final offset.

        The offset only advances past bytes already written, and every request names
        its offset: a reconnect resumes exactly there, with no gap and no repeat.
        """
        offset: Optional[int] = None
        run_id = run
        while True:
            params: dict[str, Any] = {"job": job, "run": run_id, "wait_s": wait_s if follow else 0}
            if offset is None:
                params["tail"] = tail
            else:
                params["offset"] = offset
            # The first request fails at once on a host that is down; later ones wait for the reconnect.
            reply = self.call("logs", params, timeout=reconnect_timeout_s + wait_s
                              if offset is not None else QUERY_TIMEOUT_S)
            run_id = reply["run_id"]          # pinned: a new run starting meanwhile is not mixed in
            data = base64.b64decode(reply.get("data") or "")
            if data:
                write(data)
            offset = reply["next_offset"]
            if reply.get("ended") or (not follow and not data):
                return offset

    def close(self) -> None:
        if self._link is not None:
            try:
                self._loop.run_until_complete(self._link.close())
            finally:
                self._loop.close()
                self._link = None

    def __enter__(self) -> "RemoteHost":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
