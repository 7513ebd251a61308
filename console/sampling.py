"""The console's sampling thread: one sample at a time off the UI thread, each shown before the next is taken."""
from __future__ import annotations

import asyncio
import contextvars
import threading
from typing import Any, Callable, Optional


class SamplingThread:
    """Samples every `refresh_s()` seconds and hands each result to the UI loop with one callback.

    A tick used to be an executor job awaited by an asyncio task (a thread-pool submit, a future
    chained back, the task resumed twice, a timer to wake it): ~0.25 ms of the UI thread's ~1.8 ms
    a tick on a slow core. Here the thread waits itself, and the UI thread runs only `deliver`.

    `deliver(snapshot, error)` runs on the loop in `context` (the app's: widgets read the active app
    from it); the next sample is taken only after `shown()` says the last one was shown, so a slow
    source or a busy UI never stacks ticks up. `wake()` samples now (or right after the sample under
    way); while `paused()` it only waits for a wake. `set_sample()` swaps the source (another box): a
    sample of the old source still under way is dropped, never shown as the new one's.
    """

    def __init__(self, sample: Callable[[], Any], deliver: Callable[[Any, Optional[str]], None],
                 loop: asyncio.AbstractEventLoop, context: contextvars.Context,
                 refresh_s: Callable[[], float], paused: Callable[[], bool]) -> None:
        self._sample, self._deliver, self._loop, self._context = sample, deliver, loop, context
        self._refresh_s, self._paused = refresh_s, paused
        self._wake = threading.Event()
        self._shown = threading.Event()
        self._stop = threading.Event()
        self.busy = False                  # a sample is being taken or waits to be shown
        self._generation = 0               # bumped by set_sample: a result of an older source is dropped
        self._thread = threading.Thread(target=self._run, name="gpudeck-sampling", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def set_sample(self, sample: Callable[[], Any]) -> None:
        """Sample `sample` from now on (a sample of the old one under way is not delivered); samples now."""
        self._sample = sample
        self._generation += 1
        self._wake.set()

    def shown(self) -> None:
        self._shown.set()

    def stop(self, timeout: float = 5.0) -> None:
        """Take no more samples; wait (up to `timeout`) for one under way, so the sampler can be closed."""
        self._stop.set()
        self._wake.set()
        self._shown.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._paused():
                self._wake.wait()
                self._wake.clear()
                continue
            self._wake.clear()
            self.busy = True
            generation = self._generation
            try:
                snapshot, error = self._sample(), None
            except Exception as exc:  # noqa: BLE001 - a broken source shows as stale data, never ends the app
                # An exception that is its own sentence (a box's link state) is shown as written.
                snapshot, error = None, str(exc) if getattr(exc, "plain", False) else f"{type(exc).__name__}: {exc}"
            if self._stop.is_set():
                return
            if generation != self._generation:
                self.busy = False
                continue                   # taken from the source set_sample replaced: not this box's
            self._shown.clear()
            try:
                self._loop.call_soon_threadsafe(self._deliver, snapshot, error, context=self._context)
            except RuntimeError:           # the loop is closed: the app is gone
                return
            self._shown.wait()
            self.busy = False
            if self._wake.is_set() or self._paused():
                continue
            self._wake.wait(self._refresh_s())
