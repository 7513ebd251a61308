"""A remote host for synchronous callers (the CLI): one event loop, one kept link, calls that block."""
from __future__ import annotations

import asyncio
from typing import Any, Callable, Optional

from gpudeck.jobs.hosts.config import HostSpec
from gpudeck.jobs.hosts.ssh import HostError, HostLink, decode_log_chunk

# Actions wait this long for their answer: a stop may spend its whole grace period
# plus the SIGKILL sweep and the GPU-release check on the box.
ACTION_TIMEOUT_S = 600.0
QUERY_TIMEOUT_S = 60.0


class RemoteHost:
    """`call(op, ...)` on the host's agent; `follow_log` streams a run's output by offset across reconnects."""

    def __init__(self, spec: HostSpec) -> None:
        self.spec = spec
        self._loop = asyncio.new_event_loop()
        self.link = HostLink(spec)

    def _run(self, coro: Any) -> Any:
        return self._loop.run_until_complete(coro)

    def call(self, op: str, params: Optional[dict] = None, *, timeout: float = QUERY_TIMEOUT_S,
             retry: bool = True) -> Any:
        return self._run(self.link.call(op, params, timeout=timeout, retry=retry))

    def action(self, op: str, params: dict) -> Any:
        """start/stop/restart: never re-sent after a lost answer (it may have happened: say so)."""
        try:
            return self.call(op, params, timeout=ACTION_TIMEOUT_S, retry=False)
        except HostError as exc:
            if self.link.connects:
                raise HostError(f"{exc} during {op}; it may have taken effect on the box: check "
                                f"`gpudeck --host {self.spec.name} jobs`") from None
            raise

    def follow_log(self, job: str, write: Callable[[bytes], None], *, run: Optional[str] = None,
                   tail: Optional[int] = None, follow: bool = False, wait_s: float = 5.0,
                   reconnect_timeout_s: float = 3600.0) -> int:
        """Write the run's bytes from the start (or the last `tail` lines) to `write`; with `follow`,
        until the run ends. Returns the final offset.

        The offset only advances past bytes already written, and every request names
        its offset: a reconnect resumes exactly there, with no gap and no repeat.
        """
        return self._run(self._follow(job, write, run, tail, follow, wait_s, reconnect_timeout_s))

    async def _follow(self, job: str, write: Callable[[bytes], None], run: Optional[str], tail: Optional[int],
                      follow: bool, wait_s: float, reconnect_timeout_s: float) -> int:
        offset: Optional[int] = None
        run_id = run
        while True:
            params: dict[str, Any] = {"job": job, "run": run_id, "wait_s": wait_s if follow else 0}
            if offset is None:
                params["tail"] = tail
            else:
                params["offset"] = offset
            # The first request fails at once on a host that is down; later ones wait for the reconnect.
            reply = await self.link.call("logs", params, timeout=reconnect_timeout_s + wait_s
                                         if offset is not None else QUERY_TIMEOUT_S)
            run_id = reply["run_id"]          # pinned: a new run starting meanwhile is not mixed in
            data = decode_log_chunk(reply)
            if data:
                write(data)
            offset = reply["next_offset"]
            if reply.get("ended") or (not follow and not data):
                return offset

    def close(self) -> None:
        try:
            self._run(self.link.close())
        finally:
            self._loop.close()

    def __enter__(self) -> "RemoteHost":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
