"""The README is part of the contract: its commands exist, every command is documented, its jobs.toml loads."""
from __future__ import annotations

import re
from pathlib import Path

from gpudeck.console.cli import build_parser
from gpudeck.jobs.spec import load_jobs

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def parser_commands() -> set[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return set(sub.choices)


def readme_commands() -> set[str]:
    return set(re.findall(r"^\| `gpudeck ([a-z-]+)", README, flags=re.M))


def test_every_command_in_the_readme_exists():
    missing = readme_commands() - parser_commands()
    assert not missing, f"README documents commands the CLI lacks: {sorted(missing)}"


def test_every_command_is_in_the_readme():
    undocumented = parser_commands() - readme_commands()
    assert not undocumented, f"commands missing from the README's table: {sorted(undocumented)}"


def test_quickstart_has_exactly_the_install_and_the_test_command():
    quick = README.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", quick, flags=re.S)
    assert [b.strip() for b in blocks] == [
        "python3 -m venv .venv && .venv/bin/pip install -e '.[test]' && .venv/bin/gpudeck --demo",
        ".venv/bin/python -m pytest",
    ]
    ci = (Path(__file__).resolve().parent.parent / ".ci" / "run").read_text()
    assert ".venv/bin/python -m pytest" in ci


def test_the_readme_jobs_toml_example_loads(tmp_path):
    block = re.search(r"## jobs.toml\n.*?```toml\n(.*?)```", README, flags=re.S).group(1)
    path = tmp_path / "jobs.toml"
    path.write_text(block)
    jobs = load_jobs(path).jobs
    assert list(jobs) == ["vllm-k2", "synth-data", "finetune"]
    assert jobs["vllm-k2"].port == 8000 and jobs["vllm-k2"].gpus == tuple(range(8))
    assert jobs["finetune"].needs == ("synth-data",)


def test_the_readme_slurm_example_loads(tmp_path):
    block = re.search(r"## Jobs on a Slurm cluster\n.*?```toml\n(.*?)```", README, flags=re.S).group(1)
    path = tmp_path / "jobs.toml"
    path.write_text(block)
    jobs = load_jobs(path).jobs
    assert jobs["drafter-train"].backend == "slurm" and jobs["drafter-train"].gpus_per_node == 8
    assert jobs["hidden-states"].time == "360" and jobs["drafter-train"].needs == ("hidden-states",)


# Commands that take --host but are not "the same command, run on box": the exporter and web serve boxes
# of their own (their sections say how), and `hosts` reads this machine's hosts.toml about them.
HOST_OWN_SECTIONS = {"exporter", "web", "hosts"}


def test_every_command_that_runs_on_a_box_is_in_the_readmes_host_list():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    remote = {name for name, p in sub.choices.items() if p.get_default("remote_ok")} - HOST_OWN_SECTIONS
    start = README.index("Then `gpudeck --host box start finetune`")
    paragraph = README[start:README.index("behave as they do locally", start)]
    listed = {m.split()[0] for m in re.findall(r"`(?:gpudeck --host box\s+)?([^`]+)`", paragraph)}
    assert remote - listed == set(), f"--host commands the README's list leaves out: {sorted(remote - listed)}"
