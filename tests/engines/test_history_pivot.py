"""A pivot is a run in the history: its row, the stopped engine's "stopped by pivot", and both post-mortems (SGLang STAND-IN engines, not a real SGLang)."""
from __future__ import annotations

import json

from gpudeck.jobs.engines.pivot import pivot
from gpudeck.jobs.history.index import RunIndex
from gpudeck.jobs.history.postmortem import build
from gpudeck.jobs.runs import latest_run

from test_engine_pivot import box, wait_ready  # noqa: F401  (the two stand-in engines and their cleanup)
from runsupport import cli, cli_env, wait_for


def test_pivot_row_and_context(box):  # noqa: F811
    sup, ports, path = box
    sup.start("eng-a")
    wait_ready(ports["a"])
    run_a = latest_run("eng-a", sup.state_dir)
    result = pivot(sup, "eng-b", wait=True, ready_deadline_s=60)
    assert result.ok, result.message
    wait_for(lambda: not run_a.state().runner_alive, timeout=60, what="eng-a's runner to finish")
    with RunIndex(sup.state_dir) as index:
        index.sync()
        rows = index.query()
    piv = next(r for r in rows if r["kind"] == "pivot")
    assert piv["job"] == "eng-b" and piv["state"] == "succeeded" and piv["run_id"] == result.run_id
    assert [s["step"] for s in piv["detail"]["steps"]][:2] == ["stop job eng-a", "verify GPUs free"]
    a = next(r for r in rows if r["kind"] == "job" and r["job"] == "eng-a")
    assert a["stopped_by"] == "pivot to eng-b" and a["failed"] is False and a["state"] == "stopped"
    b = next(r for r in rows if r["kind"] == "job" and r["job"] == "eng-b")
    assert b["pivot"].startswith("started by pivot (stopped eng-a")

    report_a = build(run_a.run_id, sup.state_dir)
    assert report_a["verdict"].startswith("stopped by pivot to eng-b")
    assert report_a["context"]["pivot"] == "stopped by pivot to eng-b"
    assert any(s.startswith("verify GPUs free: ok") for s in report_a["context"]["pivot_steps"])
    listing = cli(["runs", "--json"], cli_env(sup.state_dir))
    assert {r["kind"] for r in json.loads(listing.stdout)["runs"]} == {"job", "pivot"}
