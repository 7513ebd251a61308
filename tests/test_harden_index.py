"""The run index's own file is not trusted either: a lock is waited for and reported, a full disk reported,
only a file SQLite proves broken (or one with other tables) is replaced and the old one kept, a symlink is
refused, and every file it creates is 0600. Real SQLite files, real second processes, a real full tmpfs."""
from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gpudeck.jobs.history.index import IndexLocked, IndexUnavailable, RunIndex, db_path

PY = sys.executable


def _fake_run(state: Path, job: str, n: int, *, command: str = "true") -> Path:
    run_id = f"20250101-000000-{n:03d}aa"
    d = state / "runs" / job / run_id
    d.mkdir(parents=True)
    started = 1_700_000_000.0 + n
    (d / "meta.json").write_text(json.dumps({"job": job, "run_id": run_id, "created_at": started,
                                             "started_at": started, "command": command, "host": "h"}))
    (d / "exit.json").write_text(json.dumps({"exit_code": 0, "ended_at": started + 5, "stopped_by_request": False}))
    return d


def _indexed(state: Path, runs: int = 3) -> list[Path]:
    dirs = [_fake_run(state, "train", n) for n in range(runs)]
    with RunIndex(state) as index:
        index.sync()
    return dirs


def _asides(state: Path) -> list[str]:
    return sorted(p.name for p in state.iterdir() if ".corrupt-" in p.name)


def _run_ids(state: Path, **kwargs) -> list[str]:
    with RunIndex(state) as index:
        index.sync()
        return sorted(r["run_id"] for r in index.query(**kwargs))


# A second process that takes the index's lock the way another tool (sqlite3 CLI, a backup) can:
# exclusive locking mode and a write, so no other connection may even read until it lets go.
_LOCKER = textwrap.dedent("""
    import sqlite3, sys, time
    conn = sqlite3.connect(sys.argv[1], isolation_level=None)
    conn.execute("PRAGMA locking_mode=EXCLUSIVE")
    conn.execute("BEGIN EXCLUSIVE")
    conn.execute("UPDATE runs SET host = host")
    print("locked", flush=True)
    time.sleep(float(sys.argv[2]))
    conn.execute("COMMIT")
    conn.close()
""")


def _hold_lock(state: Path, seconds: float) -> subprocess.Popen:
    locker = subprocess.Popen([PY, "-c", _LOCKER, str(db_path(state)), str(seconds)], stdout=subprocess.PIPE)
    assert locker.stdout.readline() == b"locked\n"
    return locker


def test_a_lock_held_past_the_wait_is_reported_and_the_index_kept(tmp_path):
    state = tmp_path / "state"
    dirs = _indexed(state)
    shutil.rmtree(dirs[0])                        # a pruned run: only the index remembers it
    with RunIndex(state) as index:
        index.sync()
    inode = os.stat(db_path(state)).st_ino
    locker = _hold_lock(state, 4)
    try:
        t0 = time.monotonic()
        with RunIndex(state, busy_timeout_s=1) as index, pytest.raises(IndexLocked) as caught:
            index.sync()
        waited = time.monotonic() - t0
    finally:
        locker.wait(timeout=30)
    assert str(caught.value) == f"index {db_path(state)} locked by another process (waited 1 s)"
    assert 0.9 <= waited < 3.5
    assert _asides(state) == [] and os.stat(db_path(state)).st_ino == inode
    # Nothing was lost: the pruned run's row is still there once the lock is gone.
    assert _run_ids(state, include_deleted=True) == sorted(d.name for d in dirs)


def test_a_lock_let_go_within_the_wait_is_waited_out(tmp_path):
    state = tmp_path / "state"
    dirs = _indexed(state)
    locker = _hold_lock(state, 1)
    try:
        with RunIndex(state, busy_timeout_s=10) as index:
            index.sync()
            rows = index.query()
            assert index.rebuilt_reason is None
    finally:
        locker.wait(timeout=30)
    assert sorted(r["run_id"] for r in rows) == sorted(d.name for d in dirs)
    assert _asides(state) == []


def test_the_cli_reports_a_locked_index_in_one_line(tmp_path):
    from runsupport import cli, cli_env
    state = tmp_path / "state"
    _indexed(state)
    locker = _hold_lock(state, 14)
    try:
        out = cli(["runs"], cli_env(state), timeout=60)
    finally:
        locker.kill()
        locker.wait(timeout=30)
    assert out.returncode != 0 and b"Traceback" not in out.stderr
    assert out.stderr.decode().strip().endswith("locked by another process (waited 10 s)")
    assert _asides(state) == []


_REINDEXER = textwrap.dedent("""
    import sys
    from gpudeck.jobs.history.index import RunIndex
    for _ in range(int(sys.argv[2])):
        with RunIndex(sys.argv[1]) as index:
            if sys.argv[3] == "rebuild":
                index.rebuild()
            else:
                index.sync()
                assert len(index.query()) in (0, int(sys.argv[4])), len(index.query())
""")


