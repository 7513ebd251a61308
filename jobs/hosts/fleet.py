"""The fleet: every remote host polled in the background; faces read the latest views and never wait on the network."""
from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from dataclasses import dataclass, field
from typing import Optional, Sequence

from gpudeck.jobs.hosts.config import HostSpec
from gpudeck.jobs.hosts.protocol import unpack_status
from gpudeck.jobs.hosts.replies import BadReply, bad_reply, check_payload
from gpudeck.jobs.hosts.ssh import DOWN, LIVE, STALE, DeltaState, HostError, HostLink, RemoteError

# Data older than this (while the link claims to be up) is STALE: a reply is late,
# typically a link that died without a goodbye and that keepalive has not yet caught.
STALE_AFTER_S = 3.0
# Faces colour a STALE/DOWN age amber past this, red past the next.
AGE_AMBER_S = 10.0
AGE_RED_S = 60.0


@dataclass(frozen=True)
class HostView:
    """One host as the overview shows it, at one instant."""

    name: str
    ssh: Optional[str]
    state: str                        # CONNECTING | LIVE | STALE | DOWN
    data_age_s: Optional[float]       # seconds since the last status/jobs reply (None: never)
    error: Optional[str] = None
    retry_in_s: Optional[float] = None
    status: Optional[dict] = None     # the `status --json` payload (remote telemetry)
    jobs: Optional[dict] = None       # the `jobs --json` payload
    agent: dict = field(default_factory=dict)   # the agent's hello: via, python, pid
    bytes_in: int = 0
    bytes_out: int = 0
    connects: int = 0

    @property
    def age_level(self) -> str:
        """"ok", "amber" (data older than 10 s) or "red" (older than 60 s)."""
        if self.state == LIVE or self.data_age_s is None:
            return "ok" if self.state == LIVE else "red"
        return "red" if self.data_age_s > AGE_RED_S else "amber" if self.data_age_s > AGE_AMBER_S else "ok"

    def summary(self) -> dict:
        """One overview row: GPUs util/memory, jobs running/failed, alerts, link."""
        gpus = (self.status or {}).get("gpus") or []
        utils = [g.get("util") for g in gpus if g.get("util") is not None]
        used = sum(g.get("mem_used") or 0 for g in gpus)
        total = sum(g.get("mem_total") or 0 for g in gpus)
        jobs = (self.jobs or {}).get("jobs") or []
        failed = [j for j in jobs if j.get("state") in ("exited", "lost")
                  and (j.get("state") == "lost" or j.get("exit_code") not in (0, None))]
        return {"host": self.name, "ssh": self.ssh, "link": self.state, "data_age_s": self.data_age_s,
                "age_level": self.age_level, "error": self.error, "retry_in_s": self.retry_in_s,
                "gpus": len(gpus), "gpu_util": round(sum(utils) / len(utils), 1) if utils else None,
                "gpu_mem_used": used if gpus else None, "gpu_mem_total": total if gpus else None,
                "jobs_running": sum(1 for j in jobs if j.get("state") in ("starting", "running", "stopping")),
                "jobs_failed": len(failed),
                "alerts": sum(len(j.get("alerts") or []) for j in jobs),
                "simulated": bool((self.status or {}).get("simulated"))}


