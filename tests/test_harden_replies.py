"""Issue harden 4: a malformed agent reply is refused at the boundary with one line; the fleet's poller survives it.

A compromised or spoofed box can answer anything. Before: a job entry that is not
an object killed the console (AttributeError in HostView.summary), GPU figures as
strings a TypeError, a status time of 1e300 an OverflowError in strftime; a poller
that met anything but HostError/RemoteError died, leaving its host LIVE forever.
"""
from __future__ import annotations

import asyncio
import copy
import time
from typing import Any, Optional

import pytest

from gpudeck.jobs.hosts.config import HostSpec
from gpudeck.jobs.hosts.fleet import _Poller
from gpudeck.jobs.hosts.protocol import pack_status
from gpudeck.jobs.hosts.replies import BadReply, check_payload, check_reply
from gpudeck.jobs.hosts.ssh import LIVE, STALE, HostError


def _status() -> dict:
    from gpudeck.jobs.telemetry.sampler import SimulatedSampler
    from gpudeck.jobs.telemetry.status import status_payload
    return status_payload(SimulatedSampler().sample())


def _job(name: str) -> dict:
    return {"name": name, "kind": "stage", "state": "running", "pid": 10, "run_id": "r1", "exit_code": None,
            "started_at": time.time() - 5, "gpus": [0], "alerts": []}


def _jobs(*entries: Any) -> dict:
    return {"jobs": list(entries), "pipelines": []}


def _poll(status: Optional[dict] = None, jobs: Optional[dict] = None) -> dict:
    return {"status": {"full": pack_status(status if status is not None else _status())},
            "jobs": {"full": jobs if jobs is not None else _jobs(_job("a"))}}


def _message(op: str, reply: Any) -> str:
    with pytest.raises(BadReply) as caught:
        check_reply(op, reply, "box")
    return str(caught.value)


def test_good_replies_pass_unchanged():
    reply = _poll()
    assert check_reply("poll", reply, "box") is reply
    assert check_reply("status", {"full": pack_status(_status())}) is not None
    assert check_reply("jobs", _jobs(_job("a"), _job("b")))
    assert check_reply("logs", {"run_id": "r1", "offset": 0, "next_offset": 4, "data": "YWJjZA==", "ended": False})
    assert check_reply("runs", {"runs": [{"run_id": "r1", "job": "a", "kind": "job", "failed": 1,
                                          "alerts": ["stall"], "started_at": time.time()}]})


def test_a_job_entry_that_is_not_an_object_is_named_in_one_line():
    payload = _jobs(_job("a"), _job("b"), _job("c"), "not a job")
    with pytest.raises(BadReply) as caught:
        check_payload("jobs", payload, op="poll", host="box")
    assert str(caught.value) == "box: bad reply to poll: jobs.jobs[3] is a str, not an object"
    assert "\n" not in str(caught.value)
    assert _message("jobs", payload) == "box: bad reply to jobs: jobs[3] is a str, not an object"