def test_concurrent_reindexes_and_readers_never_move_the_live_index(tmp_path):
    state = tmp_path / "state"
    dirs = _indexed(state, runs=20)
    inode = os.stat(db_path(state)).st_ino
    procs = [subprocess.Popen([PY, "-c", _REINDEXER, str(state), "8", what, str(len(dirs))],
                              stderr=subprocess.PIPE)
             for what in ("rebuild", "rebuild", "rebuild", "read")]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], errors
    assert _asides(state) == [] and os.stat(db_path(state)).st_ino == inode
    assert _run_ids(state) == sorted(d.name for d in dirs)


_FILL = textwrap.dedent("""
    import json, os, sys
    sys.path.insert(0, sys.argv[2])
    from pathlib import Path
    from gpudeck.jobs.history.index import RunIndex, IndexUnavailable
    from test_harden_index import _fake_run
    state = Path(sys.argv[1]) / "state"
    _fake_run(state, "train", 0)
    with RunIndex(state) as index:
        index.sync()
    # Runs whose rows are big, then a file that takes every byte left: their rows cannot be written.
    for n in range(1, 40):
        _fake_run(state, "train", n, command="x" * 4000)
    fd = os.open(Path(sys.argv[1]) / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\\0" * 512)
    except OSError:
        os.close(fd)
    out = {}
    for attempt in ("first", "second"):
        try:
            with RunIndex(state) as index:
                index.sync()
            out[attempt] = "ok"
        except IndexUnavailable as exc:
            out[attempt] = f"{type(exc).__name__}: {exc}"
    os.unlink(Path(sys.argv[1]) / "filler")
    with RunIndex(state) as index:
        index.sync()
        out["after"] = len(index.query())
    out["files"] = sorted(p.name for p in state.iterdir())
    out["mode"] = oct(os.stat(state / "history.sqlite3").st_mode & 0o777)
    print(json.dumps(out))
""")


