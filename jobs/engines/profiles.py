"""What gpudeck knows about each inference engine: defaults, signatures, and how to read its launch line."""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence, Union

from gpudeck.jobs.strictjson import parse_integer

if TYPE_CHECKING:
    from gpudeck.jobs.spec import JobSpec          # the spec imports this module

Command = Union[str, Sequence[str]]


@dataclass(frozen=True)
class EngineProfile:
    name: str                                   # "vllm" | "sglang"
    label: str
    default_port: int
    ready_lines: tuple[str, ...]                # a log line containing one of these = ready (log side)
    health_path: str
    metrics_path: str
    metrics_on_by_default: bool
    # Process titles set by the engine (setproctitle); psutil's name() is the
    # 15-character comm, so a prefix match covers both spellings.
    title_prefixes: tuple[str, ...]
    # Substrings of a command line that identify the engine's launcher.
    launcher_markers: tuple[str, ...]
    # Substrings that identify helper processes of the engine (not launchers).
    helper_markers: tuple[str, ...] = ()


VLLM = EngineProfile(
    name="vllm", label="vLLM", default_port=8000,
    ready_lines=("Application startup complete.",),
    health_path="/health", metrics_path="/metrics", metrics_on_by_default=True,
    title_prefixes=("VLLM::",),
    launcher_markers=("vllm.entrypoints", "vllm serve", "vllm/entrypoints", "-m vllm "),
)

SGLANG = EngineProfile(
    name="sglang", label="SGLang", default_port=30000,
    ready_lines=("The server is fired up and ready to roll!",),
    health_path="/health", metrics_path="/metrics", metrics_on_by_default=False,
    title_prefixes=("sglang::",),
    launcher_markers=("sglang.launch_server", "sglang serve", "sglang/launch_server", "-m sglang "),
    helper_markers=("sglang.srt", "sglang::detokenizer", "sglang::scheduler"),
)

PROFILES: dict[str, EngineProfile] = {VLLM.name: VLLM, SGLANG.name: SGLANG}


def profile_for(engine: str) -> EngineProfile:
    try:
        return PROFILES[engine.lower()]
    except KeyError:
        raise ValueError(f"unknown engine {engine!r} (known: {', '.join(PROFILES)})") from None


# --------------------------------------------------------------------------- command lines

def argv_of(cmd: Command) -> list[str]:
    """A job's command as a token list (a shell string is split like the shell would)."""
    if isinstance(cmd, str):
        try:
            return shlex.split(cmd, comments=True)
        except ValueError:          # unbalanced quotes: fall back to whitespace
            return cmd.split()
    return [str(a) for a in cmd]


_SHELL_SEPARATORS = {"&&", "||", ";", "|", "&"}
_ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_WRAPPERS = {"exec", "env", "nohup", "setsid", "stdbuf", "numactl", "taskset", "time", "uv", "run"}


def _segments(tokens: list[str]) -> list[list[str]]:
    segs: list[list[str]] = []
    cur: list[str] = []
    for tok in tokens:
        if tok in _SHELL_SEPARATORS:
            segs.append(cur)
            cur = []
        else:
            cur.append(tok)
    segs.append(cur)
    return [s for s in segs if s]


def _strip_prefix(seg: list[str]) -> list[str]:
    """Drop `FOO=1`, `exec`, `env`, `nohup` … before the real program."""
    i = 0
    while i < len(seg) and (_ENV_ASSIGNMENT.match(seg[i]) or os.path.basename(seg[i]) in _WRAPPERS
                            or seg[i].startswith("-") and i > 0 and os.path.basename(seg[i - 1]) in _WRAPPERS):
        i += 1
    return seg[i:]


def _is_python(token: str) -> bool:
    return re.fullmatch(r"python(\d+(\.\d+)?)?", os.path.basename(token)) is not None


@dataclass(frozen=True)
class EngineInvocation:
    """The engine's own part of a command: the program, and the engine arguments after it."""
    engine: str
    program: str                      # argv[0] of that part: /venv/bin/vllm, python3, …
    via_python_m: bool                # `python -m vllm…` / `python -m sglang…`
    args: tuple[str, ...]             # everything after `serve` / the module name