def test_gpu_figures_as_strings_and_absurd_numbers_are_refused():
    status = _status()
    status["gpus"][2]["util"] = "97%"
    assert _message("status", {"full": pack_status(status)}) == \
        "box: bad reply to status: full.gpus[2].util is a str, not a number"
    status = _status()
    status["time"] = 1e300
    assert "full.time is 1e+300, outside 0..1e+11" in _message("status", {"full": pack_status(status)})
    status = _status()
    status["host"]["mem_total"] = float("nan")
    assert "not a finite number" in _message("status", {"full": pack_status(status)})
    packed = pack_status(_status())
    packed["host"]["cpu_per_core"] = "0A!"                   # "!" is no level of the wire's 64
    assert "full does not unpack (ValueError" in _message("status", {"full": packed})
    packed = pack_status(_status())
    packed["gpus"]["c"]["util"] = packed["gpus"]["c"]["util"][:1]
    assert "full.gpus.c.util has 1 values for 8 rows" in _message("status", {"full": packed})
    assert "run_id is missing" in _message("start", {})
    assert "runs[0] is a list, not an object" in _message("runs", {"runs": [[1, 2]]})
    assert "runs.runs" not in _message("runs", {"runs": [[1, 2]]})
    assert "report.phases[0].phase is missing" in _message("postmortem", {"report": {"phases": [{}]}})
    # A stack dump's excerpt and a stall's verdict are checked too: a bad one is named, not met by the screen.
    assert "report.stacks[0].lines is a number, not a list" in _message(
        "postmortem", {"report": {"stacks": [{"code": "stalled", "lines": 5}]}})
    assert "report.stalls[0].stacks" in _message(
        "postmortem", {"report": {"stalls": [{"code": "stalled", "stacks": ["not", "text"]}]}})
    assert check_reply("postmortem", {"report": {"stalls": [{"code": "stalled", "stacks": "waiting in recv",
                                                             "stacks_at_s": 57.0}],
                                                 "stacks": [{"code": "stalled", "at_s": 57.0, "verdict": "waiting",
                                                             "lines": ["12x recv"], "lines_left_out": 0}]}})
    assert "data is not base64" in _message("logs", {"run_id": "r", "next_offset": 1, "data": "!!!!"})
    deep: Any = []
    for _ in range(100):
        deep = [deep]
    assert "deeper" in _message("pivot_plan", {"lines": deep})
    assert "a str of" in _message("check", {"path": "x" * (1 << 20)})
    assert _message("poll", ["status"]) == "box: bad reply to poll: the reply is a list, not an object"


class FakeLink:
    """A HostLink as the poller sees it: LIVE, answering each poll with the next of `replies`."""

    def __init__(self, replies: list) -> None:
        self.replies = replies
        self.state, self.error, self.since = LIVE, None, time.time() - 1
        self.hello: dict = {"via": "fake"}
        self.next_retry, self.connects, self.polls = None, 1, 0

    def start(self) -> None:
        pass

    def traffic(self) -> tuple[int, int]:
        return 0, 0

    async def call(self, op: str, params: Any = None, timeout: Optional[float] = None, **_: Any) -> Any:
        self.polls += 1
        reply = self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]
        if reply == "silent":
            await asyncio.sleep(timeout or 0)
            raise HostError(f"box: no answer to {op} within {timeout:g} s")
        return copy.deepcopy(reply)          # unchecked: the poller must guard itself


def _poller(replies: list, poll_timeout: Optional[float] = None) -> _Poller:
    poller = _Poller(HostSpec(name="box", ssh="box"), 0.05)
    if poll_timeout is not None:
        poller.poll_timeout = poll_timeout
    poller.link = FakeLink(replies)  # type: ignore[assignment]
    return poller


async def _run(poller: _Poller, until, timeout: float = 5.0) -> None:
    task = asyncio.get_running_loop().create_task(poller.run())
    try:
        deadline = time.monotonic() + timeout
        while not until():
            assert not task.done(), f"the poller died: {task.exception()!r}"
            assert time.monotonic() < deadline, f"timed out; view {poller.view()!r}"
            await asyncio.sleep(0.02)
        assert not task.done(), f"the poller died: {task.exception()!r}"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_the_poller_marks_a_host_that_answers_garbage_and_recovers_when_it_stops():
    good = _poll()
    bad_job = _poll(jobs=_jobs(_job("a"), _job("b"), _job("c"), "not a job"))
    gpu_text = _status()
    gpu_text["gpus"][0]["util"] = "97%"
    bad_gpu = _poll(status=gpu_text)
    late = _status()
    late["time"] = 1e300
    bad_time = _poll(status=late)

    async def scenario() -> None:
        poller = _poller([good, bad_job, bad_job, bad_job])
        await _run(poller, lambda: poller.link.polls >= 4)
        view = poller.view()
        assert view.state == STALE
        assert view.error == "box: bad reply to poll: jobs.jobs[3] is a str, not an object"
        view.summary()                                   # the faces' row never meets the bad entry
        assert [j["name"] for j in view.jobs["jobs"]] == ["a"]    # the last good data, with its age
        for bad, words in ((bad_gpu, "status.gpus[0].util is a str, not a number"),
                           (bad_time, "status.time is 1e+300")):
            poller = _poller([bad, bad, good])
            await _run(poller, lambda: poller.poll_error is not None)
            assert words in poller.view().error and poller.view().state == STALE
            assert poller.view().status is None          # nothing bad was kept to draw
            await _run(poller, lambda: poller.view().state == LIVE)
            assert poller.view().error is None and poller.view().status["gpus"]

    asyncio.run(scenario())


