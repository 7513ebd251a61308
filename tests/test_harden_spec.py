"""Issue "harden", jobs.toml: `${vars}` expansion is bounded (size, total, depth) with located errors; `check` is linear in jobs."""
from __future__ import annotations

import time
import tracemalloc
from pathlib import Path

from gpudeck.jobs.spec import MAX_EXPANDED_CHARS, MAX_VAR_DEPTH, check_jobs, load_jobs

from runsupport import cli, cli_env


def write(tmp_path: Path, lines: list[str], name: str = "jobs.toml") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def doubling(levels: int, reverse: bool = False) -> list[str]:
    """`v_i = "${v_(i-1)}${v_(i-1)}"`: `levels` lines, 2 ** (levels + 1) characters at the top."""
    body = [f'v_{i} = "${{v_{i - 1}}}${{v_{i - 1}}}"' for i in range(1, levels + 1)]
    return ["[vars]", 'v_0 = "ab"', *(reversed(body) if reverse else body),
            "", "[jobs.bomb]", f'cmd = "echo ${{v_{levels}}}"']


def checked(path: Path) -> tuple[list, float, int]:
    """check_jobs' errors, the seconds it took and the peak of memory Python allocated meanwhile."""
    tracemalloc.start()
    try:
        t0 = time.monotonic()
        errors = check_jobs(path)
        seconds = time.monotonic() - t0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return errors, seconds, peak


def test_a_doubling_bomb_is_refused_fast_at_the_reference_past_64_kib(tmp_path):
    # 24 levels would be 32 MiB (the reported 39 levels reached the OOM killer): refused on v_16's
    # line, at its second ${v_15}, which takes it from 64 Ki to 128 Ki characters.
    path = write(tmp_path, doubling(24))
    errors, seconds, peak = checked(path)
    assert [(e.line, e.col) for e in errors] == [(18, 16)], errors
    assert "${v_15} makes this value longer than 64 KiB" in errors[0].message
    assert seconds < 2.0
    assert peak < 16 * 1024 * 1024, f"{peak:,} bytes"
    done = cli(["--jobs", str(path), "check"], cli_env(tmp_path / "state"))
    assert done.returncode == 1
    assert done.stdout.decode().splitlines() == [str(errors[0])]
    assert str(errors[0]).startswith(f"{path}:18:16: ")


def test_the_bomb_written_top_down_is_refused_the_same_way(tmp_path):
    # Written from the top var down, resolving recurses from v_24 to v_0 and fails on the way back up.
    path = write(tmp_path, doubling(24, reverse=True))
    errors, seconds, peak = checked(path)
    assert len(errors) == 1 and "${v_15} makes this value longer than 64 KiB" in errors[0].message, errors
    assert (errors[0].line, errors[0].col) == (3 + 24 - 16, 16)
    assert seconds < 2.0 and peak < 16 * 1024 * 1024


def test_a_long_chain_of_vars_is_one_located_error_not_a_recursion_error(tmp_path):
    # c_0 uses c_1 uses c_2 ... c_2000: resolving it once hit Python's recursion limit ("nesting is too deep", line 1).
    lines = ["[vars]"] + [f'c_{i} = "${{c_{i + 1}}}x"' for i in range(2000)] + ['c_2000 = "end"',
                                                                                 "[jobs.a]", 'cmd = "${c_0}"']
    errors = check_jobs(write(tmp_path, lines))
    assert [(e.line, e.col) for e in errors] == [(MAX_VAR_DEPTH + 1, 9)], errors
    assert errors[0].message.startswith(f"${{c_{MAX_VAR_DEPTH}}} nests [vars] more than {MAX_VAR_DEPTH} deep")


def test_vars_up_to_the_bounds_still_load(tmp_path):
    chain = [f'c_{i} = "${{c_{i - 1}}}/"' for i in range(1, MAX_VAR_DEPTH)]
    lines = ["[vars]", 'c_0 = "r"', *chain, f'big = "{"y" * (MAX_EXPANDED_CHARS - len("echo "))}"',
             "[jobs.a]", f'cmd = "${{c_{MAX_VAR_DEPTH - 1}}}"', 'env = { BIG = "echo ${big}" }']
    spec = load_jobs(write(tmp_path, lines)).jobs["a"]
    assert spec.cmd == "r" + "/" * (MAX_VAR_DEPTH - 1)
    assert len(spec.env["BIG"]) == MAX_EXPANDED_CHARS


def test_many_jobs_each_under_the_bound_stop_at_the_files_total(tmp_path):
    # 700 jobs x 60 KiB is 42 MiB of substituted text: one error at the job that passes 32 MiB, none after it.
    lines = ["[vars]", 'b_0 = "' + "x" * 60 + '"'] + [f'b_{i} = "${{b_{i - 1}}}${{b_{i - 1}}}"' for i in range(1, 11)]
    for j in range(700):
        lines += [f"[jobs.j{j}]", 'cmd = "echo ${b_10}"']
    errors, seconds, peak = checked(write(tmp_path, lines))
    assert len(errors) == 1 and "substitutions come to more than 32 MiB in all" in errors[0].message, errors
    # The vars take 122,760 characters; 544 jobs x 61,440 fit in the rest: j544's cmd is the one past it.
    assert (errors[0].line, errors[0].col) == (12 + 2 * 544 + 2, 13)
    assert peak < 48 * 1024 * 1024


def many_jobs(path: Path, count: int) -> Path:
    """`count` jobs the way a generated file has them: vars, an argv, gpus, env, a marker, needs."""
    with open(path, "w") as fh:
        fh.write('on_alert = "true"\n[vars]\nroot = "/data"\n')
        for i in range(count):
            fh.write(f'[jobs.j{i}]\ncmd = ["python3", "${{root}}/x.py", "{i}"]\ngpus = "0-3"\n'
                     f'env = {{ A = "1" }}\ndone_when = "d/{i}"\n')
            if i:
                fh.write(f'needs = ["j{i - 1}"' + (f', "j{i // 2}"' if i > 2 else "") + "]\n")
    return path


def cpu_seconds(path: Path, rounds: int) -> float:
    """The fastest of `rounds` check_jobs, in CPU seconds: the other processes on the box do not count."""
    best = float("inf")
    for _ in range(rounds):
        t0 = time.process_time()
        errors = check_jobs(path)
        best = min(best, time.process_time() - t0)
        assert errors == []
    return best


def test_check_is_linear_in_jobs(tmp_path):
    # Quadratic, 10x the jobs is 100x the time (a set of every job name was built once per job:
    # 10,000 jobs took 9.3 s, 20,000 took 38.8 s); linear it is ~10x. 20x leaves room for noise.
    small = cpu_seconds(many_jobs(tmp_path / "2k.toml", 2000), rounds=3)
    large_file = many_jobs(tmp_path / "20k.toml", 20000)
    large = cpu_seconds(large_file, rounds=1)
    if large >= 20 * small:                # a second look before calling it quadratic
        large = min(large, cpu_seconds(large_file, rounds=1))
    assert large < 20 * small, f"2,000 jobs: {small:.3f} s, 20,000 jobs: {large:.3f} s ({large / small:.1f}x)"
