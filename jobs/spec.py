"""jobs.toml: the declared jobs, loaded and validated (every error located as FILE:LINE:COL)."""
from __future__ import annotations

import bisect
import difflib
import math
import os
import re
import shlex
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, TypeVar, Union

from gpudeck.jobs import notify_targets, paths

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

_T = TypeVar("_T")

JOB_KINDS = ("engine", "build", "train", "stage", "service")
ENGINES = ("vllm", "sglang")
ENGINE_DEFAULT_PORTS = {"vllm": 8000, "sglang": 30000}
STOP_SIGNALS = ("TERM", "INT", "KILL", "HUP", "QUIT", "USR1", "USR2")
BACKENDS = ("local", "slurm")
SLURM_KEYS = ("partition", "nodes", "gpus_per_node", "time", "account", "sbatch_args")
# sbatch options gpudeck sets itself for every Slurm run: the run's contract depends on them.
SBATCH_OWNED = ("--output", "-o", "--error", "-e", "--parsable", "--dependency", "-d", "--job-name", "-J",
                "--chdir", "-D", "--wrap", "--kill-on-invalid-dep", "--open-mode")

# A jobs.toml is a few KiB; anything this large is a wrong path, not a config,
# and parsing it whole would only waste memory.
MAX_FILE_BYTES = 4 * 1024 * 1024

# `${var}` expansion is bounded: 28 lines of `v_i = "${v_(i-1)}${v_(i-1)}"` (545 bytes)
# once grew to 2.6 GB. One value never needs more than 64 KiB (Linux refuses a single
# argv or environment string over 128 KiB, MAX_ARG_STRLEN, and every expanded value
# ends up as one); all the substitutions of a file together stay under 32 MiB (20,000
# jobs using a 1 KiB var each come to 20 MiB); vars nest at most 32 deep (real files
# nest 2 or 3; the bound also keeps resolving a long chain off the recursion limit).
MAX_EXPANDED_CHARS = 64 * 1024
MAX_EXPANSION_TOTAL = 32 * 1024 * 1024
MAX_VAR_DEPTH = 32


@dataclass(frozen=True)
class JobSpec:
    """One `[jobs.NAME]` table, with defaults applied and `${vars}` expanded."""

    name: str
    cmd: Union[str, tuple[str, ...]]           # str: run with `bash -c`; tuple: argv
    cwd: Optional[str] = None                   # absolute (relative ones resolve against jobs.toml's dir)
    env: dict[str, str] = field(default_factory=dict)
    kind: str = "stage"
    gpus: tuple[int, ...] = ()                  # -> CUDA_VISIBLE_DEVICES
    port: Optional[int] = None
    needs: tuple[str, ...] = ()
    done_when: Optional[str] = None             # absolute path; exists -> the stage counts as done
    stop_signal: str = "TERM"                   # without the SIG prefix
    stop_timeout: float = 30.0                  # seconds
    stall_after: Optional[float] = None         # seconds; None -> a default per kind and phase
    dump_on_stall: bool = True                  # a stall alert takes one py-spy stack dump (stacks/ in the run dir)
    log_keep: int = 20                          # runs of this job kept on disk
    engine: Optional[str] = None                # "vllm" | "sglang"
    python: Optional[str] = None                # interpreter of the engine's environment
    model: Optional[str] = None                 # for display and doctor's disk check
    health_path: Optional[str] = None           # None -> the engine profile's default
    metrics_path: Optional[str] = None          # None -> the engine profile's default
    on_alert: Optional[str] = None              # shell command fired with GPUDECK_ALERT_* env
    description: Optional[str] = None
    backend: str = "local"                      # "local" (a runner on this box) | "slurm" (sbatch)
    partition: Optional[str] = None             # slurm: --partition
    nodes: Optional[int] = None                 # slurm: --nodes
    gpus_per_node: Optional[int] = None         # slurm: --gres=gpu:N
    time: Optional[str] = None                  # slurm: --time, in Slurm's own format ("90", "1:30:00", "2-00")
    account: Optional[str] = None               # slurm: --account
    sbatch_args: tuple[str, ...] = ()           # slurm: more sbatch options, passed as they are
    line: int = 0                               # where the table starts in jobs.toml (1-based)


@dataclass(frozen=True)
class JobsFile:
    path: Path
    jobs: dict[str, JobSpec]                    # in file order
    vars: dict[str, str] = field(default_factory=dict)
    on_alert: Optional[str] = None              # file-wide default for jobs without their own
    notify: dict[str, dict] = field(default_factory=dict)   # [notify.NAME] webhook targets (notify_targets)

    def alert_command(self, job: str) -> Optional[str]:
        """The on_alert command for a job: its own, else the file-wide default."""
        spec = self.jobs.get(job)
        own = spec.on_alert if spec is not None else None
        return own if own is not None else self.on_alert


def command_text(cmd: Union[str, tuple[str, ...], list[str]]) -> str:
    """A job's cmd as one line to show: a bash string as written, an argv quoted as the shell would read it."""
    if isinstance(cmd, str):
        return cmd
    return shlex.join(str(part) for part in cmd)


def spec_snapshot(spec: JobSpec) -> dict:
    """The spec as plain JSON (tuples as lists): what a run's meta.json and a pipeline record keep."""
    data = asdict(spec)
    for key, value in list(data.items()):
        if isinstance(value, tuple):
            data[key] = list(value)
    return data


def file_settings(jobs_file: JobsFile) -> dict:
    """The file-wide settings (every JobsFile field but path and jobs) as plain JSON.

    A pipeline records them beside its stages' specs and rebuilds its JobsFile from
    both: listing the fields here, not there, means a new file-wide setting is carried too.
    """
    return {f.name: getattr(jobs_file, f.name) for f in fields(JobsFile) if f.name not in ("path", "jobs")}


def jobs_file_from_snapshot(path: Union[str, Path], jobs: dict[str, JobSpec], settings: dict) -> JobsFile:
    """A JobsFile from its jobs and file_settings(); settings this version does not know are ignored."""
    names = {f.name for f in fields(JobsFile)} - {"path", "jobs"}
    return JobsFile(path=Path(path), jobs=jobs, **{k: v for k, v in settings.items() if k in names})


