"""The analyzer's regexes cached on disk (regexcache.py): a cached pattern is the stdlib's own; a bad file is ignored."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "logs"

# A process as the CLI is one: imports the analyzer, reads every fixture (the prefilter tries compile
# too), then checks each pattern it used against the stdlib's compile of the same text and flags.
PROBE = textwrap.dedent("""
    import json, re, sys
    from pathlib import Path
    from gpudeck.jobs.logs.analyze import analyze_bytes, regexcache
    readings = [analyze_bytes(p.read_bytes()).to_json() for p in sorted(Path(sys.argv[1]).glob("*.log"))]
    used = [key for key in regexcache._used if key[0] != "derived"]
    ours = [regexcache.compile(p, f) for p, f in used]
    stdlib = [re.compile(p, f) for p, f in used]
    from gpudeck.jobs.logs.analyze import patterns          # each prefilter trie built here again, from scratch
    tries = [rx.pattern == re.compile(patterns._trie_pattern(
        [lit for lit, _ in patterns._RARE_ANCHORS] + [lit for lit in extra if lit != patterns._RANK_ANCHOR],
        [patterns._NINJA_ANCHOR, patterns._COUNT_ANCHOR] + ([patterns._RANK_ANCHOR] if patterns._RANK_ANCHOR in extra
                                                            else []))).pattern
             for extra, rx in patterns._prefilters.items()]
    print(json.dumps({"on": regexcache._cache is not None, "compiled": regexcache._dirty, "used": len(used),
                      "tries": len(tries), "tries_equal": all(tries),
                      "equal": [a == b for a, b in zip(ours, stdlib)].count(False) == 0,
                      "groups": all(a.groups == b.groups and a.groupindex == b.groupindex for a, b in zip(ours, stdlib)),
                      "readings": readings}))
""")


def probe(cache_home: Path, **env: str) -> dict:
    full = {**os.environ, "XDG_CACHE_HOME": str(cache_home), **env}
    out = subprocess.run([sys.executable, "-c", PROBE, str(FIXTURES)], env=full, capture_output=True, text=True,
                         timeout=180)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def cache_file(cache_home: Path) -> Path:
    files = list((cache_home / "gpudeck" / "regex").glob("*.recode"))
    assert len(files) == 1, files
    return files[0]


@pytest.fixture(scope="module")
def uncached(tmp_path_factory) -> dict:
    """The readings with no cache at all: what every cached run must give."""
    return probe(tmp_path_factory.mktemp("off"), GPUDECK_REGEX_CACHE="0")


def test_a_second_process_compiles_nothing_and_reads_as_the_stdlib(tmp_path, uncached) -> None:
    assert uncached["on"] is False and not (tmp_path / "gpudeck").exists()
    first = probe(tmp_path)
    assert first["on"] and first["compiled"] and first["used"] >= 60
    path = cache_file(tmp_path)
    assert path.stat().st_mode & 0o777 == 0o600
    second = probe(tmp_path)
    assert second["on"] and not second["compiled"]             # every pattern came from the file
    for run in (first, second):
        assert run["equal"] and run["groups"] and run["used"] == first["used"]
        assert run["tries"] >= 2 and run["tries_equal"]
        assert run["readings"] == uncached["readings"]


@pytest.mark.parametrize("damage", ["flipped byte", "cut short", "writable by others", "a symlink", "other build"])
def test_a_damaged_or_foreign_file_is_ignored_and_written_again(tmp_path, uncached, damage) -> None:
    probe(tmp_path)
    path = cache_file(tmp_path)
    blob = path.read_bytes()
    if damage == "flipped byte":
        path.write_bytes(blob[:-100] + bytes([blob[-100] ^ 0x40]) + blob[-99:])
    elif damage == "cut short":
        path.write_bytes(blob[:len(blob) // 2])
    elif damage == "writable by others":
        path.chmod(0o666)
    elif damage == "a symlink":
        real = tmp_path / "elsewhere.recode"
        path.rename(real)
        path.symlink_to(real)
    else:
        magic, build, rest = blob.split(b"\n", 2)
        path.write_bytes(magic + b"\n" + build.replace(b"cpython", b"otherpy") + b"\n" + rest)
    again = probe(tmp_path)
    assert again["compiled"] and again["equal"] and again["readings"] == uncached["readings"]
    assert not probe(tmp_path)["compiled"]                      # the file written again (in a link's place) is read
    assert not path.is_symlink()


def test_a_cache_that_cannot_be_written_costs_only_the_compile(tmp_path, uncached) -> None:
    blocked = tmp_path / "file-not-folder"
    blocked.write_text("")
    run = probe(blocked)
    assert run["on"] and run["compiled"] and run["equal"] and run["readings"] == uncached["readings"]


def test_a_file_grown_past_its_bound_starts_over_with_what_a_process_uses(tmp_path) -> None:
    from gpudeck.jobs.logs.analyze import regexcache
    probe(tmp_path)
    path = cache_file(tmp_path)
    entries = regexcache.load(path)
    assert entries
    # Patterns of earlier releases, past KEEP_BYTES in all; and one the process uses taken out, so it compiles.
    stale = {(f"old pattern {n}", 0): (32, list(range(400)), 0, {}, ()) for n in range(regexcache.KEEP_BYTES // 1000)}
    used = [key for key in entries if key[0] != "derived"]
    del entries[used[0]]
    regexcache.store(path, {**entries, **stale})
    assert path.stat().st_size > regexcache.KEEP_BYTES
    run = probe(tmp_path)
    assert run["compiled"] and run["equal"]
    kept = regexcache.load(path)
    assert path.stat().st_size < regexcache.KEEP_BYTES and not any(key in kept for key in stale)
    assert used[0] in kept and not probe(tmp_path)["compiled"]
