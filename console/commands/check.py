"""`gpudeck check`: validate the jobs file and print every located error, one per line."""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

from gpudeck.console.errors import CliError

# How many job names the success line lists before it says "and N more".
_NAMES_SHOWN = 12


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "check",
        help="validate jobs.toml (syntax, keys, types, needs, cycles, [notify.*] targets)",
        description="Validate the jobs file and the [notify.*] tables of ~/.config/gpudeck/config.toml. "
                    "Prints each problem as FILE:LINE:COL: message and exits 1 "
                    "if there is any; exits 2 if no jobs file is found.",
    )
    p.set_defaults(handler=run_check, remote_ok=True)


def run_check(args: argparse.Namespace) -> int:
    from gpudeck.console.commands._host import Remote, remote_spec
    spec = remote_spec(args)
    if spec is not None:
        with Remote(spec) as remote:
            reply = remote.call("check")
        return _report(f"{spec.name}:{reply['path']}", reply["errors"], reply["jobs"])
    from gpudeck.jobs.paths import check_regular, find_jobs_file
    from gpudeck.jobs.spec import SpecError, load_jobs, load_user_notify
    path = find_jobs_file(getattr(args, "jobs_file", None))
    if path is None:
        raise CliError("no jobs file: pass --jobs FILE, set GPUDECK_JOBS, or create ./jobs.toml "
                       "or ~/.config/gpudeck/jobs.toml", code=2)
    if not path.exists():
        raise CliError(f"{path}: no such file", code=2)
    try:
        check_regular(path)             # a FIFO would block the read, /dev/zero never end it
    except OSError as exc:
        raise CliError(str(exc), code=2) from None
    everyone, user_errors = load_user_notify()
    try:
        jobs_file = load_jobs(path)     # one read: the errors ride on the first one
    except SpecError as exc:
        return _report(str(path), [str(e) for e in exc.errors] + [str(e) for e in user_errors], [])
    if user_errors:
        return _report(str(path), [str(e) for e in user_errors], [])
    from gpudeck.jobs.notify_targets import merged
    return _report(str(path), [], list(jobs_file.jobs), merged(jobs_file.notify, everyone))


def _report(where: str, errors: list[str], names: list[str], targets: Sequence[dict] = ()) -> int:
    """Every error, one per line, exit 1; or the job names (and the webhook targets, URLs redacted), exit 0."""
    if errors:
        for error in errors:
            print(error)
        print(f"gpudeck: {where}: {len(errors)} error{'s' if len(errors) != 1 else ''}", file=sys.stderr)
        return 1
    shown = ", ".join(names[:_NAMES_SHOWN])
    if len(names) > _NAMES_SHOWN:
        shown += f", and {len(names) - _NAMES_SHOWN} more"
    print(f"{where}: {len(names)} job{'s' if len(names) != 1 else ''} OK ({shown})")
    if targets:
        from gpudeck.jobs.notify_targets import redact_url
        for t in targets:
            # A webhook URL is often its own token: only its scheme and host are ever printed.
            print(f"notify {t['name']}: {t['format']} to {redact_url(t['url'])}, "
                  f"on {', '.join(t['on']) if t.get('on') else 'every alert'} ({t.get('source') or '?'})")
    return 0
