"""The headless jobs watcher on real jobs, and the jobs view fed through the app's jobs feed by a non-live source."""
from __future__ import annotations

import json
import time

from gpudeck.jobs.spec import load_jobs
from gpudeck.jobs.supervisor import Supervisor
from gpudeck.jobs.view import JobsSnapshot
from gpudeck.jobs.watch import NO_JOBS_FILE, JobsWatcher
from runsupport import pilot_test, pilot_wait_for, wait_for, write_jobs


def test_watcher_says_why_there_are_no_jobs_and_picks_up_a_file_created_later(tmp_path, state, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    watcher = JobsWatcher(None)
    assert watcher.poll().reason == NO_JOBS_FILE
    write_jobs(tmp_path / "jobs.toml", {"a": {"cmd": "true"}})
    snapshot = watcher.poll()
    assert snapshot.reason is None and [j.name for j in snapshot.jobs] == ["a"]
    (tmp_path / "broken.toml").write_text("[jobs.x]\ncmd = 3\n")
    assert "gpudeck check" in JobsWatcher(str(tmp_path / "broken.toml")).poll().reason


def test_watcher_snapshots_a_real_job_and_round_trips_through_json(tmp_path, state):
    jobs = write_jobs(tmp_path / "jobs.toml", {"printer": {"cmd": "echo hello; sleep 300"},
                                                "idle": {"cmd": "true"}})
    Supervisor(load_jobs(jobs)).start("printer")
    watcher = JobsWatcher(str(jobs), discover=False)
    snapshot = wait_for(lambda: (s := watcher.poll()) and s.jobs[0].state == "running" and s, what="printer running")
    printer = snapshot.jobs[0]
    assert printer.name == "printer" and printer.pid and printer.run_id
    assert snapshot.log_paths["printer"].endswith("output.log") and "idle" not in snapshot.log_paths
    assert [j.state for j in snapshot.jobs] == ["running", "idle"]
    again = JobsSnapshot.from_dict(json.loads(json.dumps(snapshot.to_dict())))
    assert again == snapshot
    assert [j.cells(time.time()) for j in again.jobs] == [j.cells(time.time()) for j in snapshot.jobs]


class RecordedSource:
    """A source that is not live: publishes recorded snapshots, one per `poll_now()` (as a replay would)."""

    supervisor = None

    def __init__(self, snapshots: list[JobsSnapshot]) -> None:
        self.snapshots = list(snapshots)
        self.feed = None

    def start(self, feed, host) -> None:
        self.feed = feed
        self.poll_now()

    def poll_now(self) -> None:
        if self.snapshots:
            self.feed.publish(self.snapshots.pop(0))


@pilot_test
async def test_the_jobs_view_shows_whatever_source_feeds_the_apps_jobs_feed() -> None:
    from gpudeck.console.app import make_app
    from gpudeck.console.feeds import JobsFeed
    from gpudeck.console.screens.jobs import JobsScreen
    from gpudeck.jobs.telemetry.sampler import make_sampler
    t0 = 1_767_000_000.0
    record = {"name": "train", "kind": "train", "state": "running", "pid": 11, "run_id": "r1",
              "started_at": t0 - 60, "phase": "training", "progress": {"done": 10, "total": 100, "eta_s": 600}}
    frames = [JobsSnapshot.from_payload({"jobs": [record]}, t0),
              JobsSnapshot.from_payload({"jobs": [dict(record, state="exited", exit_code=1, ended_at=t0 + 5,
                                                       alerts=[{"code": "crashed", "message": "oom"}])]}, t0 + 5)]
    source = RecordedSource([JobsSnapshot.from_dict(f.to_dict()) for f in frames])
    app = make_app(sampler=make_sampler(demo=True), start_sampling=False)
    app.jobs_feed = JobsFeed(app, source)
    async with app.run_test(size=(120, 30)) as pilot:
        await pilot.press("2")
        screen = await pilot_wait_for(pilot, lambda: isinstance(app.screen, JobsScreen) and app.screen.refreshes
                                      and app.screen, "the first frame shown")
        table = screen.query_one("#jobs-table")
        row = lambda: " ".join(c.plain for c in table.get_row_at(0))  # noqa: E731
        assert "running" in row() and "10/100 10% ETA 10m00s" in row()
        source.poll_now()
        await pilot_wait_for(pilot, lambda: "exited" in row(), "the second frame shown", detail=row)
        assert screen.jobs[0].health == "failed"
        assert "train: crashed" in str(screen.query_one("#jobs-banner").render())
        await pilot.press("s")                  # a source without a supervisor is read-only: a notice, no crash
        assert app.is_running


@pilot_test
async def test_live_polling_survives_a_watcher_that_raises() -> None:
    from textual.app import App

    from gpudeck.console.feeds import JobsFeed, LiveJobsSource

    class Flaky(JobsWatcher):
        calls = 0

        def poll(self) -> JobsSnapshot:
            Flaky.calls += 1
            if Flaky.calls == 2:
                raise RuntimeError("disk vanished")
            return JobsSnapshot.from_payload({"jobs": [{"name": "a", "state": "idle"}]}, time.time())

    seen: list[JobsSnapshot] = []

    class Host(App):
        def on_mount(self) -> None:
            self.source = LiveJobsSource(Flaky(supervisor=object()), 0.05)
            self.feed = JobsFeed(self, self.source)
            self.source.start(self.feed, self)
            self.feed.signal.subscribe(self, seen.append, immediate=True)

    app = Host()
    async with app.run_test() as pilot:
        await pilot_wait_for(pilot, lambda: app.source.polls >= 4, "polls after the failure")
    errors = [s.error for s in seen if s.error]
    assert errors and "disk vanished" in errors[0]
    assert all([j.name for j in s.jobs] == ["a"] for s in seen)     # the failed poll kept the last jobs