def test_a_full_disk_is_reported_never_a_rebuild(tmp_path):
    # A real full filesystem: a 4 MiB tmpfs in a private mount namespace (root, or unprivileged via -r).
    mnt = tmp_path / "small"
    mnt.mkdir()
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"no mount namespace here: {probe.stderr.decode().strip()}")
    tests = str(Path(__file__).parent)
    script = f'mount -t tmpfs -o size=4m tmpfs "$1" && exec "$2" -c "$3" "$1" "$4"'
    out = subprocess.run(["unshare", "-rm", "sh", "-c", script, "sh", str(mnt), PY, _FILL, tests],
                         capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr.decode()
    result = json.loads(out.stdout)
    for attempt in ("first", "second"):
        assert result[attempt].startswith("IndexUnavailable: index "), result
        assert "disk is full" in result[attempt], result
    assert result["after"] == 40                 # space again: the same file takes the rows
    assert result["files"] == ["history.sqlite3", "runs"]     # nothing moved aside, nothing emptied
    assert result["mode"] == "0o600"


@pytest.mark.parametrize("name", ["history.sqlite3", "history.sqlite3-wal"])
def test_a_symlinked_index_file_is_refused_not_written_through(tmp_path, name):
    state = tmp_path / "state"
    _fake_run(state, "train", 0)
    target = tmp_path / "elsewhere"
    target.write_bytes(b"")
    if name != "history.sqlite3":
        with RunIndex(state) as index:
            index.sync()
        os.unlink(state / name) if (state / name).exists() else None
    os.symlink(target, state / name)
    with RunIndex(state) as index, pytest.raises(IndexUnavailable) as caught:
        index.sync()
    assert "symlink" in str(caught.value) and str(state / name) in str(caught.value)
    assert target.read_bytes() == b"" and os.path.islink(state / name)
    assert not Path(str(target) + "-wal").exists() and _asides(state) == []


def test_a_rebuilt_index_is_0600_and_the_broken_file_is_kept(tmp_path):
    state = tmp_path / "state"
    dirs = _indexed(state)
    for suffix in ("-wal", "-shm"):
        Path(str(db_path(state)) + suffix).unlink(missing_ok=True)
    junk = b"this is not a database" * 100
    db_path(state).write_bytes(junk)
    old_umask = os.umask(0o022)
    try:
        with RunIndex(state) as index:
            index.sync()
            assert "file is not a database" in index.rebuilt_reason
            assert "rebuilt from the run directories" in index.rebuilt_reason
            assert sorted(r["run_id"] for r in index.query()) == sorted(d.name for d in dirs)
            kept = index.kept_as
    finally:
        os.umask(old_umask)
    assert _asides(state) == [kept.name] and kept.read_bytes() == junk
    with RunIndex(state) as index:                # open: its -wal and -shm exist
        index.sync()
        for suffix in ("", "-wal", "-shm"):
            assert os.stat(str(db_path(state)) + suffix).st_mode & 0o777 == 0o600, suffix


def test_an_index_an_older_gpudeck_left_0644_is_made_0600(tmp_path):
    state = tmp_path / "state"
    _indexed(state)
    os.chmod(db_path(state), 0o644)
    _run_ids(state)
    assert os.stat(db_path(state)).st_mode & 0o777 == 0o600


def _drop(state: Path, sql: str) -> None:
    conn = sqlite3.connect(str(db_path(state)))
    conn.execute(sql)
    conn.commit()
    conn.close()


@pytest.mark.parametrize("sql, why", [
    ("DROP TABLE dirs", "no table dirs"),
    ("ALTER TABLE runs DROP COLUMN peak_rss", "table runs has other columns (missing peak_rss"),
    ("ALTER TABLE dirs RENAME TO folders", "no table dirs"),
])
def test_an_index_with_the_right_version_but_other_tables_is_rebuilt(tmp_path, sql, why):
    state = tmp_path / "state"
    dirs = _indexed(state)
    _drop(state, sql)
    with RunIndex(state) as index:
        index.sync()
        assert why in index.rebuilt_reason
        assert sorted(r["run_id"] for r in index.query()) == sorted(d.name for d in dirs)
        kept = index.kept_as
    assert _asides(state) == [kept.name]
    assert _run_ids(state) == sorted(d.name for d in dirs)        # and stays sound


def _malform(state: Path) -> None:
    # Pages past the first three overwritten with junk: the header and schema read fine, the rows do not.
    with open(db_path(state), "r+b") as fh:
        size = fh.seek(0, os.SEEK_END)
        for page in range(3, size // 4096):
            fh.seek(page * 4096)
            fh.write(b"\xa5" * 4096)


@pytest.mark.parametrize("how", ["sync", "rebuild"])
def test_a_file_found_malformed_after_open_is_proven_then_replaced(tmp_path, how):
    state = tmp_path / "state"
    dirs = [_fake_run(state, "train", n, command="python train.py " + "--flag " * 200) for n in range(60)]
    with RunIndex(state) as index:
        index.sync()
    _malform(state)
    probe = sqlite3.connect(str(db_path(state)))
    try:                                           # broken, as SQLite itself says
        assert probe.execute("PRAGMA quick_check").fetchone()[0] != "ok"
    except sqlite3.DatabaseError as exc:
        assert "malformed" in str(exc)
    finally:
        probe.close()
    with RunIndex(state) as index:
        index.sync() if how == "sync" else index.rebuild()
        assert "malformed" in index.rebuilt_reason, index.rebuilt_reason
        assert sorted(r["run_id"] for r in index.query()) == sorted(d.name for d in dirs)
        kept = index.kept_as
    assert _asides(state) == [kept.name]


_OPENER = textwrap.dedent("""
    import os, sys, time
    from gpudeck.jobs.history.index import RunIndex
    while not os.path.exists(sys.argv[2]):
        time.sleep(0.001)
    with RunIndex(sys.argv[1]) as index:
        index.sync()
        print(len(index.query()), index.kept_as.name if index.kept_as else "-")
""")


def test_processes_that_find_the_same_broken_file_replace_it_once(tmp_path):
    state = tmp_path / "state"
    dirs = _indexed(state, runs=5)
    for suffix in ("-wal", "-shm"):
        Path(str(db_path(state)) + suffix).unlink(missing_ok=True)
    db_path(state).write_bytes(b"not a database at all" * 200)
    go = tmp_path / "go"
    procs = [subprocess.Popen([PY, "-c", _OPENER, str(state), str(go)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE) for _ in range(5)]
    time.sleep(1.0)
    go.touch()
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0] * 5, [e for _, e in outs]
    counts = [o.split()[0] for o, _ in outs]
    kept = {o.split()[1] for o, _ in outs} - {b"-"}
    assert counts == [str(len(dirs)).encode()] * 5
    assert len(kept) == 1 and _asides(state) == [kept.pop().decode()]


def test_a_file_moved_aside_between_check_and_connect_is_opened_again(tmp_path, monkeypatch):
    # Another process that proved the file broken moves it aside (under the lock) just after this
    # one connected and before it compared identities: the file is gone, which means "replaced".
    state = tmp_path / "state"
    dirs = _indexed(state, runs=3)
    real_connect = sqlite3.connect
    moved = []

    def connect_then_moved_away(*args, **kwargs):
        conn = real_connect(*args, **kwargs)
        if not moved:
            moved.append(db_path(state).rename(str(db_path(state)) + ".corrupt-elsewhere"))
        return conn

    monkeypatch.setattr(sqlite3, "connect", connect_then_moved_away)
    with RunIndex(state) as index:
        index.sync()
        assert sorted(r["run_id"] for r in index.query()) == sorted(d.name for d in dirs)
    assert moved and db_path(state).exists()
