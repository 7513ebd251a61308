"""The CLI starts light: registering every command loads no command's machinery, and `status` loads only its own.

A wall-clock bound would flake on a loaded machine; what a command imports does not (bench/bench_status.py
has the timings).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# Loaded by some commands, never needed to parse a command line or to print `status`.
HEAVY = ("textual", "rich", "prometheus_client", "asyncssh", "sqlite3", "gpudeck.jobs.logs.analyze",
         "gpudeck.jobs.spec", "gpudeck.jobs.supervisor", "gpudeck.jobs.runs", "gpudeck.jobs.view",
         "gpudeck.jobs.history", "gpudeck.console.app", "gpudeck.themes")


def loaded_after(code: str, cwd: Path = REPO) -> set[str]:
    probe = code + "\nimport json, sys\nsys.__stderr__.write('\\nMODULES ' + json.dumps(sorted(sys.modules)) + '\\n')\n"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUDECK_")}
    env["XDG_CONFIG_HOME"] = str(cwd / "config")       # no ~/.config/gpudeck/jobs.toml either
    out = subprocess.run([sys.executable, "-c", probe], cwd=cwd, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    line = [ln for ln in out.stderr.splitlines() if ln.startswith("MODULES ")][-1]
    return set(json.loads(line[len("MODULES "):]))


def heavy_in(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))


def test_registering_every_command_loads_no_commands_machinery():
    loaded = loaded_after("from gpudeck.console.cli import build_parser\nbuild_parser()")
    assert "gpudeck.console.commands.status" in loaded and "gpudeck.console.commands.analyze" in loaded
    assert heavy_in(loaded) == []
    assert "psutil" not in loaded          # host telemetry: only when a command samples


def test_status_json_loads_only_what_status_needs(tmp_path):
    # Run where there is no jobs file: with one, status also reads it (for its Slurm partitions).
    loaded = loaded_after(
        "import io, sys\n"
        "from gpudeck.console.cli import main\n"
        "out, sys.stdout = sys.stdout, io.StringIO()\n"
        "code = main(['status', '--json', '--interval', '0'])\n"
        "text, sys.stdout = sys.stdout.getvalue(), out\n"
        "assert code == 0 and text.lstrip().startswith('{'), (code, text[:200])\n", cwd=tmp_path)
    assert "gpudeck.jobs.telemetry.sampler" in loaded and "gpudeck.jobs.engines.discovery" in loaded
    assert heavy_in(loaded) == []
    others = sorted(m for m in loaded if m.startswith("gpudeck.console.commands.") and not m.endswith((".status", "._host")))
    assert others == [], "status imported other commands' modules"


@pytest.mark.parametrize("argv,word", [
    (["status", "--json"], "status"),
    (["--jobs", "status", "check"], "check"),            # a global option's value is not the command
    (["--jobs=x.toml", "--demo", "jobs"], "jobs"),
    (["--ref", "2", "logs", "j", "-n", "5"], "logs"),   # argparse's abbreviations, as the real parse reads them
    (["--refresh", "x", "status"], None),                 # a bad global: the full parser says why
    (["-h"], None),
    (["--version"], None),
    (["status", "--version"], "status"),                 # the real parse refuses it, as before
    ([], None),
])
def test_the_command_word_is_read_as_the_full_parser_reads_it(argv, word):
    from gpudeck.console.cli import command_word
    assert command_word(argv) == word


def test_a_module_named_otherwise_than_its_command_still_parses():
    from gpudeck.console.cli import build_parser
    # commands/jobs_list.py registers `jobs`: asking for the module alone must still give a full parser.
    assert build_parser(only="jobs_list").parse_args(["jobs", "--json"]).command == "jobs"
    assert build_parser(only="status").parse_args(["status"]).command == "status"


def test_the_probe_sees_a_heavy_import():
    # Guards the two tests above: the same probe does report the console's Textual app.
    loaded = loaded_after("import gpudeck.console.app")
    assert "textual" in heavy_in(loaded) and "gpudeck.console.app" in heavy_in(loaded)