def spec_from_snapshot(data: dict) -> JobSpec:
    """The JobSpec back from spec_snapshot(); keys this version does not know are ignored."""
    names = {f.name for f in fields(JobSpec)}
    kwargs = {k: v for k, v in data.items() if k in names}
    for key in ("gpus", "needs", "sbatch_args"):
        if key in kwargs and kwargs[key] is not None:
            kwargs[key] = tuple(kwargs[key])
    if isinstance(kwargs.get("cmd"), list):
        kwargs["cmd"] = tuple(kwargs["cmd"])
    return JobSpec(**kwargs)


class SpecError(Exception):
    """A located problem in a jobs file; str() is `FILE:LINE:COL: message` (or `FILE:LINE: message`)."""

    def __init__(self, path: Union[str, Path], line: Optional[int], col: Optional[int], message: str,
                 errors: Optional[list["SpecError"]] = None) -> None:
        self.path = str(path)
        self.line = line
        self.col = col
        self.message = message
        # load_jobs raises the first error; the rest ride along for callers that want them.
        self.errors = errors if errors is not None else [self]
        super().__init__(str(self))

    def __str__(self) -> str:
        if self.line is None:
            return f"{self.path}: {self.message}"
        if self.col is None:
            return f"{self.path}:{self.line}: {self.message}"
        return f"{self.path}:{self.line}:{self.col}: {self.message}"


# ---------------------------------------------------------------------------
# Public entry points


def load_jobs(path: Union[str, Path]) -> JobsFile:
    """Load and validate a jobs file; raise SpecError (the first, by position) on any problem."""
    jobs_file, errors = _load(Path(path))
    if errors:
        raise SpecError(errors[0].path, errors[0].line, errors[0].col, errors[0].message, errors)
    assert jobs_file is not None
    return jobs_file


def check_jobs(path: Union[str, Path]) -> list[SpecError]:
    """Every problem found in a jobs file, in file order; empty when it is valid."""
    return _load(Path(path))[1]


def load_user_notify(path: Union[str, Path, None] = None) -> tuple[dict[str, dict], list[SpecError]]:
    """The [notify.NAME] tables of the user's config.toml (targets for every jobs file), with located errors.

    A missing file has none; its other keys (theme…) belong to the console and are not read here.
    """
    path = Path(path) if path is not None else paths.config_dir() / "config.toml"
    try:
        with paths.open_regular(path) as fh:
            data = fh.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        return {}, []
    except paths.NotARegularFile as exc:
        return {}, [SpecError(path, None, None, f"cannot read: {exc.what}")]
    except OSError as exc:
        return {}, [SpecError(path, None, None, f"cannot read: {exc.strerror or exc}")]
    if len(data) > MAX_FILE_BYTES:
        return {}, [SpecError(path, 1, None, f"file is larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB")]
    text, error = _decode(path, data)
    if error is not None:
        return {}, [error]
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        return {}, [_toml_error(path, text, exc)]
    except Exception as exc:  # noqa: BLE001 - nesting, a 5000-digit integer: still one located line
        return {}, [SpecError(path, 1, None, f"invalid TOML: {_one_line(str(exc))}")]
    if "notify" not in document:
        return {}, []
    validator = _Validator(path, text, document)
    validator._no_nul(document["notify"], ("notify",))
    targets = validator.notify(document["notify"])
    errors = sorted(validator.errors, key=lambda e: (e.line or 0, e.col or 0))
    return ({} if errors else targets), errors


def pipeline_order(jobs_file: JobsFile, target: str) -> list[str]:
    """`target` and everything it needs, transitively, in an order that respects `needs`.

    The file has been validated, so names exist and there are no cycles; ties keep file order.
    """
    order: list[str] = []
    seen: set[str] = set()

    def visit(name: str) -> None:
        if name in seen:
            return
        seen.add(name)
        for dep in jobs_file.jobs[name].needs:
            visit(dep)
        order.append(name)

    visit(target)
    return order


def parse_duration(value: Any) -> float:
    """Seconds from a number or a string like "30s", "5m", "1h30m", "500ms"; ValueError if not."""
    if isinstance(value, bool):
        raise ValueError("expected a duration, got a boolean")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().lower()
        if not text:
            raise ValueError("empty duration")
        if _NUMBER_RE.fullmatch(text):
            seconds = float(text)
        elif _DURATION_RE.fullmatch(text):
            seconds = sum(float(num) * _UNIT_SECONDS[unit] for num, unit in _DURATION_PART_RE.findall(text))
        else:
            raise ValueError(f"bad duration {_show(value)} (use seconds, or e.g. \"30s\", \"5m\", \"1h30m\", \"500ms\")")
    else:
        raise ValueError(f"expected a duration (seconds or a string like \"5m\"), got {_type_name(value)}")
    if math.isnan(seconds) or math.isinf(seconds):
        raise ValueError(f"bad duration {_show(value)}")
    if seconds < 0:
        raise ValueError(f"duration must not be negative, got {_show(value)}")
    return seconds


_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_NUMBER_RE = re.compile(r"\d+(?:\.\d+)?")
_DURATION_PART_RE = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)")
_DURATION_RE = re.compile(r"(?:\d+(?:\.\d+)?\s*(?:ms|s|m|h|d)\s*)+")

# ---------------------------------------------------------------------------
# Reading and parsing

_TOML_POS_RE = re.compile(r"\(at line (\d+), column (\d+)\)\s*$")
_TOML_END_RE = re.compile(r"\(at end of document\)\s*$")


def _load(path: Path) -> tuple[Optional[JobsFile], list[SpecError]]:
    try:
        with paths.open_regular(path) as fh:
            data = fh.read(MAX_FILE_BYTES + 1)
    except paths.NotARegularFile as exc:
        return None, [SpecError(path, None, None, f"cannot read: {exc.what}")]
    except OSError as exc:
        return None, [SpecError(path, None, None, f"cannot read: {exc.strerror or exc}")]
    if len(data) > MAX_FILE_BYTES:
        return None, [SpecError(path, 1, None,
                                f"file is larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB; is this really a jobs.toml?")]
    text, error = _decode(path, data)
    if error is not None:
        return None, [error]
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        return None, [_toml_error(path, text, exc)]
    except RecursionError:
        return None, [SpecError(path, 1, None, "TOML nesting is too deep")]
    except Exception as exc:  # noqa: BLE001 - e.g. ValueError for a 5000-digit integer
        return None, [SpecError(path, 1, None, f"invalid TOML: {_one_line(str(exc))}")]
    try:
        validator = _Validator(path, text, document)
        jobs_file = validator.run()
    except RecursionError:
        return None, [SpecError(path, 1, None, "TOML nesting is too deep")]
    except Exception as exc:  # noqa: BLE001 - a bug here must still never be a traceback
        return None, [SpecError(path, 1, None, f"internal error while validating ({type(exc).__name__}: "
                                               f"{_one_line(str(exc))}); please report it")]
    errors = sorted(validator.errors, key=lambda e: (e.line or 0, e.col or 0))
    return (None if errors else jobs_file), errors


