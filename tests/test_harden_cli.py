"""Issue "harden", the CLI: argv commands shown as the shell quotes them; --theme checked for every command; an unknown run is exit 2."""
from __future__ import annotations

import json
import shlex

from gpudeck.jobs.history.index import RunIndex
from gpudeck.jobs.history.postmortem import build

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