def test_a_poller_survives_an_unexpected_exception():
    async def scenario() -> None:
        poller = _poller([_poll()])

        async def broken(*a: Any, **k: Any) -> Any:
            poller.link.polls += 1
            raise RuntimeError("a bug on this side")
        poller.link.call = broken  # type: ignore[method-assign]
        await _run(poller, lambda: poller.link.polls >= 3)
        view = poller.view()
        assert view.state == STALE and view.error == "box: poll failed: RuntimeError: a bug on this side"

    asyncio.run(scenario())


def test_a_first_poll_never_answered_ends_stale_by_its_timeout():
    async def scenario() -> None:
        poller = _poller(["silent"], poll_timeout=0.3)
        t0 = time.monotonic()
        assert poller.view().state == LIVE and poller.view().status is None
        await _run(poller, lambda: poller.view().state != LIVE, timeout=3)
        assert time.monotonic() - t0 < 2
        view = poller.view()
        assert view.state == STALE and view.error == "box: no answer to poll within 0.3 s"
        assert view.summary()["link"] == STALE

    asyncio.run(scenario())


def test_a_delta_that_does_not_apply_is_a_bad_reply():
    async def scenario() -> None:
        poller = _poller([_poll(), {"status": {"delta": {"d": {"gpus": {"l": {"99": 1}, "n": 1}}}},
                                    "jobs": {"delta": None}}])
        await _run(poller, lambda: poller.poll_error is not None)
        assert "bad reply to poll: status: the delta does not apply" in poller.view().error

    asyncio.run(scenario())


# -- a reply nested past any honest writer (stop 26: json.loads raised RecursionError in the link's reader,
#    which died without closing the channel, so every later call only timed out) ------------------------

DEEP = b"[" * 200_000 + b"]" * 200_000


def test_a_deeply_nested_agent_line_is_refused_as_a_bad_line_not_a_recursion_error():
    from gpudeck.jobs.hosts.protocol import decode
    for line in (DEEP, b'{"id": 1, "ok": true, "result": ' + DEEP + b"}", DEEP.decode()):
        with pytest.raises(ValueError, match="nests"):
            decode(line)
    assert decode(b'{"id": 1, "ok": true, "result": [[[1]]]}')["result"] == [[[1]]]


class _FakeProcess:
    """An agent process whose stdout is fed by the test, as asyncssh's SSHClientProcess reads."""

    def __init__(self) -> None:
        self.lines: asyncio.Queue = asyncio.Queue()
        self.sent: list[bytes] = []
        self.stdout = self
        self.stdin = self

    async def readline(self) -> bytes:
        return await self.lines.get()

    def write(self, data: bytes) -> None:
        self.sent.append(data)


def test_the_link_reader_survives_a_deeply_nested_reply_and_delivers_the_next_good_one():
    from gpudeck.jobs.hosts.ssh import AgentChannel

    async def scenario() -> Any:
        process = _FakeProcess()
        channel = AgentChannel(HostSpec(name="box", ssh="box"), conn=None, process=process, hello={})
        call = asyncio.ensure_future(channel.call("ping", timeout=5.0))
        await asyncio.sleep(0)
        await process.lines.put(b'{"id": 1, "ok": true, "result": ' + DEEP + b"}\n")
        await process.lines.put(b'{"id": 1, "ok": true, "result": "pong"}\n')
        result = await call
        assert not channel.closed
        channel._reader.cancel()
        return result

    assert asyncio.run(scenario()) == "pong"
