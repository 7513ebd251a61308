"""The console's sampling thread: one sample at a time, each shown before the next, woken now, paused, stopped."""
from __future__ import annotations

import asyncio
import contextvars
import time

from gpudeck.console.sampling import SamplingThread

WHO = contextvars.ContextVar("who", default="nobody")


async def until(predicate, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def test_one_sample_at_a_time_shown_in_the_apps_context_woken_paused_and_stopped():
    async def main() -> None:
        taken: list[int] = []
        delivered: list[tuple[object, object, str]] = []
        paused = [False]

        def sample() -> int:
            taken.append(len(taken))
            if len(taken) == 3:
                raise OSError("NVML read failed")
            return taken[-1]

        WHO.set("the app")
        thread = SamplingThread(sample, lambda s, e: delivered.append((s, e, WHO.get())),
                                asyncio.get_running_loop(), contextvars.copy_context(),
                                refresh_s=lambda: 3600.0, paused=lambda: paused[0])
        WHO.set("someone else")
        thread.start()
        try:
            await until(lambda: delivered, "the first sample")
            # Shown on the loop, in the context it was given (widgets read the active app from there).
            assert delivered == [(0, None, "the app")]
            # Not shown yet: a wake does not start the next sample.
            thread.wake()
            await asyncio.sleep(0.3)
            assert taken == [0] and thread.busy
            # Shown: the pending wake samples at once (the refresh is an hour).
            thread.shown()
            await until(lambda: len(delivered) == 2, "the woken sample")
            # A failing source is delivered as an error, and the thread goes on.
            thread.shown()
            thread.wake()
            await until(lambda: len(delivered) == 3, "the failed sample")
            assert delivered[2][:2] == (None, "OSError: NVML read failed")
            # Paused: a wake takes nothing; resumed and woken, it samples.
            paused[0] = True
            thread.shown()
            thread.wake()
            await asyncio.sleep(0.3)
            assert len(taken) == 3
            paused[0] = False
            thread.wake()
            await until(lambda: len(delivered) == 4, "the sample after resuming")
            assert delivered[3][:2] == (3, None)
        finally:
            thread.stop(timeout=5.0)
        assert not thread._thread.is_alive()
        assert len(taken) == 4                 # stopping took no further sample

    asyncio.run(main())
