"""[notify.NAME] tables in jobs.toml and config.toml: every validation error, located FILE:LINE:COL; URLs never printed whole."""
from __future__ import annotations

import pytest

from gpudeck.jobs import notify_targets, stalls
from gpudeck.jobs.spec import check_jobs, file_settings, jobs_file_from_snapshot, load_jobs, load_user_notify

JOB = '[jobs.a]\ncmd = "true"\n\n'
SECRET = "T0K3N-s3cr3t"


def errors_of(tmp_path, body: str) -> list[str]:
    path = tmp_path / "jobs.toml"
    # a top-level key must come before the first table, else it belongs to the job
    path.write_text(body + "\n" + JOB if not body.startswith("[") else JOB + body)
    return [str(e).replace(str(path), "F") for e in check_jobs(path)]


# (the tables, the one error: "LINE:COL: message"); a [table] goes after the job (line 4), a top-level key before it.
CASES = [
    ('notify = 3\n', "1:10: 'notify' must be a table of [notify.NAME] tables, got an integer"),
    ('[notify]\n"bad name!" = { url = "https://x.example/h" }\n',
     "5:1: bad notify target name 'bad name!'"),
    ('[notify]\nops = "https://x.example/h"\n', "5:7: notify target 'ops' must be a table ([notify.ops]), got a string"),
    ('[notify.ops]\nformat = "json"\n', "4:1: notify target 'ops' has no url (the webhook to POST to)"),
    ('[notify.ops]\nurl = "https://x.example/h"\ncolour = "red"\n', "6:1: unknown key 'colour' in notify target 'ops'"),
    ('[notify.ops]\nurl = "https://x.example/h"\nretry = 2\n',
     "6:1: unknown key 'retry' in notify target 'ops' (did you mean 'retries'?)"),
    ('[notify.ops]\nurl = 42\n', "5:7: url must be a string, got an integer"),
    ('[notify.ops]\nurl = ""\n', "5:7: url is empty"),
    ('[notify.ops]\nurl = "https://x.example/a b"\n', "5:7: url contains a space or a control character"),
    (f'[notify.ops]\nurl = "ftp://x.example/{SECRET}"\n', "5:7: url must start with http:// or https:// (scheme 'ftp')"),
    (f'[notify.ops]\nurl = "x.example/{SECRET}"\n', "5:7: url must start with http:// or https:// (scheme none)"),
    (f'[notify.ops]\nurl = "https:///{SECRET}"\n', "5:7: url has no host"),
    (f'[notify.ops]\nurl = "https://x.example:99999/{SECRET}"\n', "5:7: url is not a valid URL"),
    ('[notify.ops]\nurl = "https://x.example/${token}"\n', "5:26: unknown variable ${token}; define it in [vars]"),
    ('[notify.ops]\nurl = "https://x.example/h"\nformat = "teams"\n',
     "6:10: format must be one of json, slack, discord, ntfy; got 'teams'"),
    ('[notify.ops]\nurl = "https://x.example/h"\nformat = "slak"\n', "6:10: format must be one of json, slack, discord, "
     "ntfy; got 'slak' (did you mean 'slack'?)"),
    ('[notify.ops]\nurl = "https://x.example/h"\nformat = 1\n', "6:10: format must be one of json, slack, discord, "
     "ntfy; got an integer"),
    ('[notify.ops]\nurl = "https://x.example/h"\non = 5\n', "6:6: on must be a list of alert codes"),
    ('[notify.ops]\nurl = "https://x.example/h"\non = []\n', "6:6: on is empty: leave it out to be told of every alert"),
    ('[notify.ops]\nurl = "https://x.example/h"\non = ["stalled", "crashd"]\n',
     "6:18: unknown alert code 'crashd' in on (did you mean 'crashed'?); the codes are crashed, stalled"),
    ('[notify.ops]\nurl = "https://x.example/h"\non = "stale"\n', "6:6: unknown alert code 'stale' in on"),
    ('[notify.ops]\nurl = "https://x.example/h"\non = ["stalled", 3]\n', "6:18: on items must be alert codes (strings), got an integer"),
    ('[notify.ops]\nurl = "https://x.example/h"\non = ["stalled", "stalled"]\n', "6:18: on lists 'stalled' twice"),
    ('[notify.ops]\nurl = "https://x.example/h"\ntimeout_s = "5s"\n', "6:13: timeout_s must be a number of seconds, got a string"),
    ('[notify.ops]\nurl = "https://x.example/h"\ntimeout_s = 0\n', "6:13: timeout_s must be more than 0 and at most 60 seconds, got 0"),
    ('[notify.ops]\nurl = "https://x.example/h"\ntimeout_s = 600\n', "6:13: timeout_s must be more than 0 and at most 60"),
    ('[notify.ops]\nurl = "https://x.example/h"\nretries = true\n', "6:11: retries must be an integer 0..5, got a boolean"),
    ('[notify.ops]\nurl = "https://x.example/h"\nretries = 6\n', "6:11: retries must be 0..5, got 6"),
    ('[notify.ops]\nurl = "https://x.example/h"\nretries = -1\n', "6:11: retries must be 0..5, got -1"),
    ('notify.ops = { url = "https://x.example/h", on = ["oom"] }\n', "1:51: unknown alert code 'oom' in on"),
]


