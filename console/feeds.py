"""The console's push paths: a Feed is a Textual Signal plus its latest value; widgets follow it.

The app owns three: `telemetry_feed` (a TelemetryView after every sampling tick), `jobs_feed`
(a JobsSnapshot from a jobs source) and `box_feed` (the Box every view shows, after a switch). A source is anything that calls `feed.publish(snapshot)` on
the UI thread: `LiveJobsSource` polls the core's JobsWatcher off the UI thread; a replay source
publishes recorded snapshots through exactly the same path, so the views cannot tell them apart.
"""
from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Callable, Generic, Optional, Protocol, TypeVar, Union

from textual.dom import DOMNode
from textual.signal import Signal
from textual.timer import Timer
from textual.widget import Widget

from gpudeck.jobs.view import JobsSnapshot
from gpudeck.jobs.watch import JobsWatcher

if TYPE_CHECKING:
    from gpudeck.console.telemetry_view import TelemetryView
    from gpudeck.jobs.box import Box
    from gpudeck.jobs.supervisor import Supervisor

T = TypeVar("T")


class Feed(Generic[T]):
    """A Signal that remembers its last value, so a widget mounted later starts from it."""

    def __init__(self, owner: DOMNode, name: str) -> None:
        self.signal: Signal[T] = Signal(owner, name)
        self.latest: Optional[T] = None

    def publish(self, value: T) -> None:
        """UI thread only. Subscribers that are gone (or not yet mounted) are not called: the Signal
        skips nodes that are not running and attached, and publishes nothing while its owner starts
        or shuts down."""
        self.latest = value
        self.signal.publish(value)

    def follow(self, node: Widget, callback: Callable[[T], object], *, while_hidden: bool = False) -> None:
        """Call `callback(value)` now (if there is a value) and on every publish, from `node`'s on_mount.

        A widget on a screen that is not shown skips the work (unless `while_hidden`) and catches up
        with the latest value when its screen is shown again.
        """
        missed = False

        def deliver(value: T) -> None:
            nonlocal missed
            if while_hidden or node.screen.is_current:
                missed = False
                callback(value)
            else:
                missed = True

        def shown(_screen: object) -> None:
            if missed and self.latest is not None and node.screen.is_current:
                deliver(self.latest)

        self.signal.subscribe(node, deliver, immediate=True)
        if not while_hidden:
            node.app.screen_change_signal.subscribe(node, shown)
        if self.latest is not None:
            callback(self.latest)


class JobsSource(Protocol):
    """What feeds the jobs view: live polling or a replay."""

    @property
    def supervisor(self) -> Optional[Supervisor]: ...   # the local jobs file's, once loaded; None otherwise

    # A live source may also have `box`: the Box its jobs are on (what the jobs view acts through).

    def start(self, feed: "JobsFeed", host: DOMNode) -> None: ...   # begin publishing to `feed`

    def stop(self) -> None: ...               # publish nothing more (the feed switched source)

    def poll_now(self) -> None: ...           # an action changed something: publish soon


class JobsFeed(Feed[JobsSnapshot]):
    """Job snapshots, from one source that starts when the first view follows the feed."""

    def __init__(self, owner: DOMNode, source: JobsSource) -> None:
        super().__init__(owner, "jobs")
        self.owner = owner
        self.source = source
        self._started = False

    def follow(self, node: Widget, callback: Callable[[JobsSnapshot], object], *, while_hidden: bool = False) -> None:
        super().follow(node, callback, while_hidden=while_hidden)
        if not self._started:
            # Nobody polls jobs until a view shows them: the dashboard alone costs no job polling.
            self._started = True
            self.source.start(self, self.owner)

    @property
    def supervisor(self) -> Optional[Supervisor]:
        return self.source.supervisor

    def poll_now(self) -> None:
        self.source.poll_now()

    def switch(self, source: JobsSource) -> JobsSource:
        """Feed from `source` from now on (live -> replay and back); returns the one it replaces, stopped."""
        old, self.source = self.source, source
        old.stop()
        if self._started:
            source.start(self, self.owner)
        return old


