"""Webhook delivery against a REAL HTTP server on 127.0.0.1: retries, timeouts, each format's body, redaction."""
from __future__ import annotations

import base64
import json
import time

import pytest

from gpudeck.jobs import notify
from notifysupport import Receiver, free_closed_port, target

ALERT = {"code": "stalled", "since": 1764600000.0, "t": 1764600003.5, "severity": "error", "job": "sglang",
         "run_id": "20261201-120000-000ab", "message": "alive, GPUs idle, log silent for 10m <@here> & \x1b[31mred",
         "hint": None}


@pytest.fixture
def no_proxy(monkeypatch):
    # urllib honours *_proxy: the receiver is on loopback, reached directly.
    for key in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(key, raising=False)


@pytest.fixture
def receiver(request, no_proxy):
    answers = getattr(request, "param", [200])
    server = Receiver(answers)
    yield server
    server.close()


def run_delivery(tgt: dict, alert: dict = ALERT) -> tuple[bool, list[dict]]:
    events: list[dict] = []
    ok = notify.deliver(tgt, alert, "gpu-box-1", events.append)
    return ok, events


@pytest.mark.parametrize("receiver", [[500, 500, 200]], indirect=True)
def test_two_500s_then_200_is_delivered_on_the_third_try_with_backoff(receiver):
    ok, events = run_delivery(target(receiver.url(), retries=3))
    assert ok
    assert [e["event"] for e in events] == ["NotifyFailed", "NotifyFailed", "NotifyDelivered"]
    assert [e["attempt"] for e in events] == [1, 2, 3]
    assert [e.get("status") for e in events] == [500, 500, 200]
    assert [e.get("retry_in_s") for e in events[:2]] == [1.0, 2.0]
    assert all(e["attempts"] == 4 and e["target"] == "hook" and e["code"] == "stalled" for e in events)
    got = receiver.requests()
    assert len(got) == 3
    # The server saw the waits: 1 s, then 2 s.
    assert got[1]["at"] - got[0]["at"] >= 0.95 and got[2]["at"] - got[1]["at"] >= 1.95
    assert len({r["body"] for r in got}) == 1            # the same body each time


@pytest.mark.parametrize("receiver", [["hang"]], indirect=True)
def test_a_server_that_never_answers_times_out_within_its_bound(receiver):
    t0 = time.monotonic()
    ok, events = run_delivery(target(receiver.url(), timeout_s=1, retries=1))
    took = time.monotonic() - t0
    assert not ok
    # two attempts of 1 s and one wait of 1 s: the bound is 3 s
    assert took < 3 + 1.0, took
    assert [e["event"] for e in events] == ["NotifyFailed", "NotifyFailed"]
    assert all(e["error"] == "no answer within 1 s" for e in events), events
    assert events[-1]["final"] and not events[0]["final"]
    assert len(receiver.requests()) == 2


@pytest.mark.parametrize("receiver", [[403]], indirect=True)
def test_a_refused_token_is_not_retried(receiver):
    ok, events = run_delivery(target(receiver.url(), retries=3))
    assert not ok and len(events) == 1
    assert events[0]["status"] == 403 and events[0]["final"] and len(receiver.requests()) == 1


def test_nothing_listening_is_an_error_recorded_with_the_url_redacted(no_proxy):
    url = f"http://127.0.0.1:{free_closed_port()}/hooks/SECRET-TOKEN"
    ok, events = run_delivery(target(url, retries=1))
    assert not ok and len(events) == 2
    assert "refused" in events[0]["error"].lower()
    assert events[0]["url"] == f"http://127.0.0.1:{url.split(':')[2].split('/')[0]}/…"
    assert "SECRET-TOKEN" not in json.dumps(events)


@pytest.mark.parametrize("receiver", [[301]], indirect=True)
def test_a_redirect_is_reported_not_followed(receiver):
    ok, events = run_delivery(target(receiver.url(), retries=0))
    assert not ok and events[0]["status"] == 301 and len(receiver.requests()) == 1


def test_json_body(receiver):
    assert run_delivery(target(receiver.url(), "json"))[0]
    req = receiver.requests()[0]
    assert req["path"] == "/hook/T0K3N-s3cr3t?key=also-secret"
    assert req["headers"]["content-type"] == "application/json"
    body = json.loads(req["body"])
    assert {k: body[k] for k in ("job", "run", "host", "code", "severity", "time")} == {
        "job": "sglang", "run": "20261201-120000-000ab", "host": "gpu-box-1", "code": "stalled",
        "severity": "error", "time": "2025-12-01T14:40:03Z"}
    assert body["message"].startswith("alive, GPUs idle") and "\x1b" not in body["message"]


def test_slack_body_escapes_markup(receiver):
    assert run_delivery(target(receiver.url(), "slack"))[0]
    body = json.loads(receiver.requests()[0]["body"])
    assert list(body) == ["text"]
    assert "sglang" in body["text"] and "stalled" in body["text"] and "gpu-box-1" in body["text"]
    assert "&lt;@here&gt; &amp;" in body["text"] and "<@here>" not in body["text"] and "\x1b" not in body["text"]


