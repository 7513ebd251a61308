"""`gpudeck analyze FILE [--json]`: what a log says — engine, phase, progress/ETA, failure cause and hint, serving, warnings."""
from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Optional

from gpudeck.jobs import strictjson

from gpudeck.console.errors import CliError

if TYPE_CHECKING:
    from gpudeck.jobs.logs.analyze import LogAnalysis


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "analyze", help="read a log file: engine, phase, progress/ETA, failure cause, serving numbers, warnings",
        description="Read a log file (any size; it is streamed) and say what an operator would: which engine, "
                    "which phase, how far along and when it will finish, whether it failed (cause, the line of "
                    "the root cause, a hint), the serving numbers and any warnings. "
                    "Exit status: 0 when the file was analysed (whatever it says), 2 when it cannot be read.")
    p.add_argument("file", metavar="FILE", help="the log file (a regular file), or - for stdin")
    p.add_argument("--max-bytes", metavar="N", type=_size, default=None,
                   help="read at most N bytes (K/M/G suffixes); default 256M for stdin, all of a file")
    p.add_argument("-j", "--jobs", metavar="N", type=_jobs, default=None,
                   help="processes that read a large file (its byte passes; where it is dense, whole slices) "
                        "(default: one per core; 1: this one alone); "
                        "the answer is the same either way")
    p.add_argument("--json", action="store_true",
                   help='print {"engine","phase","progress","failure","ready_line","serving","warnings","key_lines"} '
                        'as JSON; key_lines: [{"kind","line","text"}] for root_cause, first_error, last_progress, ready')
    p.set_defaults(handler=run_analyze, remote_ok=True)


# stdin has no size: a pipe from `yes` must not run forever.
STDIN_MAX_BYTES = 256 * 1024 * 1024


def _size(text: str) -> int:
    units = {"": 1, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = t[-1:] if t[-1:] in "KMG" and t[-1:] else ""
    try:
        value = int(float(t[:-1] if unit else t) * units[unit])
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (bytes, or with K/M/G)") from None
    if value <= 0:
        raise argparse.ArgumentTypeError("--max-bytes must be more than 0")
    return value


def _jobs(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of processes: {text!r}") from None
    if not 1 <= value <= 1024:
        raise argparse.ArgumentTypeError("--jobs must be 1 to 1024")
    return value


def run_analyze(args: argparse.Namespace) -> int:
    """FILE is a path on the box: read and analysed there, only the answer travels. `-` is this machine's stdin."""
    from gpudeck.console.commands._host import open_box
    with open_box(args) as box:
        if args.file == "-":
            if not box.local:
                # stdin is this machine's: analysing it under a --host would mislabel where the log came from.
                raise CliError(f"analyze -: stdin is read on this machine, not on {box.name}; drop --host to "
                               f"analyze stdin here, or give a file on {box.name}", 2)
            from gpudeck.jobs.box.local import analyze_stream_result
            result = analyze_stream_result(sys.stdin.buffer, max_bytes=args.max_bytes or STDIN_MAX_BYTES)
        else:
            result = box.analyze(args.file, max_bytes=args.max_bytes, workers=args.jobs)
    if result.truncated:
        print(f"gpudeck: analyze: read only the first {args.max_bytes or STDIN_MAX_BYTES} bytes (--max-bytes)",
              file=sys.stderr)
    if args.json:
        document = result.analysis if box.local else {**result.analysis, "host": box.name}
        sys.stdout.write(strictjson.dumps(document, indent=2, ensure_ascii=False))
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render(result.log_analysis()))
    return 0


def _duration(seconds: Optional[float]) -> str:
    if seconds is None:
        return "?"
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, secs = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def _number(value: Optional[float], digits: int = 1) -> str:
    if value is None:
        return "-"
    return str(int(value)) if float(value).is_integer() else f"{value:.{digits}f}"


def render(analysis: LogAnalysis) -> str:
    """The human summary, one fact per line."""
    from gpudeck.jobs.logs.sanitize import sanitize_text as safe
    out = [f"engine:   {analysis.engine or '-'}", f"phase:    {analysis.phase}"]
    p = analysis.progress
    if p is not None:
        where = f"{_number(p.done, 2)}/{_number(p.total, 2)}" if p.total is not None else f"{_number(p.done, 2)}"
        if p.total:
            where += f" ({100.0 * float(p.done) / float(p.total):.0f}%)"
        extra = []
        if p.rate:
            extra.append(f"{p.rate:.3g}/s" if p.rate >= 1 else f"{1.0 / p.rate:.3g}s each")
        if p.eta_s is not None:
            extra.append(f"ETA {_duration(p.eta_s)}")
        out.append(f"progress: {safe(p.label) or '-'} {where}" + (f"  [{', '.join(extra)}]" if extra else ""))
    if analysis.ready_line is not None:
        out.append(f"ready:    line {analysis.ready_line}")
    f = analysis.failure
    if f is not None:
        out.append(f"FAILED:   {f.cause} at line {f.line}")
        out.append(f"  {safe(f.message)}")
        out.append(f"  hint: {f.hint}")
        first = next((k for k in analysis.key_lines if k.kind == "first_error"), None)
        if first is not None and first.line != f.line:
            out.append(f"  first error logged at line {first.line}: {safe(first.text)[:200]}")
    s = analysis.serving
    if s is not None:
        parts = [f"running {_number(s.running)}", f"waiting {_number(s.waiting)}"]
        if s.kv_cache_pct is not None:
            parts.append(f"KV cache {s.kv_cache_pct:.1f}%")
        if s.gen_tokens_per_s is not None:
            parts.append(f"gen {s.gen_tokens_per_s:.1f} tok/s")
        if s.prompt_tokens_per_s is not None:
            parts.append(f"prompt {s.prompt_tokens_per_s:.1f} tok/s")
        if s.spec_accept_len is not None:
            parts.append(f"spec accept len {s.spec_accept_len:.2f}")
        if s.spec_accept_rate is not None:
            parts.append(f"accept rate {100 * s.spec_accept_rate:.1f}%")
        out.append("serving:  " + ", ".join(parts))
    for w in analysis.warnings:
        out.append(f"warning:  {w.code} (line {w.line}): {safe(w.message)}")
    return "\n".join(out) + "\n"