class RearmedSource:
    """The lifecycle every jobs source shares: `_take()` runs in a thread worker, its snapshot is
    published on the UI thread, and the next run is armed `_next_delay()` after that (re-armed after
    each publish, so a slow run never stacks runs up; None: wait for poll_now). A poll_now while a
    run is out is served right after it; once stopped, nothing more is published."""

    worker_group = "jobs-source"

    def __init__(self) -> None:
        self._feed: Optional[JobsFeed] = None
        self._host: Optional[DOMNode] = None
        self._timer: Optional[Timer] = None
        self._busy = False
        self._again = False
        self._stopped = False

    def start(self, feed: JobsFeed, host: DOMNode) -> None:
        self._feed, self._host = feed, host
        self._stopped = False
        self._starting()
        self._run()

    def stop(self) -> None:
        self._stopped = True
        if self._timer is not None:
            self._timer.stop()
            self._timer = None

    def poll_now(self) -> None:
        if self._host is None or self._stopped:
            return
        if self._busy:
            self._again = True               # the run under way may predate the change
            return
        self._run()

    # -- what a source defines ----------------------------------------------------------------------
    def _starting(self) -> None:
        """UI thread, before the first run of a start()."""

    def _before_run(self) -> None:
        """UI thread, before each run."""

    def _take(self) -> JobsSnapshot:
        """Worker thread: the snapshot to publish; failures become a snapshot that says so."""
        raise NotImplementedError

    def _published(self, snapshot: JobsSnapshot) -> None:
        """UI thread, after the feed got `snapshot`."""

    def _next_delay(self) -> Optional[float]:
        raise NotImplementedError

    # -- the cycle ----------------------------------------------------------------------------------
    def _bound(self) -> tuple[JobsFeed, DOMNode]:
        """The feed and host of the last start(): a source only runs after one."""
        if self._feed is None or self._host is None:
            raise RuntimeError(f"{type(self).__name__} runs only after start()")
        return self._feed, self._host

    def _run(self) -> None:
        _, host = self._bound()
        if self._timer is not None:
            self._timer.stop()
            self._timer = None
        self._before_run()
        self._busy = True
        host.run_worker(self._work, thread=True, group=self.worker_group, exit_on_error=False)

    def _work(self) -> None:
        _, host = self._bound()
        snapshot = self._take()
        # call_later is thread-safe and never blocks; it is dropped once the host has closed.
        host.call_later(self._publish, snapshot)

    def _publish(self, snapshot: JobsSnapshot) -> None:
        self._busy = False
        if self._stopped:
            return                           # a run that was out when the feed switched away
        feed, host = self._bound()
        feed.publish(snapshot)
        self._published(snapshot)
        if self._again:
            self._again = False
            self._run()
            return
        delay = self._next_delay()
        if delay is not None:
            self._timer = host.set_timer(delay, self._run, name=self.worker_group)


class LiveJobsSource(RearmedSource):
    """Polls a JobsWatcher in a thread worker, then again `refresh_s` after each poll completes;
    each snapshot is published on the UI thread."""

    worker_group = "jobs-poll"

    def __init__(self, watcher: JobsWatcher, refresh_s: Union[float, Callable[[], float]],
                 box: Optional[Box] = None) -> None:
        super().__init__()
        self.watcher = watcher
        self.box = box                       # the LocalBox these jobs are on (None: the view makes its own)
        self._refresh_s = refresh_s
        self.polls = 0                       # polls published (tests wait on it)

    @property
    def supervisor(self) -> Optional[Supervisor]:
        return self.watcher.supervisor

    @property
    def refresh_s(self) -> float:
        return self._refresh_s() if callable(self._refresh_s) else self._refresh_s

    def _take(self) -> JobsSnapshot:
        try:
            return self.watcher.poll()
        except Exception as exc:             # the watcher reports failures itself; this keeps polling alive
            last = self._feed.latest if self._feed is not None else None
            error = f"{type(exc).__name__}: {exc}"
            return (dataclasses.replace(last, taken_at=time.time(), error=error) if last is not None
                    else JobsSnapshot(taken_at=time.time(), error=error))

    def _published(self, snapshot: JobsSnapshot) -> None:
        self.polls += 1

    def _next_delay(self) -> Optional[float]:
        return self.refresh_s


class FollowsTelemetry:
    """Mixin for a widget with `apply_telemetry(view)`: it follows the app's telemetry feed from its mount.

    (Textual calls every class's own on_mount along the MRO, so a widget may still define its own.)
    In an app without a telemetry feed (a test app) the widget is driven by direct calls instead.
    """

    if TYPE_CHECKING:
        def apply_telemetry(self, view: TelemetryView) -> None: ...

    def on_mount(self) -> None:
        assert isinstance(self, Widget), "FollowsTelemetry is a mixin for widgets"
        feed = getattr(self.app, "telemetry_feed", None)
        if isinstance(feed, Feed):
            feed.follow(self, self.apply_telemetry)