def find_invocation(cmd: Command) -> Optional[EngineInvocation]:
    """Locate the engine launch inside a command (also inside `cd x && FOO=1 exec vllm serve …`)."""
    for seg in _segments(argv_of(cmd)):
        seg = _strip_prefix(seg)
        if not seg:
            continue
        prog = seg[0]
        base = os.path.basename(prog)
        if _is_python(base):
            rest = seg[1:]
            while rest and rest[0].startswith("-") and rest[0] != "-m":
                rest = rest[1:]                   # -u, -X dev, …
            if len(rest) >= 2 and rest[0] == "-m":
                module = rest[1]
                engine = module.split(".")[0]
                if engine in PROFILES:
                    args = rest[2:]
                    if module in ("vllm", "sglang") and args[:1] == ["serve"]:
                        args = args[1:]           # `python -m vllm serve`? not real, but harmless
                    return EngineInvocation(engine, prog, True, tuple(args))
            elif rest and (rest[0].endswith("vllm") or rest[0].endswith("sglang")):
                engine = os.path.basename(rest[0])
                args = rest[1:]
                if args[:1] == ["serve"]:
                    args = args[1:]
                return EngineInvocation(engine, prog, False, tuple(args))
            continue
        if base in PROFILES and len(seg) >= 2 and seg[1] == "serve":
            return EngineInvocation(base, prog, False, tuple(seg[2:]))
    return None


def detect_engine(cmd: Command) -> Optional[str]:
    inv = find_invocation(cmd)
    return inv.engine if inv else None


# --------------------------------------------------------------------------- launch arguments

@dataclass(frozen=True)
class SpecConfig:
    method: str                        # eagle3, eagle, ngram, mtp, …
    draft_model: Optional[str] = None
    num_tokens: Optional[int] = None   # draft tokens per step


@dataclass(frozen=True)
class LaunchArgs:
    engine: str
    model: Optional[str] = None
    host: Optional[str] = None
    port: Optional[int] = None         # as given on the command line (None: engine default)
    tp: int = 1
    dp: int = 1
    spec: Optional[SpecConfig] = None
    metrics_enabled: bool = True
    extra: dict[str, str] = field(default_factory=dict)


# Flags that take no value, so the token after them (often the model) is not eaten.
_BOOLEAN_FLAGS = {
    "enforce-eager", "trust-remote-code", "enable-metrics", "enable-prefix-caching",
    "no-enable-prefix-caching", "disable-log-stats", "disable-log-requests", "enable-chunked-prefill",
    "skip-server-warmup", "disable-cuda-graph", "enable-torch-compile", "enable-auto-tool-choice",
    "headless", "disable-radix-cache", "enable-dp-attention", "disable-custom-all-reduce",
}


