"""jobs.toml loading: located errors for malformed files, valid files' meaning, `gpudeck check`, discovery."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpudeck.jobs.paths import find_jobs_file
from gpudeck.jobs.spec import (
    JOB_KEYS, SpecError, check_jobs, load_jobs, parse_duration, pipeline_order,
)

REPO = Path(__file__).resolve().parent.parent


def write(tmp_path: Path, text: str | bytes, name: str = "jobs.toml") -> Path:
    path = tmp_path / name
    if isinstance(text, str):
        path.write_text(text, encoding="utf-8", newline="")
    else:
        path.write_bytes(text)
    return path


def located(tmp_path: Path, text: str | bytes) -> list[tuple[int, int | None, str]]:
    """(line, col, message) of every error check_jobs reports, after checking the FILE prefix."""
    path = write(tmp_path, text)
    out = []
    for error in check_jobs(path):
        assert isinstance(error, SpecError)
        assert str(error).startswith(f"{path}:")
        out.append((error.line, error.col, error.message))
    return out


def only_error(tmp_path: Path, text: str | bytes) -> tuple[int, int | None, str]:
    errors = located(tmp_path, text)
    assert len(errors) == 1, errors
    return errors[0]


# ---------------------------------------------------------------------------
# Hand-written malformed files: exact location and the gist of the message

MALFORMED = [
    pytest.param('[jobs.a]\ncmd = "echo hi\n', 2, 15, "TOML syntax: Illegal character '\\n' (a string left open?", id="unterminated-string"),
    pytest.param('[jobs.a]\ncmd = "x"\n[jobs.a]\ncmd = "y"\n', 3, 8, "TOML syntax: Cannot declare", id="table-twice"),
    pytest.param('[jobs.a]\ncmd = \n', 2, 7, "TOML syntax: Invalid value", id="missing-value"),
    pytest.param('[jobs.a]\ncmd = "x"\ncomand = "y"\n', 3, 1, "unknown key 'comand' in job 'a' (did you mean 'cmd'?)",
                 id="unknown-key-typo"),
    pytest.param('[jobs.a]\ncmd = "x"\ndepends_on = []\n', 3, 1, "(did you mean 'needs'?)", id="unknown-key-alias"),
    pytest.param('[jobs.a]\ncmd = 42\n', 2, 7, "cmd must be a string (run with bash) or a list of strings (argv), "
                 "got an integer", id="cmd-int"),
    pytest.param('[jobs.a]\ncmd = ["python", 3]\n', 2, 18, "item 2 is an integer", id="cmd-list-item"),
    pytest.param('[jobs.a]\ncmd = "  "\n', 2, 7, "cmd is empty", id="cmd-blank"),
    pytest.param('[jobs.a]\ndescription = "no command"\n', 1, 1, "job 'a' has no cmd", id="cmd-missing"),
    pytest.param('[jobs.a]\ncmd = "x"\nneeds = ["b", "nope"]\n\n[jobs.b]\ncmd = "y"\n', 3, 15,
                 "job 'a' needs unknown job 'nope'", id="needs-unknown"),
    pytest.param('[jobs.train]\ncmd = "x"\nneeds = ["trian"]\n', 3, 10,
                 "job 'train' needs unknown job 'trian' (did you mean 'train'?)", id="needs-typo"),
    pytest.param('[jobs.a]\ncmd = "x"\nneeds = "a"\n', 3, 9, "job 'a' needs itself", id="needs-self"),
    pytest.param('[jobs.a]\ncmd = "x"\nport = 70000\n', 3, 8, "port must be 1..65535, got 70000", id="port-range"),
    pytest.param('[jobs.a]\ncmd = "x"\nport = "8000"\n', 3, 8, "port must be an integer", id="port-string"),
    pytest.param('[jobs.a]\ncmd = "x"\nport = true\n', 3, 8, "got a boolean", id="port-bool"),
    pytest.param('[jobs.a]\ncmd = "x"\nstop_timeout = "5 minutes"\n', 3, 16, "stop_timeout: bad duration '5 minutes'",
                 id="duration-words"),
    pytest.param('[jobs.a]\ncmd = "x"\nstall_after = -5\n', 3, 15, "must not be negative", id="duration-negative"),
    pytest.param('[jobs.a]\ncmd = "x"\nstall_after = "0s"\n', 3, 15, "stall_after must be longer than zero",
                 id="stall-zero"),
    pytest.param('[jobs.a]\ncmd = "x"\nstall_after = nan\n', 3, 15, "bad duration", id="duration-nan"),
    pytest.param('[jobs.a]\ncmd = "x"\ndump_on_stall = "no"\n', 3, 17, "dump_on_stall must be true or false, got a string",
                 id="dump-on-stall-string"),
    pytest.param('[jobs.a]\ncmd = "x"\nstop_signal = "SIGSTOP"\n', 3, 15, "stop_signal must be one of", id="signal"),
    pytest.param('[jobs.a]\ncmd = "x"\nkind = "trainer"\n', 3, 8, "(did you mean 'train'?)", id="kind"),
    pytest.param('[jobs.a]\ncmd = "x"\nengine = "vllm"\nkind = "train"\n', 4, 8, "its kind is 'engine', not 'train'",
                 id="engine-kind-conflict"),
    pytest.param('[jobs.a]\ncmd = "x"\nengine = "tgi"\n', 3, 10, "engine must be one of vllm, sglang", id="engine"),
    pytest.param('[jobs.a]\ncmd = "x"\ngpus = [0, -1]\n', 3, 12, "non-negative integers, got -1", id="gpus-negative"),
    pytest.param('[jobs.a]\ncmd = "x"\ngpus = "0,1,1"\n', 3, 8, "GPU 1 more than once", id="gpus-duplicate"),
    pytest.param('[jobs.a]\ncmd = "x"\ngpus = "0-3,x"\n', 3, 8, "gpus: bad entry 'x'", id="gpus-bad-string"),
    pytest.param('[jobs.a]\ncmd = "x"\ngpus = 3\n', 3, 8, "gpus must be a list", id="gpus-int"),
    pytest.param('[jobs.a]\ncmd = "x"\nlog_keep = 0\n', 3, 12, "log_keep must be at least 1", id="log-keep"),
    pytest.param('[jobs.a]\ncmd = "x"\nenv = { PATH = ["a"] }\n', 3, 16, "env PATH must be a string", id="env-type"),
    pytest.param('[jobs.a]\ncmd = "x"\nenv = { "BAD-NAME" = "1" }\n', 3, 9, "bad environment variable name",
                 id="env-name"),
    pytest.param('[jobs.a]\ncmd = "x"\nhealth_path = "health"\n', 3, 15, "must start with '/'", id="health-path"),
    pytest.param('[jobs."my job"]\ncmd = "x"\n', 1, 1, "bad job name 'my job'", id="job-name-quoted"),
    pytest.param('[jobs]\na = "echo"\n', 2, 5, "job 'a' must be a table", id="job-not-table"),
    pytest.param('[[jobs]]\ncmd = "x"\n', 1, 1, "'jobs' must be a table", id="jobs-array-of-tables"),
    pytest.param('', 1, None, "no [jobs.NAME] tables", id="empty-file"),
    pytest.param('[job.a]\ncmd = "x"\n', 1, 1, "unknown top-level key 'job' (did you mean 'jobs'?)", id="top-typo"),
    # Located through dotted keys, inline tables and quoted keys, not only [headers].
    pytest.param('jobs.a.cmd = "x"\njobs.a.port = 0\n', 2, 15, "port must be 1..65535", id="dotted-keys"),
    pytest.param('jobs = { a = { cmd = "x", prot = 1 } }\n', 1, 27, "unknown key 'prot' in job 'a' "
                 "(did you mean 'port'?)", id="inline-table"),
    pytest.param('[jobs."a"]\n"cmd" = "x"\n"port" = -1\n', 3, 10, "port must be 1..65535", id="quoted-keys"),
    pytest.param('[jobs.a]\ncmd = """\nline one\nline two\n"""\nport = 0\n', 6, 8, "port must be", id="after-multiline"),
    pytest.param('[jobs.a]\ncmd = [\n  "echo",\n  # a comment [ with brackets\n  7,\n]\n', 5, 3, "item 2",
                 id="multiline-array"),
    pytest.param('[jobs.a]\r\ncmd = "x"\r\nport = 0\r\n', 3, 8, "port must be", id="crlf"),
    # ${vars}
    pytest.param('[vars]\nmodels = "/m"\n[jobs.a]\ncmd = "serve ${model} --x"\n', 4, 14,
                 "unknown variable ${model} (did you mean 'models'?)", id="var-unknown-points-inside-string"),
    pytest.param('[jobs.a]\ncmd = "echo ${HOME}"\n', 2, 13, "write $HOME / $${HOME} for the shell's variable",
                 id="var-shell-style-braces"),
    pytest.param('[jobs.a]\ncmd = "echo ${oops"\n', 2, 13, "unterminated ${", id="var-unterminated"),
    pytest.param("[vars]\nm = '/m'\n[jobs.a]\ncmd = '''\nset -e\nrun ${m} \\\n  --out ${out}\n'''\n", 7, 9,
                 "unknown variable ${out}", id="var-inside-multiline-literal"),
    pytest.param('[jobs.a]\ncmd = "a\\tb ${x}"\n', 2, 7, "unknown variable ${x}", id="var-after-escape-points-at-string"),
    pytest.param('[vars]\na = "${b}"\nb = "${a}"\n[jobs.x]\ncmd = "${a}"\n', 2, 5,
                 "variables refer to each other in a cycle: ${a} -> ${b} -> ${a}", id="var-cycle"),
    pytest.param('[vars]\na = ["x"]\n[jobs.x]\ncmd = "y"\n', 2, 5, "variable 'a' must be a string", id="var-type"),
    pytest.param('vars = 3\n[jobs.x]\ncmd = "y"\n', 1, 8, "'vars' must be a table", id="vars-not-table"),
    # on_alert, both places
    pytest.param('on_alert = "a"\n[alerts]\non_alert = "b"\n[jobs.x]\ncmd = "y"\n', 3, 1,
                 "on_alert is set both at the top level and in [alerts]", id="on-alert-twice"),
    pytest.param('[alerts]\non_alrt = "b"\n[jobs.x]\ncmd = "y"\n', 2, 1, "(did you mean 'on_alert'?)",
                 id="alerts-unknown-key"),
    # Bytes that are not TOML at all.
    pytest.param(b'[jobs.a]\ncmd = "caf\xe9"\n', 2, 11, "not valid UTF-8 (byte 0xe9)", id="latin1"),
    pytest.param(b'\x7fELF\x02\x01\x01\x00\x00\x00', 1, 8, "NUL byte", id="binary"),
    pytest.param('a = ' + '[' * 3000 + ']' * 3000 + '\n', 1, None, "", id="deep-nesting"),
    pytest.param('[jobs.a]\ncmd = "x"\nport = ' + '9' * 5000 + '\n', 1, None, "invalid TOML", id="huge-integer"),
]


@pytest.mark.parametrize("text, line, col, fragment", MALFORMED)
def test_malformed_file_is_located(tmp_path, text, line, col, fragment):
    errors = located(tmp_path, text)
    assert errors, "expected an error"
    first = errors[0]
    assert (first[0], first[1]) == (line, col), errors
    assert fragment in first[2]
    assert "internal error" not in first[2]


def test_load_jobs_raises_the_first_error_and_carries_all(tmp_path):
    path = write(tmp_path, '[jobs.a]\ncmd = "x"\nport = 0\nkind = "nope"\nneeds = ["zz"]\n')
    with pytest.raises(SpecError) as info:
        load_jobs(path)
    assert str(info.value) == f"{path}:3:8: port must be 1..65535, got 0"
    assert [(e.line, e.col) for e in info.value.errors] == [(3, 8), (4, 8), (5, 10)]


def test_dependency_cycle_is_named_once_and_located_at_the_needs_entry(tmp_path):
    text = ('[jobs.a]\ncmd = "x"\nneeds = ["c"]\n\n'
            '[jobs.b]\ncmd = "x"\nneeds = ["a"]\n\n'
            '[jobs.c]\ncmd = "x"\nneeds = ["b"]\n\n'
            '[jobs.d]\ncmd = "x"\nneeds = ["a"]\n')
    assert located(tmp_path, text) == [(3, 10, "dependency cycle: a -> c -> b -> a")]


def test_every_error_in_a_file_is_reported_in_file_order(tmp_path):
    text = ('[jobs.a]\ncmd = 1\n\n'
            '[jobs.b]\ncmd = "x"\nstop_timeout = "soon"\nneeds = ["a", "q"]\n\n'
            '[jobs.c]\nport = 0\n')
    got = [(line, col) for line, col, _ in located(tmp_path, text)]
    assert got == [(2, 7), (6, 16), (7, 15), (9, 1), (10, 8)]


def test_huge_file_is_refused_without_parsing(tmp_path):
    path = write(tmp_path, b"# " + b"x" * (5 * 1024 * 1024) + b"\n")
    errors = check_jobs(path)
    assert len(errors) == 1 and "larger than 4 MiB" in str(errors[0])


def test_unreadable_paths_are_one_line_errors(tmp_path):
    assert str(check_jobs(tmp_path / "missing.toml")[0]).startswith(f"{tmp_path / 'missing.toml'}: cannot read")
    assert "cannot read" in str(check_jobs(tmp_path)[0])  # a directory


# ---------------------------------------------------------------------------
# What a valid file means


def test_defaults_and_normalisation(tmp_path):
    path = write(tmp_path, '''
[vars]
models = "/m"
kimi = "${models}/kimi"

[jobs.serve]
engine = "sglang"
cmd = "serve ${kimi} --p $PORT $$literal $"
gpus = "0-2, 5"

[jobs.prep]
cmd = ["echo", "${kimi}"]
cwd = "work"
done_when = "out/.done"
needs = "serve"
stop_signal = "sigint"
stop_timeout = "1h30m"
stall_after = 90
dump_on_stall = false
env = { MAX_JOBS = 20, HOME_DIR = "${models}" }
''')
    jobs_file = load_jobs(path)
    assert list(jobs_file.jobs) == ["serve", "prep"]
    serve, prep = jobs_file.jobs["serve"], jobs_file.jobs["prep"]
    assert (serve.kind, serve.port, serve.gpus, serve.line) == ("engine", 30000, (0, 1, 2, 5), 6)
    assert serve.cmd == "serve /m/kimi --p $PORT $literal $"
    assert (serve.stop_signal, serve.stop_timeout, serve.stall_after, serve.log_keep) == ("TERM", 30.0, None, 20)
    assert prep.cmd == ("echo", "/m/kimi")
    assert prep.kind == "stage" and prep.port is None
    assert prep.cwd == str(tmp_path / "work")
    assert prep.done_when == str(tmp_path / "work" / "out" / ".done")
    assert prep.needs == ("serve",)
    assert (prep.stop_signal, prep.stop_timeout, prep.stall_after) == ("INT", 5400.0, 90.0)
    assert serve.dump_on_stall is True and prep.dump_on_stall is False
    assert prep.env == {"MAX_JOBS": "20", "HOME_DIR": "/m"}
    assert jobs_file.vars == {"models": "/m", "kimi": "/m/kimi"}


def test_engine_port_defaults_and_explicit_port_wins(tmp_path):
    path = write(tmp_path, '[jobs.v]\nengine = "vllm"\ncmd = "x"\n[jobs.w]\nengine = "vllm"\ncmd = "x"\nport = 8001\n')
    jobs_file = load_jobs(path)
    assert jobs_file.jobs["v"].port == 8000 and jobs_file.jobs["w"].port == 8001


def test_on_alert_default_and_override(tmp_path):
    path = write(tmp_path, '[alerts]\non_alert = "page ${who}"\n[vars]\nwho = "me"\n'
                           '[jobs.a]\ncmd = "x"\n[jobs.b]\ncmd = "x"\non_alert = "other"\n')
    jobs_file = load_jobs(path)
    assert jobs_file.on_alert == "page me"
    assert jobs_file.alert_command("a") == "page me"
    assert jobs_file.alert_command("b") == "other"


def test_pipeline_order_puts_needs_first(tmp_path):
    path = write(tmp_path, '[jobs.bench]\ncmd="x"\nneeds=["train", "data"]\n[jobs.train]\ncmd="x"\nneeds=["data"]\n'
                           '[jobs.data]\ncmd="x"\n[jobs.other]\ncmd="x"\n')
    assert pipeline_order(load_jobs(path), "bench") == ["data", "train", "bench"]


@pytest.mark.parametrize("value, seconds", [
    (30, 30.0), (1.5, 1.5), ("30", 30.0), ("30s", 30.0), ("5m", 300.0), ("1h", 3600.0), ("1h30m", 5400.0),
    ("500ms", 0.5), ("2d", 172800.0), (" 1h 5s ", 3605.0), ("1.5m", 90.0), ("0", 0.0),
])
def test_durations(value, seconds):
    assert parse_duration(value) == seconds


@pytest.mark.parametrize("value", ["", "5 minutes", "m5", "-1s", "1h-5m", True, [1], float("inf"), -3, "1e3"])
def test_bad_durations(value):
    with pytest.raises(ValueError):
        parse_duration(value)


def test_repository_jobs_toml_is_the_story(tmp_path):
    jobs_file = load_jobs(REPO / "jobs.toml")
    jobs = jobs_file.jobs
    engines = {name: job.engine for name, job in jobs.items() if job.kind == "engine"}
    assert set(engines.values()) == {"vllm", "sglang"}
    assert all(jobs[name].gpus == tuple(range(8)) for name in engines)
    sglang = next(job for job in jobs.values() if job.engine == "sglang")
    assert sglang.port == 30000 and "--speculative-algorithm EAGLE3" in sglang.cmd
    build = next(job for job in jobs.values() if job.kind == "build")
    assert "MAX_JOBS" in build.env and "CMAKE_BUILD_PARALLEL_LEVEL" in build.env
    assert pipeline_order(jobs_file, "bench-drafter") == [
        "synth-data", "extract-hidden-states", "finetune-drafter", "bench-drafter"]
    assert jobs_file.on_alert
    assert all(job.stall_after for job in jobs.values() if job.kind != "stage" or job.needs)


# ---------------------------------------------------------------------------
# docs/JOBS_TOML.md: every ```toml example is a complete, valid file


def doc_examples() -> list[str]:
    text = (REPO / "docs" / "JOBS_TOML.md").read_text(encoding="utf-8")
    return re.findall(r"^```toml\n(.*?)^```", text, flags=re.S | re.M)


def test_docs_have_examples():
    assert len(doc_examples()) >= 3


@pytest.mark.parametrize("example", doc_examples(), ids=lambda text: text.split("\n", 1)[0])
def test_docs_example_loads(tmp_path, example):
    assert load_jobs(write(tmp_path, example)).jobs


# ---------------------------------------------------------------------------
# Property-based: whatever the bytes, a located SpecError or a JobsFile, never anything else

LOCATION_RE = re.compile(r"^(?P<path>.+?):(?P<line>\d+)(?::(?P<col>\d+))?: (?P<message>.+)$")


def assert_only_located_errors(path: Path, data: bytes) -> None:
    line_count = data.count(b"\n") + 1
    errors = check_jobs(path)
    try:
        load_jobs(path)
        assert errors == []
    except SpecError as exc:
        assert errors and str(exc) == str(errors[0])
    for error in errors:
        text = str(error)
        assert "\n" not in text and "\r" not in text
        match = LOCATION_RE.match(text)
        assert match, text
        assert match["path"] == str(path)
        assert 1 <= int(match["line"]) <= line_count, (text, line_count)
        assert "internal error" not in text, text


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("spec-fuzz")


PROPERTY = settings(max_examples=int(os.environ.get("SPEC_FUZZ_EXAMPLES", "150")), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@PROPERTY
@given(data=st.binary(max_size=400))
def test_random_bytes(scratch, data):
    path = write(scratch, data, "random.toml")
    assert_only_located_errors(path, data)


TOML_PIECES = [
    "[jobs.a]", "[jobs.b]", "[jobs.\"x y\"]", "[[jobs]]", "[vars]", "[alerts]", "[jobs]", "\n", "\n", " ", "=",
    "cmd", "port", "needs", "gpus", "env", "kind", "engine", "stall_after", "stop_timeout", "on_alert", "jobs.a.",
    "\"", "'", "\"\"\"", "'''", "[", "]", "{", "}", ",", "#", "1", "-1", "70000", "\"5m\"", "\"0-7\"", "true",
    "\"${m}\"", "\"$$\"", "${", "\"vllm\"", "[\"a\"]", "[\"b\"]", "\"echo\"", "1979-05-27", "nan", "\\", "\t",
    "m = \"/x\"", "\r\n", "é", "\x00",
]


@PROPERTY
@given(pieces=st.lists(st.sampled_from(TOML_PIECES), max_size=40))
def test_random_tomlish_text(scratch, pieces):
    data = "".join(pieces).encode("utf-8")
    path = write(scratch, data, "tomlish.toml")
    assert_only_located_errors(path, data)


# Valid documents, written one key per line so the line of every value is known;
# then one value is replaced by an arbitrary TOML value, or one key renamed.

NAMES = st.sampled_from(["a", "b", "train", "serve-1", "x.y"])
VALID_VALUES = {
    "cmd": st.sampled_from(['"echo hi"', '["python", "-c", "pass"]', '"run ${m}"']),
    "kind": st.sampled_from(['"stage"', '"build"', '"train"', '"service"']),
    "gpus": st.sampled_from(['[0, 1]', '"0-7"', '[]', '"3"']),
    "port": st.integers(1, 65535).map(str),
    "stop_signal": st.sampled_from(['"TERM"', '"SIGINT"', '"kill"']),
    "stop_timeout": st.sampled_from(['"30s"', '10', '"1h30m"', '0.5']),
    "stall_after": st.sampled_from(['"5m"', '600', '"500ms"']),
    "log_keep": st.integers(1, 100).map(str),
    "description": st.just('"a job"'),
    "env": st.sampled_from(['{ A = "1" }', '{}', '{ B = 2, C = "${m}" }']),
}
ANY_TOML_VALUE = st.one_of(
    st.integers(-2**70, 2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(
        lambda f: "nan" if f != f else ("inf" if f == float("inf") else ("-inf" if f == float("-inf") else repr(f)))),
    st.booleans().map(lambda b: "true" if b else "false"),
    st.text(max_size=12).map(lambda s: '"' + "".join(
        ch if ch.isalnum() or ch in " -_.$,{}:" else "" for ch in s) + '"'),
    st.sampled_from(['[]', '[1, "a"]', '{}', '{ x = 1 }', '1979-05-27T07:32:00Z', '"${nope}"', '"$${x}"', '"${"',
                     '""', '"SIGSTOP"', '"engine"', '[-1]', '"0,0"', '"9-1"', '["nope"]', '"-5s"']),
)


@st.composite
def documents(draw):
    names = draw(st.lists(NAMES, min_size=1, max_size=4, unique=True))
    lines = ['[vars]', 'm = "/models"']
    value_lines: list[tuple[int, str, str]] = []  # (line, job, key)
    for name in names:
        lines.append("")
        lines.append(f'[jobs."{name}"]')
        keys = ["cmd"] + draw(st.lists(st.sampled_from(sorted(VALID_VALUES)), unique=True, max_size=5))
        for key in dict.fromkeys(keys):
            lines.append(f"{key} = {draw(VALID_VALUES[key])}")
            value_lines.append((len(lines), name, key))
        others = names[: names.index(name)]  # needs only earlier jobs: the document stays acyclic
        if others and draw(st.booleans()):
            lines.append(f'needs = ["{draw(st.sampled_from(others))}"]')
            value_lines.append((len(lines), name, "needs"))
    return lines, value_lines


@PROPERTY
@given(doc=documents(), data=st.data())
def test_mutated_valid_documents(scratch, doc, data):
    lines, value_lines = doc
    path = write(scratch, "\n".join(lines) + "\n", "valid.toml")
    assert list(load_jobs(path).jobs) == list(dict.fromkeys(job for _, job, _ in value_lines))
    assert check_jobs(path) == []

    line_no, job, key = data.draw(st.sampled_from(value_lines))
    mutation = data.draw(st.sampled_from(["value", "rename"]))
    mutated = list(lines)
    if mutation == "value":
        mutated[line_no - 1] = f"{key} = {data.draw(ANY_TOML_VALUE)}"
    else:
        new_key = data.draw(st.sampled_from(["comand", "prot", "needz", "gpu", "x", "stall"]))
        mutated[line_no - 1] = mutated[line_no - 1].replace(key, new_key, 1)
    raw = ("\n".join(mutated) + "\n").encode()
    path = write(scratch, raw, "mutated.toml")
    assert_only_located_errors(path, raw)
    errors = check_jobs(path)
    if mutation == "rename":
        # An unknown key is reported on its own line (and a lost cmd on the job's header).
        assert any(e.line == line_no and "unknown key" in e.message for e in errors), errors
    elif errors and not any(e.message.startswith("TOML syntax") for e in errors):
        # A bad value is reported on its line; a removed dependency can only break the cycle check.
        assert any(e.line == line_no for e in errors), (mutated[line_no - 1], errors)


def test_every_job_key_is_documented():
    text = (REPO / "docs" / "JOBS_TOML.md").read_text(encoding="utf-8")
    missing = [key for key in JOB_KEYS if f"`{key}`" not in text]
    assert not missing


# ---------------------------------------------------------------------------
# `gpudeck check` as a user runs it


def gpudeck(*args: str, cwd: Path = REPO, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k != "GPUDECK_JOBS"}
    full_env["PYTHONPATH"] = str(REPO)
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "gpudeck.console", *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=60)


def test_check_passes_on_the_repository_jobs_toml():
    result = gpudeck("--jobs", str(REPO / "jobs.toml"), "check")
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.fullmatch(r".*jobs\.toml: 9 jobs OK \(vllm-kimi, .*\)\n", result.stdout)


def test_check_reports_one_line_per_error_and_exits_1(tmp_path):
    path = write(tmp_path, '[jobs.a]\ncmd = 1\nneeds = ["b"]\n\n[jobs.b]\ncmd = "x"\nneeds = ["a"]\nprot = 1\n')
    result = gpudeck("--jobs", str(path), "check")
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        f"{path}:2:7: cmd must be a string (run with bash) or a list of strings (argv), got an integer",
        f"{path}:3:10: dependency cycle: a -> b -> a",
        f"{path}:8:1: unknown key 'prot' in job 'b' (did you mean 'port'?)",
    ]
    assert "Traceback" not in result.stderr


def test_check_on_garbage_is_one_line(tmp_path):
    path = write(tmp_path, bytes(range(256)) * 4)
    result = gpudeck("--jobs", str(path), "check")
    assert result.returncode == 1
    assert len(result.stdout.splitlines()) == 1 and "Traceback" not in result.stderr


def test_check_without_a_jobs_file_exits_2(tmp_path):
    result = gpudeck("check", cwd=tmp_path, env={"XDG_CONFIG_HOME": str(tmp_path / "config")})
    assert result.returncode == 2
    assert result.stderr.startswith("gpudeck: no jobs file") and len(result.stderr.splitlines()) == 1
    missing = gpudeck("--jobs", str(tmp_path / "nope.toml"), "check", cwd=tmp_path)
    assert missing.returncode == 2 and "no such file" in missing.stderr


def test_check_finds_jobs_toml_in_the_current_directory(tmp_path):
    write(tmp_path, '[jobs.only]\ncmd = "true"\n')
    result = gpudeck("check", cwd=tmp_path, env={"XDG_CONFIG_HOME": str(tmp_path / "config")})
    assert result.returncode == 0 and result.stdout == f"{tmp_path / 'jobs.toml'}: 1 job OK (only)\n"


# ---------------------------------------------------------------------------
# Discovery order: --jobs, then GPUDECK_JOBS, then ./jobs.toml, then XDG config


def test_discovery_order(tmp_path, monkeypatch):
    cwd = tmp_path / "cwd"
    xdg = tmp_path / "xdg"
    (xdg / "gpudeck").mkdir(parents=True)
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(xdg))
    monkeypatch.delenv("GPUDECK_JOBS", raising=False)

    assert find_jobs_file(None) is None
    (xdg / "gpudeck" / "jobs.toml").write_text("")
    assert find_jobs_file(None) == xdg / "gpudeck" / "jobs.toml"
    (cwd / "jobs.toml").write_text("")
    assert find_jobs_file(None) == cwd / "jobs.toml"
    monkeypatch.setenv("GPUDECK_JOBS", str(tmp_path / "env.toml"))
    assert find_jobs_file(None) == tmp_path / "env.toml"   # named explicitly: returned even if missing
    assert find_jobs_file(str(tmp_path / "flag.toml")) == tmp_path / "flag.toml"


def test_engine_port_comes_from_the_command_line_when_not_declared(tmp_path):
    path = tmp_path / "jobs.toml"
    path.write_text(
        '[jobs.a]\nengine = "vllm"\ncmd = "vllm serve /m --port 8100"\n'
        '[jobs.b]\nengine = "sglang"\ncmd = ["python", "-m", "sglang.launch_server", "--model-path", "/m"]\n'
        '[jobs.c]\nengine = "vllm"\nport = 9000\ncmd = "vllm serve /m --port 8100"\n'
    )
    from gpudeck.jobs.spec import load_jobs
    jobs = load_jobs(path).jobs
    assert jobs["a"].port == 8100          # from --port
    assert jobs["b"].port == 30000         # SGLang's default
    assert jobs["c"].port == 9000          # an explicit port wins