class _Poller:
    def __init__(self, spec: HostSpec, interval: float, poll_timeout: Optional[float] = None) -> None:
        self.spec = spec
        self.interval = interval
        # A poll unanswered this long marks the host STALE (the link may still claim to be up).
        self.poll_timeout = poll_timeout if poll_timeout is not None else max(interval * 5, 10.0)
        self.link = HostLink(spec)
        self.status = DeltaState(unpack_status)
        self.jobs = DeltaState()
        self.shown_status: Optional[dict] = None     # what faces show: the last full payloads
        self.shown_jobs: Optional[dict] = None
        self.jobs_error: Optional[str] = None
        self.poll_error: Optional[str] = None        # why the last poll gave no data (bad reply, no answer)
        self.poll_error_at = 0.0
        self.last_data: Optional[float] = None
        self.task: Optional[asyncio.Task] = None      # its run(), on the fleet's loop (set there)

    def _apply(self, state: DeltaState, reply: dict, kind: str) -> dict:
        """The payload after a delta reply, checked whole: a delta that does not apply is a bad reply too."""
        try:
            payload = state.apply(reply)
        except HostError:
            raise
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            raise bad_reply("poll", f"{kind}: the delta does not apply ({type(exc).__name__}: {exc})",
                            self.spec.name) from None
        return check_payload(kind, payload, op="poll", host=self.spec.name)

    async def run(self) -> None:
        self.link.start()
        while True:
            started = time.monotonic()
            try:
                # A delta only against a base we hold; after any failure, ask for the whole thing.
                reply = await self.link.call("poll", {"delta": self.status.value is not None,
                                                      "jobs_delta": self.jobs.value is not None},
                                             timeout=self.poll_timeout, wake=False)
                status = self._apply(self.status, reply["status"], "status")
                jobs = self._apply(self.jobs, reply["jobs"], "jobs") if "jobs" in reply else None
                self.shown_status = status
                if "jobs" in reply:
                    self.shown_jobs, self.jobs_error = jobs, None
                else:
                    self.jobs, self.shown_jobs, self.jobs_error = DeltaState(), None, reply.get("jobs_error")
                self.last_data = time.time()
                self.poll_error = None
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a poller that dies leaves its host frozen as it was
                # A bad reply, no answer in time, a dropped link, or a bug: the host says why, polling goes on.
                self.poll_error = str(exc) if isinstance(exc, (HostError, RemoteError)) else \
                    f"{self.spec.name}: poll failed: {type(exc).__name__}: {exc}"
                self.poll_error_at = time.time()
                self.status, self.jobs = DeltaState(unpack_status), DeltaState()
                # A box that answers garbage gets asked once per interval, not in a tight loop.
                await asyncio.sleep(self.interval if isinstance(exc, BadReply) else min(self.interval, 1.0))
                continue
            # Re-armed after each round, so rounds never overlap on a slow link.
            await asyncio.sleep(max(0.0, self.interval - (time.monotonic() - started)))

    def view(self) -> HostView:
        link = self.link
        now = time.time()
        age = None if self.last_data is None else max(0.0, now - self.last_data)
        state = link.state
        error = link.error
        if state == LIVE:
            # Only a failure of this link's current life counts (not the drop it came back from).
            failed = self.poll_error if self.poll_error is not None and self.poll_error_at >= link.since else None
            error = failed or self.jobs_error
            # The link is up but the data is not: late (no answer, a reply refused) or old.
            if failed is not None or (age is not None and age > max(STALE_AFTER_S, self.interval * 3)):
                state = STALE
        bytes_in, bytes_out = link.traffic()
        return HostView(
            name=self.spec.name, ssh=self.spec.ssh, state=state, data_age_s=age,
            error=error,
            retry_in_s=max(0.0, link.next_retry - now) if link.next_retry and state == DOWN else None,
            status=self.shown_status, jobs=self.shown_jobs,
            agent=dict(link.hello), bytes_in=bytes_in, bytes_out=bytes_out, connects=link.connects)