@pytest.mark.parametrize("body, expected", CASES, ids=[c[1][:40] for c in CASES])
def test_each_notify_error_is_located(tmp_path, body, expected):
    errors = errors_of(tmp_path, body)
    assert len(errors) == 1, errors
    assert errors[0].startswith("F:" + expected), errors[0]
    assert SECRET not in errors[0]


def test_a_valid_table_loads_with_defaults_and_vars(tmp_path):
    path = tmp_path / "jobs.toml"
    path.write_text(f'[vars]\ntoken = "{SECRET}"\n\n' + JOB + '[notify.ops]\nurl = "https://hooks.example/${token}"\n\n'
                    '[notify.phone]\nurl = "https://ntfy.sh/box"\nformat = "ntfy"\non = ["crashed", "stalled"]\n'
                    'timeout_s = 2.5\nretries = 0\n')
    jf = load_jobs(path)
    assert jf.notify["ops"] == {"name": "ops", "url": f"https://hooks.example/{SECRET}", "format": "json", "on": [],
                                "timeout_s": 10.0, "retries": 3, "source": str(path)}
    assert jf.notify["phone"]["on"] == ["crashed", "stalled"] and jf.notify["phone"]["timeout_s"] == 2.5
    assert jf.notify["phone"]["retries"] == 0
    # a pipeline rebuilds its JobsFile from file_settings: the targets travel too
    again = jobs_file_from_snapshot(path, jf.jobs, file_settings(jf))
    assert again.notify == jf.notify


def test_config_toml_targets_are_validated_with_locations(tmp_path):
    path = tmp_path / "config.toml"
    assert load_user_notify(path) == ({}, [])                 # no file: no targets
    path.write_text('theme = "gpudeck-light"\n')
    assert load_user_notify(path) == ({}, [])                 # the console's keys are not ours
    path.write_text(f'theme = "x"\n\n[notify.chat]\nurl = "gopher://chat.example/{SECRET}"\nformat = "slack"\n'
                    '\n[notify.phone]\nurl = "https://ntfy.sh/t"\non = ["stalld"]\n')
    targets, errors = load_user_notify(path)
    assert targets == {}
    assert [str(e) for e in errors] == [
        f"{path}:4:7: url must start with http:// or https:// (scheme 'gopher')",
        f"{path}:9:7: unknown alert code 'stalld' in on (did you mean 'stalled'?); the codes are "
        "crashed, stalled, nccl_hang, oom_risk, spec_decode_ineffective"]
    path.write_text('[notify.chat\nurl = "x"\n')
    assert str(load_user_notify(path)[1][0]).startswith(f"{path}:1:")
    path.write_text('[notify.chat]\nurl = "https://chat.example/h"\nformat = "discord"\n')
    targets, errors = load_user_notify(path)
    assert errors == [] and targets["chat"]["format"] == "discord" and targets["chat"]["source"] == str(path)


def test_jobs_toml_targets_win_over_config_toml_ones_of_the_same_name():
    own = {"ops": {"name": "ops", "url": "https://a.example/1"}}
    everyone = {"ops": {"name": "ops", "url": "https://b.example/2"}, "chat": {"name": "chat", "url": "https://c.example/3"}}
    assert [t["url"] for t in notify_targets.merged(own, everyone)] == ["https://a.example/1", "https://c.example/3"]


def test_the_notify_codes_are_the_codes_the_health_rules_raise():
    assert set(notify_targets.ALERT_CODES) == set(stalls.SEVERITY)


def test_check_prints_the_targets_redacted_and_config_errors(tmp_path, monkeypatch):
    from runsupport import cli, cli_env
    env = cli_env(tmp_path / "state")
    env["XDG_CONFIG_HOME"] = str(tmp_path / "cfg")
    (tmp_path / "cfg" / "gpudeck").mkdir(parents=True)
    jobs = tmp_path / "jobs.toml"
    jobs.write_text(JOB + f'[notify.ops]\nurl = "https://hooks.example/{SECRET}?k={SECRET}"\non = ["crashed"]\n')
    done = cli(["--jobs", str(jobs), "check"], env, text=True)
    assert done.returncode == 0, done.stderr
    assert f"notify ops: json to https://hooks.example/…, on crashed ({jobs})" in done.stdout
    assert SECRET not in done.stdout + done.stderr
    cfg = tmp_path / "cfg" / "gpudeck" / "config.toml"
    cfg.write_text('[notify.chat]\nurl = "https://chat.example/h"\nretries = 99\n')
    done = cli(["--jobs", str(jobs), "check"], env, text=True)
    assert done.returncode == 1 and done.stdout.strip() == f"{cfg}:3:11: retries must be 0..5, got 99"


def test_the_readme_and_jobs_toml_doc_notify_examples_load(tmp_path):
    import re
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    readme = (root / "README.md").read_text().split("## Notifications\n", 1)[1]
    doc = (root / "docs" / "JOBS_TOML.md").read_text().split("## Notifications: `[notify.NAME]`\n", 1)[1]
    for text in (readme, doc):
        block = re.search(r"```toml\n(.*?)```", text, flags=re.S).group(1)
        path = tmp_path / "jobs.toml"
        path.write_text(block)
        jf = load_jobs(path)
        assert jf.notify["team"]["format"] == "slack" and jf.notify["phone"]["format"] == "ntfy"
        assert jf.notify["phone"]["retries"] == 2 and jf.notify["phone"]["timeout_s"] == 5
