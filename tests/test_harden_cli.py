"""Issue "harden", the CLI: argv commands shown as the shell quotes them; --theme checked for every command; an unknown run is exit 2."""
from __future__ import annotations

import json
import shlex

import pytest

from gpudeck.jobs.history.index import RunIndex
from gpudeck.jobs.history.postmortem import build
from gpudeck.jobs.runs import latest_run

from runsupport import cli, cli_env, wait_for, write_jobs

ARGV = ["python3", "train.py", "--name", "run one", "--note", "it's"]


def test_a_runs_argv_is_shown_as_the_shell_would_quote_it(tmp_path):
    # Joined with spaces, "run one" read as two arguments in the post-mortem and `runs`.
    state = tmp_path / "state"
    run_dir = state / "runs" / "train" / "20250101-000000-00001"
    run_dir.mkdir(parents=True)
    (run_dir / "meta.json").write_text(json.dumps({"job": "train", "run_id": run_dir.name, "created_at": 1.7e9,
                                                   "started_at": 1.7e9, "command": ARGV, "host": "h"}))
    (run_dir / "output.log").write_text("hello\n")
    (run_dir / "exit.json").write_text(json.dumps({"exit_code": 0, "ended_at": 1.7e9 + 5,
                                                   "stopped_by_request": False}))
    assert build(str(run_dir), state)["source"]["command"] == shlex.join(ARGV)
    with RunIndex(state) as index:
        index.sync()
        assert index.get(f"job/train/{run_dir.name}")["command"] == shlex.join(ARGV)
    assert shlex.split(shlex.join(ARGV)) == ARGV


def every_command() -> list[list[str]]:
    """Each registered subcommand with a placeholder for each positional it requires."""
    import argparse

    from gpudeck.console.cli import build_parser
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return [[name] + ["x" for a in parser._actions if not a.option_strings and a.nargs is None]
            for name, parser in sub.choices.items()]


@pytest.mark.parametrize("argv", every_command(), ids=lambda argv: argv[0])
def test_an_unknown_theme_is_one_line_and_exit_2_for_every_command(tmp_path, state, capsys, argv):
    # Only the console read --theme; `gpudeck --theme nope status` ran and said nothing of it.
    from gpudeck.console.cli import main
    jobs = tmp_path / "jobs.toml"
    jobs.write_text('[jobs.other]\ncmd = "true"\n')     # no job "x": nothing starts whatever the command
    code = main(["--jobs", str(jobs), "--theme", "nope", *argv])
    err = capsys.readouterr().err
    assert code == 2, (code, err)
    assert err.startswith("gpudeck: unknown theme 'nope' (--theme)") and err.count("\n") == 1, err


def test_a_known_theme_is_accepted_by_commands(tmp_path, state, capsys):
    from gpudeck.console.cli import main
    jobs = tmp_path / "jobs.toml"
    jobs.write_text('[jobs.other]\ncmd = "true"\n')
    assert main(["--jobs", str(jobs), "--theme", "gpudeck-light", "check"]) == 0
    assert main(["--jobs", str(jobs), "--theme", "nord", "check"]) == 0          # a Textual built-in


def test_an_unknown_run_is_exit_2_for_logs_as_for_postmortem(tmp_path, state):
    jobs = write_jobs(tmp_path / "jobs.toml", {"once": {"cmd": "echo hi"}, "idle": {"cmd": "true"}})
    env = cli_env(state)
    assert cli(["--jobs", str(jobs), "start", "once"], env).returncode == 0
    wait_for(lambda: (run := latest_run("once", state)) and run.exit_record(), what="the run's end")
    for argv, reason in ((["logs", "once", "--run", "bogus"], "once has no run bogus"),
                         (["logs", "idle"], "idle has never run"),
                         (["postmortem", "bogus"], "bogus: no such log file"),
                         (["postmortem", "idle"], "idle: no such log file")):
        done = cli(["--jobs", str(jobs), *argv], env)
        err = done.stderr.decode()
        assert done.returncode == 2 and err.startswith(f"gpudeck: {reason}") and err.count("\n") == 1, (argv, err)
    assert cli(["--jobs", str(jobs), "logs", "once"], env).stdout == b"hi\n"
