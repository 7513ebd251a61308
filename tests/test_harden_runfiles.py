"""Tampered, torn or old run files never crash a reader: a matrix of tamperings x every reader of run files.

Three real runs recorded by the real runner (a trainer that dies of CUDA OOM, a job that ends well, a
bystander of another job). Each case tampers one file of one of the first two, then every reader runs on
the state dir: the runs list, --reindex, postmortem (json, md, html), replay (R), the jobs view data.
No exception may escape any of them, the other runs must still list, and a file that could not be read
costs its run a note. Caps (sizes) are lowered for the huge-file kinds so the test stays fast; one test
keeps the real caps with a sparse 2 GiB file.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest

from gpudeck.jobs import strictjson
from gpudeck.jobs.spec import load_jobs
from gpudeck.jobs.supervisor import Supervisor

from runsupport import oom_trainer, wait_for, write_jobs

PY = sys.executable
DEEP = b"[" * 200_000 + b"]" * 200_000            # RecursionError in json, or in anything that walks it


def _obj(d: dict) -> bytes:
    return json.dumps(d).encode()


# ---------------------------------------------------------------------------------------------- tamperings
# (kind, file, how): how(path, original bytes) leaves the tampered file (or its absence) at `path`.

def _write(data: bytes):
    def how(path: Path, original: bytes) -> None:
        path.unlink(missing_ok=True)
        path.write_bytes(data)
    return how


def _missing(path: Path, original: bytes) -> None:
    path.unlink(missing_ok=True)


def _truncated(path: Path, original: bytes) -> None:
    path.write_bytes(original[: len(original) // 2])


def _symlink_to(target: str):
    def how(path: Path, original: bytes) -> None:
        path.unlink(missing_ok=True)
        os.symlink(target, path)
    return how


def _fifo(path: Path, original: bytes) -> None:
    path.unlink(missing_ok=True)
    os.mkfifo(path)


def _directory(path: Path, original: bytes) -> None:
    path.unlink(missing_ok=True)
    path.mkdir()


def _huge_sparse(path: Path, original: bytes) -> None:
    # Past the (lowered) cap: the file holds its real content, then a hole to 64 MiB.
    path.write_bytes(original)
    os.truncate(path, 64 << 20)


def _lines(fn):
    """A JSONL tampering: every line of the file passed through fn (bytes -> bytes)."""
    def how(path: Path, original: bytes) -> None:
        path.write_bytes(b"".join(fn(line) + b"\n" for line in original.splitlines()))
    return how


def _every_number(value):
    def swap(obj):
        if isinstance(obj, dict):
            return {k: swap(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [swap(v) for v in obj]
        if isinstance(obj, (int, float)) and not isinstance(obj, bool):
            return value
        return obj
    return swap


def _json_lines(fn):
    def line(raw: bytes) -> bytes:
        try:
            obj = json.loads(raw)
        except ValueError:
            return raw
        return fn(obj) if isinstance(fn(obj), bytes) else json.dumps(fn(obj)).encode()
    return _lines(line)


def _numbers(literal: str):
    """Every number of a JSON file written as `literal` (Infinity, NaN, 1e999, a 5000-digit int...)."""
    marker = "__NUM__"

    def how(path: Path, original: bytes) -> None:
        def one(raw: bytes) -> bytes:
            try:
                obj = json.loads(raw)
            except ValueError:
                return raw
            return json.dumps(_every_number(marker)(obj)).replace(f'"{marker}"', literal).encode()
        if path.name.endswith(".jsonl"):
            path.write_bytes(b"".join(one(line) + b"\n" for line in original.splitlines()))
        else:
            path.write_bytes(one(original))
    return how


def _wrong_types(path: Path, original: bytes) -> None:
    # Every value of the top level (and of each JSONL record) becomes a list of dicts.
    def one(raw: bytes) -> bytes:
        try:
            obj = json.loads(raw)
        except ValueError:
            return raw
        if isinstance(obj, dict):
            return json.dumps({k: [{"x": [1]}] for k in obj}).encode()
        return raw
    if path.name.endswith(".jsonl"):
        path.write_bytes(b"".join(one(line) + b"\n" for line in original.splitlines()))
    else:
        path.write_bytes(one(original))


def _strings_everywhere(path: Path, original: bytes) -> None:
    def one(raw: bytes) -> bytes:
        try:
            obj = json.loads(raw)
        except ValueError:
            return raw
        return json.dumps(_every_number("12x")(obj)).encode()
    if path.name.endswith(".jsonl"):
        path.write_bytes(b"".join(one(line) + b"\n" for line in original.splitlines()))
    else:
        path.write_bytes(one(original))


def _deep_line(path: Path, original: bytes) -> None:
    path.write_bytes(original + DEEP + b"\n" + b'{"t": 1, "x": ' + b"[" * 5000 + b"]" * 5000 + b"}\n")


JSON_FILES = ("meta.json", "exit.json", "summary.json", "health.json", "ids.json")
JSONL_FILES = ("events.jsonl", "samples.jsonl")

TAMPERINGS: list[tuple[str, str, object]] = []
for name in JSON_FILES:
    TAMPERINGS += [
        ("missing", name, _missing),
        ("truncated", name, _truncated),
        ("garbage", name, _write(os.urandom(4096))),
        ("a list", name, _write(b"[1, 2, 3]")),
        ("deep nesting", name, _write(DEEP)),
        ("inf/nan", name, _numbers("Infinity")),
        ("huge numbers", name, _numbers("1e999")),
        ("huge finite numbers", name, _numbers("1e308")),
        ("negative numbers", name, _numbers("-1e300")),
        ("5000-digit ints", name, _numbers("9" * 5000)),
        ("wrong types", name, _wrong_types),
        ("strings for numbers", name, _strings_everywhere),
        ("huge file", name, _huge_sparse),
        ("symlink", name, _symlink_to("/etc/passwd")),
        ("symlink to /dev/zero", name, _symlink_to("/dev/zero")),
        ("fifo", name, _fifo),
        ("directory", name, _directory),
    ]
for name in JSONL_FILES:
    TAMPERINGS += [
        ("missing", name, _missing),
        ("truncated", name, _truncated),
        ("garbage", name, _write(os.urandom(8192))),
        ("deep nesting line", name, _deep_line),
        ("inf/nan", name, _numbers("NaN")),
        ("-Infinity", name, _numbers("-Infinity")),
        ("huge numbers", name, _numbers("1e308")),
        ("negative numbers", name, _numbers("-1e300")),
        ("wrong types", name, _wrong_types),
        ("strings for numbers", name, _strings_everywhere),
        ("records are lists", name, _lines(lambda raw: b"[" + raw + b"]")),
        ("a giant line", name, lambda p, o: p.write_bytes(b'{"t": 1, "x": "' + b"y" * (3 << 20) + b'"}\n' + o)),
        ("huge file", name, _huge_sparse),
        ("symlink to /dev/zero", name, _symlink_to("/dev/zero")),
        ("fifo", name, _fifo),
    ]
TAMPERINGS += [
    ("100 inf", "times", lambda p, o: p.write_bytes(o + b"100 inf\n")),
    ("the last time inf", "times", lambda p, o: p.write_bytes(
        b"\n".join(o.splitlines()[:-1] + [o.splitlines()[-1].split()[0] + b" inf"]) + b"\n")),
    ("nan and negatives", "times", lambda p, o: p.write_bytes(b"-5 nan\n10 -1e308\n" + o + b"7 1e308\n")),
    ("huge offsets", "times", lambda p, o: p.write_bytes(o + b"9" * 400 + b" 1700000000\n")),
    ("garbage", "times", _write(os.urandom(4096))),
    ("missing", "times", _missing),
    ("huge file", "times", _huge_sparse),
    ("fifo", "times", _fifo),
    ("symlink to /dev/zero", "output.log", _symlink_to("/dev/zero")),
    ("fifo", "output.log", _fifo),
    ("missing", "output.log", _missing),
    ("garbage", "output.log", _write(os.urandom(65536))),
    ("missing summary, Infinity samples", "summary.json+samples.jsonl", None),
    ("every file missing but meta.json", "*", None),
    ("the run dir is a symlink", "/", None),
]


def _tamper(run_dir: Path, kind: str, name: str, how) -> None:
    if name == "summary.json+samples.jsonl":
        # What an older runner left: no summary, samples written with Infinity (json.dumps' default).
        (run_dir / "summary.json").unlink(missing_ok=True)
        _numbers("Infinity")(run_dir / "samples.jsonl", (run_dir / "samples.jsonl").read_bytes())
        return
    if name == "*":
        for p in run_dir.iterdir():
            if p.name != "meta.json":
                p.unlink()
        return
    if name == "/":
        moved = run_dir.parent.parent / ("." + run_dir.name)
        run_dir.rename(moved)
        os.symlink(moved, run_dir)
        return
    path = run_dir / name
    original = path.read_bytes() if path.is_file() else b""
    how(path, original)


# ---------------------------------------------------------------------------------------------- the runs

@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    root = tmp_path_factory.mktemp("runfiles")
    script = root / "train.py"
    script.write_text(oom_trainer(steps=4, pause_s=0.3))
    jobs = write_jobs(root / "jobs.toml", {
        "trainer": {"kind": "train", "cmd": [PY, str(script)]},
        "fine": {"kind": "stage", "cmd": "echo one; sleep 0.6; echo two"},
        "bystander": {"kind": "stage", "cmd": "echo bystanding"},
    })
    sup = Supervisor(load_jobs(jobs), state_dir=root / "state")
    for name in ("trainer", "fine", "bystander"):
        sup.start(name)
    for name in ("trainer", "fine", "bystander"):
        assert sup.wait(name, timeout=60) is not None, f"{name} did not end"
        run = sup.latest(name)
        wait_for(lambda: not run.state().runner_alive, timeout=60, what=f"{name}'s runner to finish")
    return {"root": root, "jobs": jobs, "state": root / "state",
            "runs": {name: sup.latest(name).path for name in ("trainer", "fine", "bystander")}}


def _copy(recorded, tmp_path) -> tuple[Path, dict[str, Path]]:
    state = tmp_path / "state"
    shutil.copytree(recorded["state"], state, symlinks=True,
                    ignore=shutil.ignore_patterns("history.sqlite3*"))
    runs = {name: state / "runs" / name / path.name for name, path in recorded["runs"].items()}
    return state, runs


# ---------------------------------------------------------------------------------------------- the readers

def read_runs_list(state: Path, runs: dict, victim: str) -> dict:
    from gpudeck.console.commands.runs import render_table
    from gpudeck.jobs.history.index import RunIndex
    with RunIndex(state) as index:
        index.sync()
        rows = index.query()
    render_table(rows)
    json.loads(strictjson.dumps({"runs": rows}))
    return {"rows": rows}


def read_reindex(state: Path, runs: dict, victim: str) -> dict:
    from gpudeck.jobs.history.index import RunIndex, reindex
    with RunIndex(state) as index:
        reindex(index)
        rows = index.query()
    return {"rows": rows}


def _postmortem(state: Path, runs: dict, victim: str, fmt: str) -> dict:
    from gpudeck.jobs.history import postmortem, render_html, render_md
    out = {}
    for name in (victim, "bystander"):
        try:
            report = postmortem.build(str(runs[name]), state)
        except postmortem.PostmortemError as exc:      # a clean one-line refusal is allowed for the victim
            assert name == victim, exc
            out[name] = None
            continue
        if fmt == "json":
            json.loads(strictjson.dumps(report), parse_constant=lambda c: pytest.fail(f"{c} in report"))
        elif fmt == "md":
            render_md.render(report)
        else:
            render_html.render(report)
        out[name] = report
    return out


def read_postmortem_json(state, runs, victim):
    return _postmortem(state, runs, victim, "json")


def read_postmortem_md(state, runs, victim):
    return _postmortem(state, runs, victim, "md")


def read_postmortem_html(state, runs, victim):
    return _postmortem(state, runs, victim, "html")


def read_replay(state: Path, runs: dict, victim: str) -> dict:
    from gpudeck.jobs.replay import ReplayError, ReplaySession, clock_text, jobs_snapshot, position_bar
    out = {}
    for name in (victim, "bystander"):
        try:
            session = ReplaySession.open([runs[name]])
        except ReplayError as exc:                       # "not a run directory": a line, for the victim only
            assert name == victim, exc
            out[name] = None
            continue
        for where in (session.start, (session.start + session.end) / 2, session.end):
            session.seek_to(where)
            frame = session.frame()
            jobs_snapshot(frame)
            position_bar(frame, 60)
            clock_text(frame.t - frame.start)
        session.next_mark()
        session.previous_mark()
        out[name] = session
    return out


def read_jobs_view(state: Path, runs: dict, victim: str, jobs_file: Path) -> dict:
    from gpudeck.jobs.paths import UnsafeStateDir
    from gpudeck.jobs.payload import jobs_payload
    from gpudeck.jobs.view import JobsSnapshot
    sup = Supervisor(load_jobs(jobs_file), state_dir=state)
    try:
        payload = jobs_payload(sup)
    except UnsafeStateDir as exc:
        # The state dir's own rule (issue 9): a run dir that is a symlink is refused, and the CLI and
        # the console say so in one line; only that kind may end here.
        assert os.path.islink(runs[victim]), exc
        return {"payload": None, "refused": str(exc)}
    snapshot = JobsSnapshot.from_payload(payload, time.time())
    for job in snapshot.jobs:
        job.cells(time.time())
        job.notice_lines(time.time())
    json.loads(strictjson.dumps(payload))
    return {"payload": payload}


READERS = ["runs list", "reindex", "postmortem json", "postmortem md", "postmortem html", "replay", "jobs view"]


def _read(reader: str, state: Path, runs: dict, victim: str, jobs_file: Path) -> dict:
    fn = {"runs list": read_runs_list, "reindex": read_reindex, "postmortem json": read_postmortem_json,
          "postmortem md": read_postmortem_md, "postmortem html": read_postmortem_html,
          "replay": read_replay}.get(reader)
    if fn is None:
        return read_jobs_view(state, runs, victim, jobs_file)
    return fn(state, runs, victim)


@pytest.fixture
def small_caps(monkeypatch):
    # The huge-file kinds are sparse 64 MiB files: caps below that keep them past the cap, cheaply.
    monkeypatch.setattr(strictjson, "MAX_FILE_BYTES", 4 << 20, raising=False)
    monkeypatch.setattr(strictjson, "MAX_SUMMARY_BYTES", 8 << 20, raising=False)
    monkeypatch.setattr(strictjson, "MAX_JSONL_BYTES", 16 << 20, raising=False)
    from gpudeck.jobs import runs as runs_mod
    monkeypatch.setattr(runs_mod, "MAX_TIMES_BYTES", 4 << 20, raising=False)


CASES = [(victim, kind, name, how) for victim in ("trainer", "fine") for kind, name, how in TAMPERINGS]


@pytest.mark.parametrize("victim, kind, name, how", CASES,
                         ids=[f"{v}-{n}-{k}".replace(" ", "_") for v, k, n, _ in CASES])
def test_a_tampered_run_file_costs_its_run_a_note_never_a_reader(recorded, tmp_path, small_caps,
                                                                  victim, kind, name, how):
    state, runs = _copy(recorded, tmp_path)
    _tamper(runs[victim], kind, name, how)
    raised = []
    results = {}
    for reader in READERS:
        try:
            results[reader] = _read(reader, state, runs, victim, recorded["jobs"])
        except Exception as exc:             # noqa: BLE001 - what the matrix counts
            raised.append(f"{reader}: {type(exc).__name__}: {str(exc)[:200]}")
    if os.environ.get("MATRIX_LOG"):         # the figures: one line per case, the readers that raised
        with open(os.environ["MATRIX_LOG"], "a") as fh:
            fh.write(json.dumps({"case": f"{victim}/{name}/{kind}", "raised": raised}) + "\n")
    assert raised == [], raised
    # The other runs still list, whatever happened to this one.
    others = {p.name for n, p in runs.items() if n != victim}
    for reader in ("runs list", "reindex"):
        listed = {r["run_id"] for r in results[reader]["rows"]}
        assert others <= listed, (reader, others - listed)
    assert results["postmortem json"]["bystander"]["verdict"]
    assert results["replay"]["bystander"] is not None
    if results["jobs view"]["payload"] is not None:
        names = [j["name"] for j in results["jobs view"]["payload"]["jobs"]]
        assert sorted(names) == ["bystander", "fine", "trainer"]
    # A file that is there but cannot be read costs its run a note, in the runs list and the post-mortem.
    if name in ("meta.json", "exit.json", "summary.json", "health.json") and kind in NOTED:
        word = NOTED[kind]
        row = next(r for r in results["runs list"]["rows"] if r["run_id"] == runs[victim].name)
        assert any(f"{name} unreadable: {word}" in n for n in row["detail"].get("notes") or []), row["detail"]
        assert any(n.startswith(f"run {runs[victim].name}: ") for n in row["detail"]["notes"])
        report = results["postmortem json"][victim]
        assert any(f"{name} unreadable: {word}" in n for n in report["missing"]), report["missing"]
        if name == "health.json" and victim == "trainer":       # the latest run of its job: the jobs view
            [job] = [j for j in results["jobs view"]["payload"]["jobs"] if j["name"] == victim]
            assert any(f"health.json unreadable: {word}" in n for n in job.get("notes") or []), job


NOTED = {"deep nesting": "nesting deeper than 64", "huge file": "larger than", "fifo": "not a regular file",
         "directory": "not a regular file", "symlink": "a symlink", "a list": "a list, not a JSON object",
         "garbage": "not"}


def test_the_real_caps_hold_on_sparse_2_gib_files(recorded, tmp_path):
    # No lowered caps: 2 GiB files (holes: no disk) are refused at once, by their size. (A JSONL file
    # is read up to its cap instead, 1 GiB: the matrix covers that with a lowered one.)
    state, runs = _copy(recorded, tmp_path)
    for name in ("meta.json", "summary.json", "exit.json", "health.json", "times"):
        os.truncate(runs["trainer"] / name, 2 << 30)
    t0 = time.monotonic()
    rows = read_runs_list(state, runs, "trainer")["rows"]
    report = read_postmortem_json(state, runs, "trainer")["trainer"]
    read_replay(state, runs, "trainer")
    assert time.monotonic() - t0 < 60
    row = next(r for r in rows if r["run_id"] == runs["trainer"].name)
    notes = row["detail"]["notes"]
    assert f"run {runs['trainer'].name}: meta.json unreadable: larger than 16 MiB" in notes, notes
    assert f"run {runs['trainer'].name}: summary.json unreadable: larger than 64 MiB" in notes, notes
    assert "meta.json unreadable: larger than 16 MiB" in report["missing"], report["missing"]
    assert {r["run_id"] for r in rows} >= {p.name for p in runs.values()}


def test_the_cli_lists_every_run_and_names_the_bad_file(recorded, tmp_path):
    # The case: one run dir with deeply nested JSON broke `runs` and `--reindex` for every job.
    from runsupport import cli, cli_env
    state, runs = _copy(recorded, tmp_path)
    victim = runs["fine"]
    (victim / "summary.json").write_bytes(DEEP)
    env = cli_env(state)
    for args in (["runs"], ["runs", "--reindex"], ["runs"], ["postmortem", victim.name]):
        out = cli(args, env)
        assert out.returncode == 0 and b"Traceback" not in out.stderr, (args, out.stderr)
    listed = cli(["runs"], env)
    for path in runs.values():
        assert path.name in listed.stdout.decode()
    assert f"gpudeck: run {victim.name}: summary.json unreadable: nesting deeper than 64\n" in listed.stderr.decode()
    rows = json.loads(cli(["runs", "--json"], env).stdout)["runs"]
    [row] = [r for r in rows if r["run_id"] == victim.name]
    assert row["detail"]["notes"] == [f"run {victim.name}: summary.json unreadable: nesting deeper than 64"]
    report = cli(["postmortem", victim.name], env).stdout.decode()
    assert "summary.json unreadable: nesting deeper than 64" in report