def test_discord_body_pings_nobody(receiver):
    alert = {**ALERT, "message": "@everyone " + "x" * 5000}
    assert run_delivery(target(receiver.url(), "discord"), alert)[0]
    body = json.loads(receiver.requests()[0]["body"])
    assert set(body) == {"content", "allowed_mentions"} and body["allowed_mentions"] == {"parse": []}
    assert "stalled" in body["content"] and len(body["content"]) <= 2000


def test_ntfy_body_is_plain_text_with_title_priority_and_tags(receiver):
    alert = {**ALERT, "job": "träin", "severity": "warning", "code": "oom_risk"}
    assert run_delivery(target(receiver.url(), "ntfy"), alert)[0]
    req = receiver.requests()[0]
    h = req["headers"]
    assert h["content-type"].startswith("text/plain")
    assert req["body"].decode().startswith("alive, GPUs idle, log silent for 10m <@here> &")
    assert h["priority"] == "default" and h["tags"] == "warning,gpudeck,oom_risk"
    # non-ASCII in a header: RFC 2047, which ntfy decodes
    assert h["title"].startswith("=?UTF-8?B?")
    assert base64.b64decode(h["title"][10:-2]).decode() == "gpudeck: träin oom_risk"
    assert run_delivery(target(receiver.url(), "ntfy"))[0]
    assert receiver.requests()[1]["headers"]["priority"] == "high"
    assert receiver.requests()[1]["headers"]["title"] == "gpudeck: sglang stalled"


def test_on_filters_codes_and_each_target_runs_on_its_own(no_proxy):
    hang, ok = Receiver(["hang"]), Receiver([200])
    try:
        events: list[dict] = []
        t0 = time.monotonic()
        targets = [target(hang.url(), timeout_s=2, retries=0, name="slow"),
                   target(ok.url(), name="fast", on=["stalled"]),
                   target(ok.url(), name="crashes-only", on=["crashed"])]
        results = notify.deliver_all(targets, ALERT, "box", events.append)
        assert results == {"slow": False, "fast": True}
        delivered = [e for e in events if e["event"] == "NotifyDelivered"]
        assert delivered[0]["target"] == "fast" and delivered[0]["took_s"] < 2
        assert time.monotonic() - t0 < 2 + 1.5
        assert len(ok.requests()) == 1
    finally:
        hang.close()
        ok.close()


def test_redact_url():
    from gpudeck.jobs.notify_targets import redact_url, scrub
    assert redact_url("https://hooks.slack.com/services/T0/B0/XYZ") == "https://hooks.slack.com/…"
    assert redact_url("https://user:pw@ntfy.sh:8443/topic?auth=1") == "https://ntfy.sh:8443/…"
    assert redact_url("http://[::1]:9/x") == "http://[::1]:9/…"
    assert redact_url("https://example.com") == "https://example.com"
    assert redact_url("not a url") == "(a URL)"
    url = "https://example.com/hook/TOKEN?k=SECRET"
    assert "TOKEN" not in scrub(f"failed for {url}", url) and "SECRET" not in scrub("k=SECRET", url)


def test_a_hand_edited_target_is_clamped_and_a_broken_one_skipped(receiver):
    events: list[dict] = []
    targets = [{"name": "odd", "url": receiver.url(), "timeout_s": "soon", "retries": 99, "on": "stalled"},
               {"name": "nourl", "format": "json"}, "not a table"]
    assert notify.deliver_all(targets, ALERT, "box", events.append) == {"odd": True}
    assert events[0]["event"] == "NotifyDelivered" and events[0]["attempts"] == 6


def test_post_mortem_notifications_are_escaped_and_redacted():
    from gpudeck.jobs.history import render_html, render_md
    from gpudeck.jobs.history.postmortem import _empty
    events = [{"t": 110.0, "event": "NotifyFailed", "target": "<script>x</script>", "format": "json",
               "url": "https://hooks.example/T0K3N?k=SECRET", "code": "stalled", "attempt": 1, "attempts": 2,
               "error": "[click](https://evil.example) | \x1b[2J<b>", "final": False, "retry_in_s": 1.0},
              {"t": 112.0, "event": "NotifyDelivered", "target": "ops", "format": "slack",
               "url": "https://hooks.example/…", "code": "stalled", "attempt": 2, "attempts": 2, "status": 200},
              {"t": 113.0, "event": "AlertRaised", "code": "crashed"}]
    rows = notify.deliveries(events, started=100.0)
    assert [r["outcome"] for r in rows] == ["failed", "delivered"] and rows[0]["at_s"] == 10.0
    assert rows[0]["url"] == "https://hooks.example/…"
    report = {**_empty("run"), "notifications": rows}
    md, page = render_md.render(report), render_html.render(report)
    assert "<script>" not in page and "&lt;script&gt;" in page and "<b>" not in page and "\x1b" not in page
    assert "\\[click\\]" in md and "\\<script\\>" in md and "\\|" in md and "\x1b" not in md
    assert "delivered on attempt 2 of 2 (HTTP 200)" in md and "retrying in 1 s" in md
    assert "T0K3N" not in md + page and "SECRET" not in md + page