def _options(args: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """--key value / --key=value / -k value -> {key: value}; bare flags -> 'true'; plus positionals."""
    opts: dict[str, str] = {}
    positionals: list[str] = []
    i = 0
    while i < len(args):
        tok = args[i]
        if tok.startswith("-") and len(tok) > 1 and not _looks_numeric(tok):
            key, eq, val = tok.lstrip("-").partition("=")
            key = key.replace("_", "-")
            if eq:
                opts[key] = val
            elif key in _BOOLEAN_FLAGS:
                opts[key] = "true"
            elif i + 1 < len(args) and not (args[i + 1].startswith("-") and not _looks_numeric(args[i + 1])):
                opts[key] = args[i + 1]
                i += 1
            else:
                opts[key] = "true"
        else:
            positionals.append(tok)
        i += 1
    return opts, positionals


def _looks_numeric(tok: str) -> bool:
    return re.fullmatch(r"-?\d+(\.\d+)?", tok) is not None


_int = parse_integer        # the one strict number rule (strictjson) for an option's value


def _first(opts: dict[str, str], *keys: str) -> Optional[str]:
    for k in keys:
        if k in opts:
            return opts[k]
    return None


def parse_launch(cmd: Command) -> Optional[LaunchArgs]:
    """Model, port, parallelism and speculative decoding as the command line declares them."""
    inv = find_invocation(cmd)
    if inv is None:
        return None
    opts, positionals = _options(inv.args)
    if inv.engine == "vllm":
        model = _first(opts, "model") or (positionals[0] if positionals else None)
        spec = None
        raw = opts.get("speculative-config")
        if raw:
            try:
                cfg = json.loads(raw)
            except ValueError:
                cfg = {}
            if isinstance(cfg, dict):
                spec = SpecConfig(method=str(cfg.get("method") or "unknown"),
                                  draft_model=cfg.get("model"),
                                  num_tokens=_int(str(cfg.get("num_speculative_tokens")))
                                  if cfg.get("num_speculative_tokens") is not None else None)
        elif "speculative-model" in opts:       # older vLLM spelling
            spec = SpecConfig(method="draft", draft_model=opts["speculative-model"],
                              num_tokens=_int(opts.get("num-speculative-tokens")))
        return LaunchArgs(
            engine="vllm", model=model, host=opts.get("host"),
            port=_int(opts.get("port")),
            tp=_int(_first(opts, "tensor-parallel-size", "tp")) or 1,
            dp=_int(_first(opts, "data-parallel-size", "dp")) or 1,
            spec=spec, metrics_enabled=True)   # vLLM always serves /metrics
    model = _first(opts, "model-path", "model") or (positionals[0] if positionals else None)
    spec = None
    algo = opts.get("speculative-algorithm")
    if algo:
        spec = SpecConfig(method=algo.lower(), draft_model=opts.get("speculative-draft-model-path"),
                          num_tokens=_int(opts.get("speculative-num-draft-tokens")))
    return LaunchArgs(
        engine="sglang", model=model, host=opts.get("host"), port=_int(opts.get("port")),
        tp=_int(_first(opts, "tp", "tp-size", "tensor-parallel-size")) or 1,
        dp=_int(_first(opts, "dp", "dp-size", "data-parallel-size")) or 1,
        spec=spec, metrics_enabled="enable-metrics" in opts)


# --------------------------------------------------------------------------- interpreter

def _shebang_python(script: Path) -> Optional[str]:
    try:
        with open(script, "rb") as fh:
            first = fh.readline(512)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    parts = first[2:].decode("utf-8", "replace").split()
    if not parts:
        return None
    if os.path.basename(parts[0]) == "env" and len(parts) > 1:
        return shutil.which(parts[1])
    return parts[0] if _is_python(parts[0]) else None


def infer_python(cmd: Command, env: Optional[dict[str, str]] = None,
                 cwd: Optional[str] = None) -> Optional[str]:
    """The interpreter of the engine's environment, as far as the command reveals it.

    `/venv/bin/python -m vllm…` -> that python; `/venv/bin/vllm serve` -> the script's
    shebang (else the python beside it); bare names resolve on the job's PATH.
    """
    inv = find_invocation(cmd)
    if inv is None:
        return None
    path_var = (env or {}).get("PATH") or os.environ.get("PATH", "")
    program = inv.program
    if not os.path.isabs(program):
        if "/" in program and cwd:
            program = os.path.normpath(os.path.join(cwd, program))
        else:
            found = shutil.which(program, path=path_var)
            if found is None:
                return None
            program = found
    if inv.via_python_m or _is_python(program):
        return program
    shebang = _shebang_python(Path(program))
    if shebang:
        return shebang
    beside = Path(program).parent / "python"
    return str(beside) if beside.exists() else None


# --------------------------------------------------------------------------- a job's engine settings

@dataclass(frozen=True)
class EngineSettings:
    """A job's engine view: profile defaults, overridden by what jobs.toml and the command say."""
    engine: str
    port: int
    host: str
    health_path: str
    metrics_path: Optional[str]          # None: metrics off (SGLang without --enable-metrics)
    python: Optional[str]
    model: Optional[str]
    launch: Optional[LaunchArgs]

    @property
    def profile(self) -> EngineProfile:
        return profile_for(self.engine)

    def url(self, path: str) -> str:
        host = self.host if self.host not in ("0.0.0.0", "::", "") else "127.0.0.1"
        return f"http://{host}:{self.port}{path}"


def engine_settings(spec: JobSpec) -> Optional[EngineSettings]:
    """Settings for a JobSpec (gpudeck.jobs.spec.JobSpec) with `engine` set, or whose command launches one."""
    engine = getattr(spec, "engine", None) or detect_engine(spec.cmd)
    if not engine:
        return None
    profile = profile_for(engine)
    launch = parse_launch(spec.cmd)
    # The engine listens where its command says, whatever jobs.toml declares (the loader
    # fills the profile's default port in when jobs.toml is silent).
    port = (launch.port if launch else None) or spec.port or profile.default_port
    host = (launch.host if launch and launch.host else None) or "127.0.0.1"
    metrics_path: Optional[str] = spec.metrics_path or profile.metrics_path
    if not spec.metrics_path and launch is not None and not launch.metrics_enabled:
        metrics_path = None
    python = spec.python or infer_python(spec.cmd, spec.env, spec.cwd)
    model = spec.model or (launch.model if launch else None)
    return EngineSettings(engine=engine, port=port, host=host,
                          health_path=spec.health_path or profile.health_path,
                          metrics_path=metrics_path, python=python, model=model, launch=launch)
