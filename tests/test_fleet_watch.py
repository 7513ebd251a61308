"""Fleet.watch / unwatch from another thread while the fleet runs (no SSH: pollers that only record)."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from gpudeck.jobs.hosts import fleet as fleet_mod
from gpudeck.jobs.hosts.config import HostSpec
from gpudeck.jobs.hosts.fleet import Fleet


@pytest.fixture
def recorded(monkeypatch):
    """Each poller's run() records its host and waits to be cancelled; a link close is recorded too."""
    events: list[tuple[str, str]] = []

    async def run(self) -> None:
        events.append(("run", self.spec.name))
        await asyncio.Event().wait()

    async def close(self) -> None:
        events.append(("close", self.spec.name))
    monkeypatch.setattr(fleet_mod._Poller, "run", run)
    monkeypatch.setattr(fleet_mod.HostLink, "close", close)
    return events


def until(predicate, what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def test_watch_is_idempotent_unwatch_closes_and_close_closes_all(recorded) -> None:
    a, b = HostSpec("a", ssh="a.example"), HostSpec("b", ssh="b.example")
    fleet = Fleet([a], interval=0.5).start()
    until(lambda: ("run", "a") in recorded, "a polled")
    # From other threads, at once: one poller for b however many ask.
    added: list[bool] = []
    threads = [threading.Thread(target=lambda: added.append(fleet.watch(b))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(added) == [False] * 7 + [True]
    assert sorted(fleet.views()) == ["a", "b"] and fleet.view("b").name == "b"
    until(lambda: recorded.count(("run", "b")) == 1, "b polled")
    assert not fleet.watch(a) and recorded.count(("run", "a")) == 1         # same spec: same poller

    # Another spec under a watched name replaces its poller (hosts.toml edited, read-only).
    assert fleet.watch(HostSpec("a", ssh="a.example", readonly=True))
    until(lambda: recorded.count(("run", "a")) == 2 and ("close", "a") in recorded, "a's poller replaced")
    assert fleet.specs_by_name["a"].readonly

    fleet.unwatch("b").result(5)
    assert sorted(fleet.views()) == ["a"] and fleet.view("b") is None and not fleet.watching("b")
    assert ("close", "b") in recorded and fleet.unwatch("b") is None
    with pytest.raises(KeyError):
        fleet.call("b", "ping")
    with pytest.raises(ValueError):
        fleet.watch(HostSpec("local"))

    fleet.close()
    assert recorded.count(("close", "a")) == 2 and fleet._thread is None
    with pytest.raises(RuntimeError):
        fleet.watch(b)
    fleet.close()                                                            # twice: nothing more


def test_a_host_watched_before_start_is_polled_from_start(recorded) -> None:
    fleet = Fleet([], interval=0.5)
    fleet.watch(HostSpec("a", ssh="a.example"))
    assert fleet.unwatch("a") is None and not fleet.views()                  # not started: nothing to close
    fleet.watch(HostSpec("a", ssh="a.example"))
    fleet.start()
    until(lambda: recorded == [("run", "a")], "a polled")
    fleet.close()
    assert recorded == [("run", "a"), ("close", "a")]