def _decode(path: Path, data: bytes) -> tuple[str, Optional[SpecError]]:
    if data.startswith(b"\xef\xbb\xbf"):  # editors on some systems write a BOM; TOML parsers reject it
        data = data[3:]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        before = data[: exc.start]
        line = before.count(b"\n") + 1
        line_start = before.rfind(b"\n") + 1
        col = len(before[line_start:].decode("utf-8", errors="replace")) + 1
        return "", SpecError(path, line, col, f"not valid UTF-8 (byte 0x{data[exc.start]:02x})")
    if "\x00" in text:
        # tomllib would say "Invalid statement"; NUL almost always means a binary file.
        offset = text.index("\x00")
        line, col = _line_col(text, offset)
        return "", SpecError(path, line, col, "NUL byte: this looks like a binary file, not TOML")
    return text, None


def _toml_error(path: Path, text: str, exc: Exception) -> SpecError:
    message = str(exc)
    match = _TOML_POS_RE.search(message)
    if match:
        line, col = int(match.group(1)), int(match.group(2))
        reason = message[: match.start()].strip()
    elif _TOML_END_RE.search(message):
        line, col = _line_col(text, len(text))
        reason = _TOML_END_RE.sub("", message).strip() + " at end of file"
    else:
        line, col, reason = 1, None, message
    if reason == "Illegal character '\\n'":
        reason += " (a string left open? close the quote, or use \"\"\" for text over several lines)"
    return SpecError(path, line, col, f"TOML syntax: {_one_line(reason)}")


def _line_col(text: str, offset: int) -> tuple[int, int]:
    """1-based line and column of a character offset, counting lines by "\\n" as tomllib does."""
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


# ---------------------------------------------------------------------------
# Locating keys and values in the source
#
# tomllib returns plain dicts without positions, so semantic errors are located by
# re-scanning the (already known valid) source: each table header, key and value
# is recorded under its path, e.g. ("jobs", "train", "needs", 1) for the second
# element of that array. Anything the scanner cannot follow falls back to the
# nearest recorded parent, then to line 1.


@dataclass(frozen=True)
class _Pos:
    key: tuple[int, int]
    value: tuple[int, int]


_BARE_KEY_RE = re.compile(r"[A-Za-z0-9_-]+")


class _Locator:
    def __init__(self, text: str) -> None:
        self.text = text
        self.line_starts = [0] + [m.end() for m in re.finditer("\n", text)]
        self.positions: dict[tuple, _Pos] = {}
        self.array_table_counts: dict[tuple, int] = {}
        try:
            self._scan()
        except (RecursionError, IndexError, ValueError):
            pass  # partial positions are still useful; lookups fall back to parents

    def where(self, path: tuple, part: str = "key") -> tuple[int, Optional[int]]:
        probe = tuple(path)
        while probe:
            pos = self.positions.get(probe)
            if pos is not None:
                return pos.key if part == "key" else pos.value
            probe = probe[:-1]
        return 1, None

    def has(self, path: tuple) -> bool:
        return tuple(path) in self.positions

    # -- scanning ----------------------------------------------------------

    def _lc(self, i: int) -> tuple[int, int]:
        row = bisect.bisect_right(self.line_starts, i) - 1
        return row + 1, i - self.line_starts[row] + 1

    def _record(self, path: tuple, key_at: int, value_at: int) -> None:
        if path not in self.positions:
            self.positions[path] = _Pos(self._lc(key_at), self._lc(value_at))

    def _skip_ws(self, i: int) -> int:
        s = self.text
        while i < len(s) and s[i] in " \t":
            i += 1
        return i

    def _skip_blank(self, i: int) -> int:
        """Whitespace, newlines and comments."""
        s = self.text
        while i < len(s):
            c = s[i]
            if c in " \t\r\n":
                i += 1
            elif c == "#":
                j = s.find("\n", i)
                i = len(s) if j < 0 else j + 1
            else:
                break
        return i

    def _scan(self) -> None:
        s = self.text
        table: tuple = ()
        i = 0
        while True:
            i = self._skip_blank(i)
            if i >= len(s):
                return
            start = i
            if s.startswith("[[", i):
                parts, i = self._key(self._skip_ws(i + 2))
                i = self._skip_ws(i)
                i += 2  # "]]"
                name = tuple(parts)
                self._record_parents(name, start)
                self._record(name, start, start)
                index = self.array_table_counts.get(name, 0)
                self.array_table_counts[name] = index + 1
                table = name + (index,)
                self._record(table, start, start)
            elif s[i] == "[":
                parts, i = self._key(self._skip_ws(i + 1))
                i = self._skip_ws(i)
                i += 1  # "]"
                table = tuple(parts)
                self._record_parents(table, start)
                self._record(table, start, start)
            else:
                i = self._key_value(i, table)
            # rest of the line: trailing whitespace and comment
            i = self._skip_ws(i)
            if i < len(s) and s[i] == "#":
                j = s.find("\n", i)
                i = len(s) if j < 0 else j

    def _record_parents(self, path: tuple, at: int) -> None:
        for n in range(1, len(path)):
            self._record(path[:n], at, at)

    def _key_value(self, i: int, table: tuple) -> int:
        key_at = i
        parts, i = self._key(i)
        i = self._skip_ws(i)
        if i >= len(self.text) or self.text[i] != "=":
            raise ValueError("expected '='")
        i = self._skip_ws(i + 1)
        path = table + tuple(parts)
        for n in range(len(table) + 1, len(path)):
            self._record(path[:n], key_at, key_at)  # dotted keys create their parent tables here
        self._record(path, key_at, i)
        return self._value(i, path)

    def _key(self, i: int) -> tuple[list[str], int]:
        parts: list[str] = []
        s = self.text
        while True:
            i = self._skip_ws(i)
            if i < len(s) and s[i] in "\"'":
                quote = s[i]
                j = i + 1
                while s[j] != quote:
                    j += 2 if (quote == '"' and s[j] == "\\") else 1
                raw = s[i: j + 1]
                parts.append(tomllib.loads(f"k = {raw}")["k"])
                i = j + 1
            else:
                match = _BARE_KEY_RE.match(s, i)
                if not match:
                    raise ValueError("expected a key")
                parts.append(match.group())
                i = match.end()
            i = self._skip_ws(i)
            if i < len(s) and s[i] == ".":
                i += 1
                continue
            return parts, i

    def _value(self, i: int, path: tuple) -> int:
        s = self.text
        if s.startswith('"""', i) or s.startswith("'''", i):
            quote = s[i: i + 3]
            j = i + 3
            while not s.startswith(quote, j):
                j += 2 if (quote == '"""' and s[j] == "\\") else 1
            j += 3
            extra = 0
            while extra < 2 and j < len(s) and s[j] == quote[0]:  # content may end in one or two quotes
                j += 1
                extra += 1
            return j
        if s[i] in "\"'":
            quote = s[i]
            j = i + 1
            while s[j] != quote:
                j += 2 if (quote == '"' and s[j] == "\\") else 1
            return j + 1
        if s[i] == "[":
            i += 1
            index = 0
            while True:
                i = self._skip_blank(i)
                if s[i] == "]":
                    return i + 1
                self._record(path + (index,), i, i)
                i = self._value(i, path + (index,))
                index += 1
                i = self._skip_blank(i)
                if s[i] == ",":
                    i += 1
        if s[i] == "{":
            i += 1
            while True:
                i = self._skip_blank(i)
                if s[i] == "}":
                    return i + 1
                i = self._key_value(i, path)
                i = self._skip_blank(i)
                if s[i] == ",":
                    i += 1
        j = i
        while j < len(s) and s[j] not in ",]}#\n":
            j += 1
        return j


