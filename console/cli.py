"""The `gpudeck` command line: global options, subcommand discovery, one-line errors."""
from __future__ import annotations

import argparse
import importlib
import io
import pkgutil
import sys
from typing import BinaryIO, NoReturn, Optional, TextIO

from gpudeck.jobs.box import BoxError
from gpudeck.jobs import __version__

import gpudeck.console.commands as _commands_pkg
from gpudeck.console.errors import CliError
from gpudeck.jobs.paths import UnsafeStateDir


def _with_global_options(parser: argparse.ArgumentParser, version: bool = True) -> argparse.ArgumentParser:
    if version:
        parser.add_argument("--version", action="version", version=f"gpudeck {__version__}")
    parser.add_argument("--demo", action="store_true",
                        help="use the SIMULATED 8-GPU box instead of the GPU driver; the console's jobs view replays four "
                             "recorded SIMULATED runs")
    parser.add_argument("--jobs", metavar="FILE", dest="jobs_file",
                        help="jobs.toml to use (else $GPUDECK_JOBS, ./jobs.toml, ~/.config/gpudeck/jobs.toml)")
    parser.add_argument("--theme", metavar="NAME", default=None,
                        help="console theme (gpudeck-dark, gpudeck-light, gpudeck-contrast)")
    parser.add_argument("--host", metavar="NAME", default=None,
                        help="run on this host from ~/.config/gpudeck/hosts.toml (else $GPUDECK_HOST, else local)")
    parser.add_argument("--refresh", metavar="SECONDS", type=float, default=1.0,
                        help="console sampling interval (default 1s)")
    parser.add_argument("--readonly", action="store_true",
                        help="watch only: no key or command starts, stops, restarts, pivots or runs a job, and "
                             "remote agents refuse to (also $GPUDECK_READONLY=1, readonly = true in config.toml)")
    return parser


def build_parser(only: Optional[str] = None) -> argparse.ArgumentParser:
    """The whole command line; with `only`, just the command module of that name registers (if it exists)."""
    parser = _with_global_options(argparse.ArgumentParser(
        prog="gpudeck",
        description="Operator console for a GPU box: see, act, remember.",
    ))
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    # Each module in console/commands registers its own subcommand(s): adding a
    # command never means editing this file.
    names = sorted(info.name for info in pkgutil.iter_modules(_commands_pkg.__path__))
    for name in ([only] if only in names else names):
        module = importlib.import_module(f"gpudeck.console.commands.{name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(sub)
    if only in names and only not in sub.choices:      # the module is named otherwise than its command
        return build_parser()
    return parser


class _NotACommandLine(Exception):
    pass


class _PeekParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:   # argparse's documented hook; raises instead of exiting
        raise _NotACommandLine(message)


def command_word(argv: list[str]) -> Optional[str]:
    """The subcommand `argv` names, read with the global options only (None: none, or unclear).

    It only picks which command module to import: importing all of them costs every
    command (`status` included) the start-up of the heaviest; the real parse follows.
    """
    try:
        # No --version and no -h here: they act (print, exit) wherever they appear; the real parse decides.
        peek = _with_global_options(_PeekParser(prog="gpudeck", add_help=False), version=False)
        _, rest = peek.parse_known_args(argv)
    except _NotACommandLine:
        return None
    return rest[0] if rest and not rest[0].startswith("-") else None


class TerminalSafeStream(io.TextIOBase):
    """stdout/stderr of a CLI command: every line written goes through the core's sanitizer.

    Commands print job names, alert messages, foreign processes' argv, model paths:
    whatever a command forgets to clean, no escape sequence, C1 control or bidi
    override reaches the operator's terminal. Newlines and TABs pass; bytes written
    to `.buffer` (`logs`, already sanitised line by line) are left alone.
    """

    def __init__(self, raw: TextIO) -> None:
        super().__init__()
        self.raw = raw

    def write(self, text: str) -> int:
        from gpudeck.jobs.logs.sanitize import sanitize_text
        self.raw.write("\n".join(sanitize_text(part) for part in text.split("\n")))
        return len(text)

    def flush(self) -> None:
        self.raw.flush()

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return self.raw.isatty()

    def fileno(self) -> int:
        return self.raw.fileno()

    @property
    def buffer(self) -> BinaryIO:    # the underlying binary stream
        return self.raw.buffer

    @property
    def encoding(self) -> str:   # type: ignore[override]
        return self.raw.encoding


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(only=command_word(argv))
    args = parser.parse_args(argv)
    saved = sys.stdout, sys.stderr
    if args.command is not None and not isinstance(sys.stdout, TerminalSafeStream):
        # Not for the console itself: Textual owns the terminal there.
        sys.stdout = TerminalSafeStream(sys.stdout)
        sys.stderr = TerminalSafeStream(sys.stderr)
    try:
        return _dispatch(args)
    finally:
        sys.stdout, sys.stderr = saved


def _check_theme(name: Optional[str]) -> None:
    """--theme is a global option: an unknown name is refused for every command, not only the console."""
    if name is None:
        return
    # Textual's theme list: imported only when --theme is given, so plain commands stay light.
    from gpudeck.themes import is_known_theme, unknown_theme
    if not is_known_theme(name):
        raise CliError(unknown_theme(name, "--theme"), code=2)


def _dispatch(args: argparse.Namespace) -> int:
    try:
        _check_theme(getattr(args, "theme", None))
        if args.command is None:
            from gpudeck.console.app import run_console
            return run_console(args)
        mutates = getattr(args, "mutates", False)
        if callable(mutates):
            mutates = mutates(args)
        if mutates:
            # Refused before anything is read or reached: the command's own name, one line, exit 2.
            from gpudeck.console.commands._host import host_spec
            from gpudeck.console.readonly import refuse_mutation
            refuse_mutation(args)
            refuse_mutation(args, host_spec(args))
        if not getattr(args, "remote_ok", False):
            from gpudeck.console.commands._host import remote_spec
            spec = remote_spec(args)
            if spec is not None:
                raise CliError(f"`{args.command}` does not run over SSH yet; run it on {spec.name} itself "
                               f"(ssh {spec.ssh} gpudeck {args.command} ...)", code=2)
        return int(args.handler(args) or 0)
    except (CliError, BoxError) as exc:
        print(f"gpudeck: {exc}", file=sys.stderr)
        return exc.code
    except UnsafeStateDir as exc:
        # Another user could have written what is in there (a pid to signal, a run to read).
        print(f"gpudeck: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except OSError as exc:
        # An unusable state dir (a file, read-only, full disk) or an unreadable path
        # is the environment, not a bug: one line, never a traceback.
        print(f"gpudeck: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
