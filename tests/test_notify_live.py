"""Notifications on REAL jobs started with the CLI (no console): the runner delivers a stall alert to real webhooks."""
from __future__ import annotations

import json

import pytest

from gpudeck.jobs.runs import latest_run
from notifysupport import Receiver
from runsupport import cli, cli_env, toml_str, wait_for

SECRET = "T0K3N-s3cr3t"


@pytest.fixture
def env(state, tmp_path):
    e = cli_env(state)
    for key in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        e.pop(key, None)
    e["XDG_CONFIG_HOME"] = str(tmp_path / "config")      # the user's config.toml of this test
    (tmp_path / "config" / "gpudeck").mkdir(parents=True)
    return e


@pytest.fixture
def receivers():
    made: list[Receiver] = []

    def make(answers):
        made.append(Receiver(answers))
        return made[-1]
    yield make
    for r in made:
        r.close()


def events(run, kind: str) -> list[dict]:
    return [e for e in run.events() if e.get("event") == kind]


def test_stall_alert_is_delivered_by_the_runner_with_no_console(tmp_path, state, env, receivers):
    own, everyone = receivers([200]), receivers([200])
    jobs = tmp_path / "jobs.toml"
    jobs.write_text(f"""
[jobs.idle]
cmd = "sleep 300"
stall_after = "2s"

[notify.ops]
url = {toml_str(own.url(f"/hook/{SECRET}"))}
on = ["stalled"]
""")
    # config.toml's targets apply to every jobs file
    (tmp_path / "config" / "gpudeck" / "config.toml").write_text(
        f'theme = "gpudeck-dark"\n[notify.chat]\nurl = {toml_str(everyone.url(f"/services/{SECRET}"))}\nformat = "slack"\n')
    checked = cli(["--jobs", str(jobs), "check"], env, text=True)
    assert checked.returncode == 0, checked.stderr
    assert "notify ops: json to http://127.0.0.1:" in checked.stdout and "notify chat: slack" in checked.stdout
    assert SECRET not in checked.stdout + checked.stderr
    assert cli(["--jobs", str(jobs), "start", "idle"], env).returncode == 0
    run = latest_run("idle", state)
    got = wait_for(own.json_bodies, timeout=40, what="the stall alert at the json webhook")
    assert got[0]["code"] == "stalled" and got[0]["job"] == "idle" and got[0]["run"] == run.run_id
    assert got[0]["severity"] == "error" and got[0]["host"] and got[0]["time"].endswith("Z")
    slack = wait_for(everyone.json_bodies, timeout=20, what="the stall alert at the config.toml webhook")
    assert "stalled" in slack[0]["text"] and "idle" in slack[0]["text"]
    delivered = wait_for(lambda: len(events(run, "NotifyDelivered")) == 2 and events(run, "NotifyDelivered"),
                         timeout=20, what="both deliveries recorded")
    assert {e["target"] for e in delivered} == {"ops", "chat"}
    assert all(e["attempt"] == 1 and e["status"] == 200 for e in delivered)
    raised = events(run, "AlertRaised")
    assert raised[0]["code"] == "stalled" and raised[0].get("notify_pid")
    # The token is in meta.json (private, the runner needs it) and nowhere an operator reads.
    for name in ("events.jsonl", "notify.log", "health.json", "output.log"):
        path = run.path / name
        assert not path.exists() or SECRET not in path.read_text(), name
    post = cli(["--jobs", str(jobs), "postmortem", run.run_id, "--format", "json"], env, text=True)
    assert post.returncode == 0, post.stderr
    rows = json.loads(post.stdout)["notifications"]
    assert {r["target"] for r in rows if r["outcome"] == "delivered"} == {"ops", "chat"}
    assert SECRET not in post.stdout
    cli(["--jobs", str(jobs), "stop", "idle", "--timeout", "3"], env)


def test_a_hanging_webhook_never_holds_up_the_jobs_monitoring(tmp_path, state, env, receivers):
    hang, flaky = receivers(["hang"]), receivers([500, 500, 200])
    jobs = tmp_path / "jobs.toml"
    jobs.write_text(f"""
[jobs.dies]
cmd = "sleep 7; exit 3"
stall_after = "2s"

[notify.stuck]
url = {toml_str(hang.url(f"/x/{SECRET}"))}
format = "discord"
on = ["stalled"]
timeout_s = 8
retries = 0

[notify.flaky]
url = {toml_str(flaky.url(f"/y/{SECRET}"))}
format = "ntfy"
on = ["crashed"]
""")
    assert cli(["--jobs", str(jobs), "start", "dies"], env).returncode == 0
    run = latest_run("dies", state)
    wait_for(hang.requests, timeout=40, what="the stall alert reaching the hanging webhook")
    failed = wait_for(lambda: [e for e in events(run, "NotifyFailed") if e["target"] == "stuck"],
                      timeout=30, what="the hanging delivery's failure")
    assert failed[0]["error"] == "no answer within 8 s" and failed[0]["final"]
    # While that delivery hung (8 s), the monitor went on: the crash was raised before the stall's delivery gave up.
    crashed = wait_for(lambda: [e for e in events(run, "AlertRaised") if e["code"] == "crashed"], timeout=30,
                       what="the crash alert")
    assert crashed[0]["t"] < failed[0]["t"]
    delivered = wait_for(lambda: events(run, "NotifyDelivered"), timeout=30, what="the crash delivered to ntfy")
    assert delivered[0]["target"] == "flaky" and delivered[0]["attempt"] == 3
    flaky_failures = [e for e in events(run, "NotifyFailed") if e["target"] == "flaky"]
    assert [e["status"] for e in flaky_failures] == [500, 500]
    assert [r["headers"]["priority"] for r in flaky.requests()] == ["high"] * 3
    assert f"dies run {run.run_id}".encode() in flaky.requests()[-1]["body"]

    from gpudeck.jobs.history.postmortem import build_run
    from gpudeck.jobs.history import render_html, render_md
    report = build_run(run.path, state)
    rows = report["notifications"]
    assert [(r["target"], r["outcome"]) for r in rows if r["target"] == "flaky"] == [
        ("flaky", "failed"), ("flaky", "failed"), ("flaky", "delivered")]
    md, page = render_md.render(report), render_html.render(report)
    assert "## Notifications" in md and "delivered on attempt 3 of 4 (HTTP 200)" in md
    assert "no answer within 8 s, given up" in md
    assert "<h2>Notifications</h2>" in page and "HTTP 500, retrying in 1 s" in page
    assert SECRET not in md + page + json.dumps(report)
