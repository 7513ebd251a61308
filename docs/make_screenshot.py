"""Regenerates docs/screenshot.svg: the dashboard on the SIMULATED box, deterministic (seed 0, fixed clock, UTC).

    .venv/bin/python docs/make_screenshot.py [--size 120x36] [--theme gpudeck-dark]
    .venv/bin/python docs/make_screenshot.py --replay      # docs/replay.svg: the jobs view replaying the demo runs
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpudeck.jobs.telemetry.history import History  # noqa: E402
from gpudeck.jobs.telemetry.sampler import make_sampler  # noqa: E402

from gpudeck.console.app import make_app  # noqa: E402
from gpudeck.console.messages import SamplesCollected  # noqa: E402

EPOCH = 1_800_000_000
TICKS = 120   # two minutes of history: full sparklines


async def shoot(width: int, height: int, theme: str, out: Path) -> None:
    clock = iter(range(EPOCH, EPOCH + 10 * TICKS)).__next__
    sampler = make_sampler(demo=True, seed=0, clock=lambda: float(clock()))
    app = make_app(sampler=sampler, theme=theme, history=History(), start_sampling=False)
    async with app.run_test(size=(width, height)) as pilot:
        for _ in range(TICKS):
            app.post_message(SamplesCollected(sampler.sample()))
        await pilot.pause()
        await pilot.pause()
        out.write_text(app.export_screenshot(title="gpudeck --demo"), encoding="utf-8")


async def shoot_replay(width: int, height: int, theme: str, out: Path) -> None:
    """The jobs view 70 s into `--demo`'s recordings, paused, the build's log open."""
    from gpudeck.console.feeds import JobsFeed
    from gpudeck.console.replay import ReplayJobsSource
    from gpudeck.jobs.replay import demo_session
    clock = iter(range(EPOCH + 70, EPOCH + 70 + 10 * TICKS)).__next__
    sampler = make_sampler(demo=True, seed=0, clock=lambda: float(clock()))
    app = make_app(sampler=sampler, theme=theme, history=History(), start_sampling=False)
    session = demo_session(loop=False)
    session.seek_to(session.start + 70)
    session.paused = True
    source = ReplayJobsSource(session)
    app.jobs_feed = JobsFeed(app, source)
    async with app.run_test(size=(width, height)) as pilot:
        for _ in range(3):
            app.post_message(SamplesCollected(sampler.sample()))
        await pilot.press("2")
        while not source.frames:
            await pilot.pause(0.05)
        await pilot.press("enter")
        pane = app.screen.query_one("#log-pane")
        while pane.line_count < 40:
            await pilot.pause(0.05)
        app.screen.query_one("#jobs-table").focus()
        await pilot.pause()
        await pilot.pause()
        out.write_text(app.export_screenshot(title="gpudeck --demo · jobs view replaying"), encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="120x36")
    parser.add_argument("--theme", default="gpudeck-dark")
    parser.add_argument("--out", default=None)
    parser.add_argument("--replay", action="store_true", help="the jobs view replaying the demo runs instead")
    args = parser.parse_args()
    os.environ["TZ"] = "UTC"
    time.tzset()
    width, height = (int(v) for v in args.size.lower().split("x"))
    args.out = args.out or str(REPO / "docs" / ("replay.svg" if args.replay else "screenshot.svg"))
    asyncio.run((shoot_replay if args.replay else shoot)(width, height, args.theme, Path(args.out)))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
