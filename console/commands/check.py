"""`gpudeck check`: validate the jobs file and print every located error, one per line."""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

from gpudeck.console.commands._host import open_box

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
    with open_box(args) as box:
        result = box.check()
    where = result.path if box.local else f"{box.name}:{result.path}"
    return _report(where, result.errors, result.jobs, result.targets)

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
        for t in targets:
            # The box gave the URL as scheme and host only (a webhook URL is often its own token).
            print(f"notify {t['name']}: {t['format']} to {t['url']}, "
                  f"on {', '.join(t['on']) if t.get('on') else 'every alert'} ({t.get('source') or '?'})")
    return 0