class Fleet:
    """Polls every watched remote host at `interval` on one background event loop; `views()` is instant.

    One host's dead link costs only its own task: each host has its own
    connection, timeouts and backoff, so the others (and the UI) never wait.

    The hosts polled may change while it runs, from any thread: `watch(spec)` adds a host (idempotent:
    a host already watched with the same spec keeps its poller, link and data; another spec under the
    same name, hosts.toml edited, replaces it), `unwatch(name)` drops one. Neither waits on the network:
    the poller starts or closes on the fleet's loop. `views()` lists a host from its `watch` until its
    `unwatch`; `close()` closes every link. One Fleet per process (the console's `app.fleet`) means one
    link and one poll a round per host, however many views show it.
    """

    def __init__(self, specs: Sequence[HostSpec] = (), interval: float = 1.0,
                 poll_timeout: Optional[float] = None) -> None:
        self.interval = interval
        self.poll_timeout = poll_timeout
        self._lock = threading.Lock()            # guards the watched set: watch/unwatch/views from any thread
        self._pollers: dict[str, _Poller] = {}
        self.specs: list[HostSpec] = []            # the watched hosts, in the order they were watched
        self.specs_by_name: dict[str, HostSpec] = {}
        self._loop = asyncio.new_event_loop()
        self._thread: Optional[threading.Thread] = None
        self._closed = False
        for spec in specs:
            if not spec.local:
                self.watch(spec)

    def start(self) -> "Fleet":
        if self._closed:
            raise RuntimeError("this fleet is closed")
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="gpudeck-fleet", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._spawn()
        self._loop.run_forever()

    def _spawn(self) -> None:
        """On the loop: a task for every watched poller that has none yet."""
        with self._lock:
            pollers = list(self._pollers.values())
        for poller in pollers:
            if poller.task is None:
                poller.task = self._loop.create_task(poller.run())

    async def _retire(self, poller: _Poller) -> None:
        """On the loop: a poller no longer watched stops and closes its link (a wedged one: bounded)."""
        task, poller.task = poller.task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        try:
            await asyncio.wait_for(poller.link.close(), 5)
        except Exception:  # noqa: BLE001 - closing never fails the caller
            pass

    def watch(self, spec: HostSpec) -> bool:
        """Poll `spec`'s host from now on (any thread, never blocks); True when a poller was added.

        Watching a host already watched with the same spec is a no-op (False): one poller per host."""
        if spec.local:
            raise ValueError(f"{spec.name}: this machine is not polled over SSH")
        with self._lock:
            if self._closed:
                raise RuntimeError("this fleet is closed")
            old = self._pollers.get(spec.name)
            if old is not None and old.spec == spec:
                return False
            self._pollers[spec.name] = _Poller(spec, self.interval, self.poll_timeout)
            self.specs = [s for s in self.specs if s.name != spec.name] + [spec]
            self.specs_by_name = {s.name: s for s in self.specs}
            running = self._thread is not None
        if running:
            self._loop.call_soon_threadsafe(self._spawn)
            if old is not None:
                asyncio.run_coroutine_threadsafe(self._retire(old), self._loop)
        return True

    def unwatch(self, name: str) -> Optional[concurrent.futures.Future]:
        """Stop polling host `name` (any thread, never blocks): gone from `views()` at once, its link
        closed on the loop (the returned future completes then). None when it was not watched."""
        with self._lock:
            poller = self._pollers.pop(name, None)
            if poller is None or self._closed:
                return None
            self.specs = [s for s in self.specs if s.name != name]
            self.specs_by_name = {s.name: s for s in self.specs}
            running = self._thread is not None
        if not running:
            return None
        return asyncio.run_coroutine_threadsafe(self._retire(poller), self._loop)

    def watching(self, name: str) -> bool:
        with self._lock:
            return name in self._pollers

    def view(self, name: str) -> Optional[HostView]:
        """The latest view of one watched host (None: not watched); never blocks on the network."""
        with self._lock:
            poller = self._pollers.get(name)
        return poller.view() if poller is not None else None

    def views(self) -> dict[str, HostView]:
        """The latest view of every watched remote host (never blocks on the network)."""
        with self._lock:
            pollers = list(self._pollers.items())
        return {name: poller.view() for name, poller in pollers}

    def call(self, host: str, op: str, params: Optional[dict] = None, timeout: float = 600.0,
             retry: bool = False, wake: bool = True) -> concurrent.futures.Future:
        """Send one request (an action) to a watched host; the returned future completes off the UI thread."""
        with self._lock:
            link = self._pollers[host].link
        return asyncio.run_coroutine_threadsafe(link.call(op, params, timeout=timeout, retry=retry, wake=wake), self._loop)

    def close(self) -> None:
        """Every poller stopped and its link closed (bounded: a wedged link must not block quitting)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pollers = list(self._pollers.values())
        if self._thread is None:
            return

        async def shutdown() -> None:
            # Wait for the pollers to finish cancelling: a loop stopped under them warns at exit.
            tasks = [p.task for p in pollers if p.task is not None]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await asyncio.gather(*(p.link.close() for p in pollers), return_exceptions=True)

        try:
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(timeout=5)
        except Exception:  # noqa: BLE001 - a wedged link must not block quitting
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._thread = None