# ---------------------------------------------------------------------------
# Validation


_JOB_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_VAR_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_GPU_RANGE_RE = re.compile(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?")
_SLURM_NAME_RE = re.compile(r"[A-Za-z0-9_.-]+(?:,[A-Za-z0-9_.-]+)*")
# Slurm's --time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S.
_SLURM_TIME_RE = re.compile(r"\d+(?::\d{1,2}){0,2}|\d+-\d{1,2}(?::\d{1,2}){0,2}")

TOP_LEVEL_KEYS = ("jobs", "vars", "on_alert", "alerts", "notify")
ALERTS_KEYS = ("on_alert",)
JOB_KEYS = (
    "cmd", "cwd", "env", "kind", "gpus", "port", "needs", "done_when", "stop_signal",
    "stop_timeout", "stall_after", "dump_on_stall", "log_keep", "engine", "python", "model",
    "health_path", "metrics_path", "on_alert", "description",
    "backend", *SLURM_KEYS,
)
# Keys whose string values get `${var}` expansion.
_EXPANDED_KEYS = ("cmd", "cwd", "env", "done_when", "model", "python", "on_alert")


class _Invalid(Exception):
    """One value failed validation; carries where (key or value) and why."""

    def __init__(self, message: str, path: tuple, part: str = "value", offset: Optional[int] = None) -> None:
        super().__init__(message)
        self.message = message
        self.path = path
        self.part = part
        self.offset = offset  # character offset inside a string value, when known


class _Validator:
    def __init__(self, path: Path, text: str, document: dict) -> None:
        self.path = path
        self.text = text
        self.document = document
        self.locator = _Locator(text)
        self.errors: list[SpecError] = []
        self.vars: dict[str, str] = {}
        self.var_names: set[str] = set()   # declared, including those that failed to resolve
        self.budget = _Budget(MAX_EXPANSION_TOTAL)
        self._order: Optional[dict[str, int]] = None   # jobs' positions, once a cycle is reported

    # -- reporting ---------------------------------------------------------

    def error(self, message: str, path: tuple, part: str = "value", offset: Optional[int] = None) -> None:
        line, col = self.locator.where(path, part)
        if offset is not None and col is not None and part == "value" and self.locator.has(path):
            line, col = self._inside_string(path, line, col, offset)
        self.errors.append(SpecError(self.path, line, col, _one_line(message)))

    def _inside_string(self, path: tuple, line: int, col: int, offset: int) -> tuple[int, int]:
        """Point into a string value when its source text is its value (no escapes in the way)."""
        value = _dig(self.document, path)
        start = self.locator.line_starts[line - 1] + col - 1
        s = self.text
        if not isinstance(value, str) or start >= len(s) or s[start] not in "\"'":
            return line, col
        if s.startswith(s[start] * 3, start):
            content = start + 3
            if s.startswith("\n", content):  # TOML drops a newline right after the opening quotes
                content += 1
            elif s.startswith("\r\n", content):
                content += 2
        else:
            content = start + 1
        if s[content: content + offset] == value[:offset]:  # else an escape or CRLF shifts it: keep the start
            return _line_col(s, content + offset)
        return line, col

    # -- the document ------------------------------------------------------

    def _no_nul(self, value: Any, path: tuple) -> None:
        """A NUL byte fits no command line, path or environment: refused here, in every key and string."""
        if isinstance(value, dict):
            for key, item in value.items():
                if "\0" in key:
                    self.error("NUL byte (\\0) in a key", path + (key,), "key")
                self._no_nul(item, path + (key,))
        elif isinstance(value, list):
            for i, item in enumerate(value):
                self._no_nul(item, path + (i,))
        elif isinstance(value, str) and "\0" in value:
            self.error("NUL byte (\\0) in a string: no command, path or environment value can hold one",
                       path, "value")

    def run(self) -> JobsFile:
        doc = self.document
        self._no_nul(doc, ())
        for key in doc:
            if key not in TOP_LEVEL_KEYS:
                self.error(f"unknown top-level key {key!r}{_suggest(key, TOP_LEVEL_KEYS)}", (key,), "key")
        self._vars(doc.get("vars"))
        file_on_alert = self._file_on_alert()
        jobs_table = doc.get("jobs")
        jobs: dict[str, JobSpec] = {}
        if jobs_table is None:
            if self.errors:
                pass  # likely a misspelt [jobs...] table, already reported with a suggestion
            else:
                self.errors.append(SpecError(self.path, 1, None,
                                             "no [jobs.NAME] tables: declare at least one job"))
        elif not isinstance(jobs_table, dict):
            self.error(f"'jobs' must be a table of [jobs.NAME] tables, got {_type_name(jobs_table)}", ("jobs",))
        else:
            if not jobs_table:
                self.error("'jobs' declares no job", ("jobs",), "key")
            # One set for every job: building it per job made `check` quadratic (10,000 jobs: 9.3 s).
            all_names = set(jobs_table)
            for name, table in jobs_table.items():
                spec = self._job(name, table, all_names)
                if spec is not None:
                    jobs[name] = spec
            self._cycles(jobs_table)
        notify = self.notify(doc["notify"]) if "notify" in doc else {}
        return JobsFile(path=self.path, jobs=jobs, vars=dict(self.vars), on_alert=file_on_alert, notify=notify)

    def notify(self, table: Any) -> dict[str, dict]:
        """[notify.NAME] tables, validated by gpudeck.jobs.notify_targets with this file's locations and vars."""
        return notify_targets.validate(table, ("notify",), self.error,
                                       lambda value, where: self._checked(lambda: self._string(value, where, True)),
                                       source=str(self.path))

    def _file_on_alert(self) -> Optional[str]:
        doc = self.document
        value: Optional[str] = None
        if "on_alert" in doc:
            value = self._checked(lambda: self._string(doc["on_alert"], ("on_alert",), expand=True))
        alerts = doc.get("alerts")
        if alerts is None:
            return value
        if not isinstance(alerts, dict):
            self.error(f"'alerts' must be a table, got {_type_name(alerts)}", ("alerts",))
            return value
        for key in alerts:
            if key not in ALERTS_KEYS:
                self.error(f"unknown key {key!r} in [alerts]{_suggest(key, ALERTS_KEYS)}", ("alerts", key), "key")
        if "on_alert" in alerts:
            if "on_alert" in doc:
                self.error("on_alert is set both at the top level and in [alerts]; keep one",
                           ("alerts", "on_alert"), "key")
            else:
                value = self._checked(lambda: self._string(alerts["on_alert"], ("alerts", "on_alert"), expand=True))
        return value

    def _checked(self, fn: Callable[[], _T]) -> Optional[_T]:
        try:
            return fn()
        except _Invalid as bad:
            self.error(bad.message, bad.path, bad.part, bad.offset)
        except _Unresolved:
            pass  # the variable's own error was reported
        return None

    # -- vars --------------------------------------------------------------

    def _vars(self, table: Any) -> None:
        if table is None:
            return
        if not isinstance(table, dict):
            self.error(f"'vars' must be a table of strings, got {_type_name(table)}", ("vars",))
            return
        raw: dict[str, str] = {}
        for name, value in table.items():
            where = ("vars", name)
            if not _VAR_NAME_RE.fullmatch(name):
                self.error(f"bad variable name {name!r} (letters, digits, '_' and '-'; not starting with a digit)",
                           where, "key")
                continue
            if isinstance(value, bool) or not isinstance(value, (str, int, float)):
                self.error(f"variable {name!r} must be a string, got {_type_name(value)}", where)
                continue
            raw[name] = value if isinstance(value, str) else str(value)
        # Vars may use each other in any order; resolve depth-first and name any cycle.
        resolved: dict[str, str] = {}
        depth: dict[str, int] = {}         # the longest chain of vars a var's value goes through, itself included
        failed: set[str] = set()
        too_deep = False                   # reported once: a chain of 2,000 would otherwise say it 62 times

        def resolve(name: str, chain: list[str]) -> Optional[str]:
            if name in resolved:
                return resolved[name]
            if name in failed:
                return None
            if name in chain:
                cycle = chain[chain.index(name):] + [name]
                self.error("variables refer to each other in a cycle: " + " -> ".join(f"${{{n}}}" for n in cycle),
                           ("vars", cycle[0]))
                failed.update(cycle)
                return None
            deepest = 0

            def deeper(ref: str) -> None:
                nonlocal too_deep
                if too_deep:
                    raise _Unresolved(ref)
                too_deep = True
                raise _Limit(f"${{{ref}}} nests [vars] more than {MAX_VAR_DEPTH} deep (a var using a var "
                             "using a var...); flatten the chain")

            def lookup(ref: str) -> Optional[str]:
                nonlocal deepest
                if ref not in raw:
                    return None
                # The chain check comes first: it stops a long chain before it recurses through it.
                if len(chain) + 2 > MAX_VAR_DEPTH:
                    deeper(ref)
                value = resolve(ref, chain + [name])
                if value is not None:
                    if depth[ref] + 1 > MAX_VAR_DEPTH:
                        deeper(ref)
                    deepest = max(deepest, depth[ref])
                return value

            try:
                value = _expand(raw[name], lookup, ("vars", name), known=raw, budget=self.budget)
            except _Invalid as bad:
                self.error(bad.message, bad.path, bad.part, bad.offset)
                failed.add(name)
                return None
            except _Unresolved:
                failed.add(name)
                return None
            resolved[name] = value
            depth[name] = deepest + 1
            return value

        for name in raw:
            resolve(name, [])
        self.vars = resolved
        self.var_names = set(raw)

    def _lookup_var(self, ref: str) -> Optional[str]:
        return self.vars.get(ref)

    # -- one job -----------------------------------------------------------

    def _job(self, name: str, table: Any, all_names: set[str]) -> Optional[JobSpec]:
        where = ("jobs", name)
        ok = True
        if not _JOB_NAME_RE.fullmatch(name) or len(name) > 64:
            self.error(f"bad job name {name!r}: use letters, digits, '.', '_' and '-' (at most 64), "
                       "starting with a letter or digit", where, "key")
            ok = False
        if not isinstance(table, dict):
            self.error(f"job {name!r} must be a table ([jobs.{name}]), got {_type_name(table)}", where)
            return None
        for key in table:
            if key not in JOB_KEYS:
                self.error(f"unknown key {key!r} in job {name!r}{_suggest(key, JOB_KEYS)}", where + (key,), "key")
                ok = False
        if "cmd" not in table:
            self.error(f"job {name!r} has no cmd (the command to run)", where, "key")
            ok = False
        fields: dict[str, Any] = {}
        errors_before = len(self.errors)
        for key in JOB_KEYS:
            if key in table:
                try:
                    fields[key] = self._job_value(key, table[key], where + (key,), name, all_names)
                except _Invalid as bad:
                    self.error(bad.message, bad.path, bad.part, bad.offset)
                except _Unresolved:
                    ok = False  # the variable's own error was reported
        if len(self.errors) != errors_before:
            ok = False
        engine = fields.get("engine")
        if engine is not None:
            kind = fields.get("kind")
            if "kind" in table and kind is not None and kind != "engine":
                self.error(f"job {name!r} sets engine = {engine!r}, so its kind is 'engine', not {kind!r}",
                           where + ("kind",))
                ok = False
            fields["kind"] = "engine"
            if "port" not in fields:
                fields["port"] = _port_from_command(fields.get("cmd")) or ENGINE_DEFAULT_PORTS[engine]
        if fields.get("backend") == "slurm":
            if "gpus" in table:
                self.error(f"job {name!r} runs on Slurm: gpus picks GPUs of this box; "
                           "use gpus_per_node (Slurm chooses the GPUs)", where + ("gpus",), "key")
                ok = False
        elif "backend" not in table or fields.get("backend") == "local":
            for key in SLURM_KEYS:
                if key in table:
                    self.error(f"{key} is a Slurm setting: add backend = \"slurm\" to job {name!r} "
                               "(or remove it)", where + (key,), "key")
                    ok = False
        if not ok:
            return None
        if fields.get("done_when") is not None:
            # A relative marker lives where the job runs, as it would for the job itself.
            base = Path(fields["cwd"]) if fields.get("cwd") else self.path.parent
            fields["done_when"] = self._absolute(fields["done_when"], base, where + ("done_when",))
        fields = {k: v for k, v in fields.items() if v is not None}
        line = self.locator.where(where, "key")[0]
        return JobSpec(name=name, line=line, **fields)

    def _job_value(self, key: str, value: Any, where: tuple, job: str, all_names: set[str]) -> Any:
        expand = key in _EXPANDED_KEYS
        if key == "cmd":
            if isinstance(value, str):
                text = self._string(value, where, expand=True)
                if not text.strip():
                    raise _Invalid("cmd is empty", where)
                return text
            if isinstance(value, list):
                if not value:
                    raise _Invalid("cmd is an empty list (give a command line string or an argv list)", where)
                argv = []
                for index, item in enumerate(value):
                    if not isinstance(item, str):
                        raise _Invalid(f"cmd list items must be strings, item {index + 1} is {_type_name(item)}",
                                       where + (index,))
                    argv.append(self._string(item, where + (index,), expand=True))
                if not argv[0]:
                    raise _Invalid("cmd's first item (the program) is empty", where + (0,))
                return tuple(argv)
            raise _Invalid(f"cmd must be a string (run with bash) or a list of strings (argv), "
                           f"got {_type_name(value)}", where)
        if key == "env":
            if not isinstance(value, dict):
                raise _Invalid(f"env must be a table of NAME = \"value\", got {_type_name(value)}", where)
            env: dict[str, str] = {}
            for var, val in value.items():
                if not _ENV_NAME_RE.fullmatch(var):
                    self.error(f"bad environment variable name {var!r}", where + (var,), "key")
                    continue
                if isinstance(val, bool) or not isinstance(val, (str, int, float)):
                    self.error(f"env {var} must be a string (or a number), got {_type_name(val)}", where + (var,))
                    continue
                try:
                    env[var] = self._string(val, where + (var,), expand=True) if isinstance(val, str) else str(val)
                except _Invalid as bad:
                    self.error(bad.message, bad.path, bad.part, bad.offset)
            return env
        if key == "kind":
            if not isinstance(value, str) or value not in JOB_KINDS:
                raise _Invalid(f"kind must be one of {', '.join(JOB_KINDS)}; got {_show(value)}"
                               f"{_suggest(value, JOB_KINDS) if isinstance(value, str) else ''}", where)
            return value
        if key == "engine":
            if not isinstance(value, str) or value not in ENGINES:
                raise _Invalid(f"engine must be one of {', '.join(ENGINES)}; got {_show(value)}"
                               f"{_suggest(value, ENGINES) if isinstance(value, str) else ''}", where)
            return value
        if key == "gpus":
            return self._gpus(value, where)
        if key == "port":
            if isinstance(value, bool) or not isinstance(value, int):
                raise _Invalid(f"port must be an integer 1..65535, got {_type_name(value)}", where)
            if not 1 <= value <= 65535:
                raise _Invalid(f"port must be 1..65535, got {_show(value)}", where)
            return value
        if key == "needs":
            items = [value] if isinstance(value, str) else value
            if not isinstance(items, list):
                raise _Invalid(f"needs must be a list of job names, got {_type_name(value)}", where)
            needs: list[str] = []
            seen: set[str] = set()
            for index, dep in enumerate(items):
                at = where if isinstance(value, str) else where + (index,)
                if not isinstance(dep, str):
                    self.error(f"needs items must be job names (strings), got {_type_name(dep)}", at)
                elif dep == job:
                    self.error(f"job {job!r} needs itself", at)
                elif dep not in all_names:
                    self.error(f"job {job!r} needs unknown job {dep!r}{_suggest(dep, sorted(all_names))}", at)
                elif dep in seen:
                    self.error(f"job {job!r} lists {dep!r} twice in needs", at)
                else:
                    needs.append(dep)
                    seen.add(dep)
            return tuple(needs)
        if key == "dump_on_stall":
            if not isinstance(value, bool):
                raise _Invalid(f"dump_on_stall must be true or false, got {_type_name(value)}", where)
            return value
        if key == "stop_signal":
            if not isinstance(value, str):
                raise _Invalid(f"stop_signal must be a signal name like \"TERM\", got {_type_name(value)}", where)
            name = value.strip().upper()
            if name.startswith("SIG"):
                name = name[3:]
            if name not in STOP_SIGNALS:
                raise _Invalid(f"stop_signal must be one of {', '.join(STOP_SIGNALS)} (SIG prefix optional); "
                               f"got {_show(value)}", where)
            return name
        if key in ("stop_timeout", "stall_after"):
            try:
                seconds = parse_duration(value)
            except ValueError as exc:
                raise _Invalid(f"{key}: {exc}", where) from None
            if key == "stall_after" and seconds <= 0:
                raise _Invalid("stall_after must be longer than zero", where)
            return seconds
        if key == "backend":
            if not isinstance(value, str) or value not in BACKENDS:
                raise _Invalid(f"backend must be one of {', '.join(BACKENDS)}; got {_show(value)}"
                               f"{_suggest(value, BACKENDS) if isinstance(value, str) else ''}", where)
            return value
        if key in ("nodes", "gpus_per_node"):
            least = 1 if key == "nodes" else 0
            if isinstance(value, bool) or not isinstance(value, int):
                raise _Invalid(f"{key} must be an integer, got {_type_name(value)}", where)
            if not least <= value <= 100000:
                raise _Invalid(f"{key} must be at least {least}, got {_show(value)}", where)
            return value
        if key == "time":
            return _slurm_time(value, where)
        if key in ("partition", "account"):
            text = self._string(value, where, expand=False)
            if not _SLURM_NAME_RE.fullmatch(text):
                raise _Invalid(f"{key} must be a Slurm {key} name (letters, digits, '_', '-', '.', "
                               f"',' between several), got {_show(text)}", where)
            return text
        if key == "sbatch_args":
            if not isinstance(value, list):
                raise _Invalid(f"sbatch_args must be a list of strings like [\"--mem=64G\"], "
                               f"got {_type_name(value)}", where)
            args: list[str] = []
            for index, item in enumerate(value):
                if not isinstance(item, str):
                    raise _Invalid(f"sbatch_args items must be strings, item {index + 1} is {_type_name(item)}",
                                   where + (index,))
                owned = _sbatch_owned(item)
                if owned:
                    raise _Invalid(f"sbatch_args: gpudeck sets {owned} itself (output goes to the run "
                                   "directory, needs become --dependency)", where + (index,))
                if not item.strip():
                    raise _Invalid("sbatch_args: empty item", where + (index,))
                args.append(item)
            return tuple(args)
        if key == "log_keep":
            if isinstance(value, bool) or not isinstance(value, int):
                raise _Invalid(f"log_keep must be a positive integer, got {_type_name(value)}", where)
            if value < 1:
                raise _Invalid(f"log_keep must be at least 1, got {_show(value)}", where)
            return value
        # The remaining keys are plain strings.
        text = self._string(value, where, expand=expand)
        if key == "cwd":
            return self._absolute(text, self.path.parent, where)
        if key == "done_when":
            if not text.strip():
                raise _Invalid("done_when is empty", where)
            return text  # made absolute against the job's cwd once cwd is known
        if key in ("health_path", "metrics_path") and not text.startswith("/"):
            raise _Invalid(f"{key} must start with '/', got {_show(text)}", where)
        if key == "python" and text.startswith("~"):
            return os.path.expanduser(text)
        if not text.strip() and key in ("python", "model", "on_alert"):
            raise _Invalid(f"{key} is empty", where)
        return text

    def _string(self, value: Any, where: tuple, expand: bool) -> str:
        if not isinstance(value, str):
            raise _Invalid(f"{where[-1]} must be a string, got {_type_name(value)}", where)
        if not expand:
            return value
        return _expand(value, self._lookup_var, where, known=self.var_names, budget=self.budget)

    def _absolute(self, text: str, base: Path, where: tuple) -> str:
        if not text.strip():
            raise _Invalid(f"{where[-1]} is empty", where)
        expanded = os.path.expanduser(text)
        if not os.path.isabs(expanded):
            expanded = os.path.join(os.path.abspath(base), expanded)
        return os.path.normpath(expanded)

    def _gpus(self, value: Any, where: tuple) -> tuple[int, ...]:
        indices: list[int] = []
        if isinstance(value, str):
            if value.strip():
                for piece in value.split(","):
                    match = _GPU_RANGE_RE.fullmatch(piece)
                    if not match:
                        raise _Invalid(f"gpus: bad entry {_show(piece)} in {_show(value)} "
                                       "(use \"0,1,2\", \"0-7\" or a list of integers)", where)
                    first = int(match.group(1))
                    last = int(match.group(2)) if match.group(2) is not None else first
                    if last < first:
                        raise _Invalid(f"gpus: range {_show(piece.strip())} runs backwards", where)
                    if last - first > 4096:
                        raise _Invalid(f"gpus: range {_show(piece.strip())} is implausibly large", where)
                    indices.extend(range(first, last + 1))
        elif isinstance(value, list):
            for index, item in enumerate(value):
                if isinstance(item, bool) or not isinstance(item, int) or item < 0:
                    raise _Invalid(f"gpus items must be non-negative integers, got {_show(item)}", where + (index,))
                indices.append(item)
        else:
            raise _Invalid(f"gpus must be a list of GPU indices or a string like \"0,1,2\", got {_type_name(value)}",
                           where)
        if len(set(indices)) != len(indices):
            counts = Counter(indices)
            raise _Invalid(f"gpus lists GPU {min(i for i, n in counts.items() if n > 1)} more than once", where)
        return tuple(indices)

    # -- dependency cycles -------------------------------------------------

    def _cycles(self, jobs_table: dict) -> None:
        graph: dict[str, list[str]] = {}
        for name, table in jobs_table.items():
            needs = table.get("needs") if isinstance(table, dict) else None
            if isinstance(needs, str):
                needs = [needs]
            if not isinstance(needs, list):
                needs = []
            graph[name] = [d for d in needs if isinstance(d, str) and d in jobs_table and d != name]
        state: dict[str, int] = {}  # 1 = on the current path, 2 = finished
        reported: set[frozenset] = set()
        for root in graph:
            if state.get(root):
                continue
            # Iterative DFS: a long chain of needs must not hit the recursion limit.
            path: list[str] = [root]
            state[root] = 1
            stack: list[tuple[str, int]] = [(root, 0)]
            while stack:
                node, next_index = stack[-1]
                deps = graph[node]
                if next_index >= len(deps):
                    stack.pop()
                    path.pop()
                    state[node] = 2
                    continue
                stack[-1] = (node, next_index + 1)
                dep = deps[next_index]
                if state.get(dep) == 1:
                    cycle = path[path.index(dep):]
                    key = frozenset(cycle)
                    if key not in reported:
                        reported.add(key)
                        self._report_cycle(cycle, jobs_table)
                elif not state.get(dep):
                    state[dep] = 1
                    path.append(dep)
                    stack.append((dep, 0))

    def _report_cycle(self, cycle: list[str], jobs_table: dict) -> None:
        # Point at the `needs` entry of the cycle's first job in file order.
        if self._order is None:
            self._order = {name: i for i, name in enumerate(jobs_table)}
        first = min(cycle, key=self._order.__getitem__)
        rotated = cycle[cycle.index(first):] + cycle[: cycle.index(first)]
        following = rotated[1] if len(rotated) > 1 else rotated[0]
        needs = jobs_table[first].get("needs")
        where: tuple = ("jobs", first, "needs")
        if isinstance(needs, list) and following in needs:
            where += (needs.index(following),)
        self.error("dependency cycle: " + " -> ".join(rotated + [first]), where)


def _sbatch_owned(item: str) -> Optional[str]:
    """The option of an sbatch argument gpudeck sets itself ("--output=x", "-ox" -> its name), else None."""
    if item.startswith("--"):
        option = item.split("=", 1)[0]
        return option if option in SBATCH_OWNED else None
    if item.startswith("-") and item[:2] in SBATCH_OWNED:
        return item[:2]
    return None


def _slurm_time(value: Any, where: tuple) -> str:
    """A time limit as sbatch --time takes it: minutes (an integer), Slurm's "H:M:S"/"D-H" forms, or "2h"."""
    if isinstance(value, bool):
        raise _Invalid("time must be minutes or a Slurm time like \"1:30:00\", got a boolean", where)
    if isinstance(value, int):
        if value < 1:
            raise _Invalid(f"time must be at least 1 minute, got {value}", where)
        return str(value)
    if not isinstance(value, str):
        raise _Invalid(f"time must be minutes or a Slurm time like \"1:30:00\", got {_type_name(value)}", where)
    text = value.strip()
    if text.upper() in ("UNLIMITED", "INFINITE"):
        return text.upper()
    if _SLURM_TIME_RE.fullmatch(text):
        return text
    try:
        seconds = parse_duration(text)
    except ValueError:
        raise _Invalid(f"time: bad time limit {_show(value)} (minutes, \"H:M:S\", \"D-H:M:S\", or e.g. "
                       "\"90m\", \"2h\")", where) from None
    if seconds < 1:
        raise _Invalid(f"time must be longer than zero, got {_show(value)}", where)
    return str(max(1, math.ceil(seconds / 60)))   # sbatch counts whole minutes


# ---------------------------------------------------------------------------
# `${var}` expansion

class _Unresolved(Exception):
    """A referenced var exists but failed itself (already reported)."""


class _Limit(Exception):
    """A lookup went past a bound on expansion; _expand locates it at the reference."""


class _Budget:
    """What is left of the file's total for substituted text; the first reference past it is reported, once."""

    def __init__(self, chars: int) -> None:
        self.left = chars
        self.reported = False


def _expand(text: str, lookup: Callable[..., Any], where: tuple, known: Any, budget: Optional[_Budget] = None) -> str:
    """Replace `${name}` with vars, `$$` with `$`; leave other `$` (shell's $HOME, $1) for bash.

    Bounded: _Invalid when the value would pass MAX_EXPANDED_CHARS, or the file's
    substitutions the budget, checked before the text is built.
    """
    out: list[str] = []
    size = 0
    i = 0
    n = len(text)
    while i < n:
        c = text[i]
        if c != "$":
            j = text.find("$", i)
            j = n if j < 0 else j
            out.append(text[i:j])
            size += j - i
            i = j
            continue
        if text.startswith("$$", i):
            out.append("$")
            size += 1
            i += 2
            continue
        if text.startswith("${", i):
            end = text.find("}", i + 2)
            if end < 0:
                raise _Invalid("unterminated ${ (write $$ for a literal $)", where, offset=i)
            name = text[i + 2: end]
            if not _VAR_NAME_RE.fullmatch(name):
                raise _Invalid(f"bad variable reference ${{{name}}} (write $${{...}} to pass ${{...}} to the shell)",
                               where, offset=i)
            if name not in known:
                hint = _suggest(name, list(known))
                raise _Invalid(f"unknown variable ${{{name}}}{hint}; define it in [vars], or write ${name} / "
                               f"$${{{name}}} for the shell's variable", where, offset=i)
            try:
                value = lookup(name)
            except _Limit as limit:
                raise _Invalid(str(limit), where, offset=i) from None
            if value is None:
                raise _Unresolved(name)
            if size + len(value) > MAX_EXPANDED_CHARS:
                raise _Invalid(f"${{{name}}} makes this value longer than {MAX_EXPANDED_CHARS // 1024} KiB "
                               f"({size + len(value):,} characters) once expanded; no command line takes that",
                               where, offset=i)
            if budget is not None:
                if len(value) > budget.left:
                    if budget.reported:
                        raise _Unresolved(name)
                    budget.reported = True
                    raise _Invalid(f"${{{name}}}: the file's ${{var}} substitutions come to more than "
                                   f"{MAX_EXPANSION_TOTAL // (1024 * 1024)} MiB in all; use fewer or shorter vars",
                                   where, offset=i)
                budget.left -= len(value)
            out.append(value)
            size += len(value)
            i = end + 1
            continue
        out.append("$")
        size += 1
        i += 1
    return "".join(out)


# ---------------------------------------------------------------------------
# Small helpers


# Names other tools use for the same thing: a closer hint than spelling similarity.
_KEY_ALIASES = {
    "command": "cmd", "run": "cmd", "exec": "cmd", "args": "cmd", "argv": "cmd",
    "workdir": "cwd", "working_dir": "cwd", "directory": "cwd", "dir": "cwd",
    "environment": "env", "gpu": "gpus", "devices": "gpus", "cuda_visible_devices": "gpus",
    "depends_on": "needs", "after": "needs", "requires": "needs", "deps": "needs",
    "creates": "done_when", "done": "done_when", "stopsignal": "stop_signal",
    "stop_grace": "stop_timeout", "timeout": "stop_timeout", "stall_timeout": "stall_after",
    "variables": "vars", "var": "vars", "job": "jobs",
}


def _suggest(word: Any, choices: Iterable[str]) -> str:
    if not isinstance(word, str):
        return ""
    alias = _KEY_ALIASES.get(word.lower())
    if alias is not None and alias in choices:
        return f" (did you mean {alias!r}?)"
    matches = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {matches[0]!r}?)" if matches else ""


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return f"a {type(value).__name__}"  # dates and times


def _show(value: Any, limit: int = 60) -> str:
    if isinstance(value, (list, dict)):
        return _type_name(value)
    try:
        text = repr(value)
    except ValueError:  # an integer too long for str()
        return "a huge number"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _one_line(text: str) -> str:
    """Escape control characters so that an error is always exactly one printable line."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


def _dig(document: Any, path: tuple) -> Any:
    node = document
    for part in path:
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            return None
    return node


def _port_from_command(cmd: Any) -> Optional[int]:
    """The `--port` an engine command line declares, so `port` need not repeat it."""
    if cmd is None:
        return None
    # Imported here: the engine profiles are stdlib-only but not needed to load most files.
    from gpudeck.jobs.engines.profiles import parse_launch
    try:
        launch = parse_launch(cmd)
    except Exception:  # a command gpudeck cannot parse still loads; the default port applies
        return None
    return launch.port if launch is not None else None
