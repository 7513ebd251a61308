"""`gpudeck doctor [JOB] [--json]`: preflight checks for the box, or for one job before it is launched."""
from __future__ import annotations

import argparse

from gpudeck.jobs import strictjson
from gpudeck.console.errors import CliError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "doctor", help="preflight checks: driver, free GPUs, the engine's torch/CUDA/arch/imports, port, disk, build RAM",
        description="Without JOB: NVIDIA driver and GPUs visible, GPUs free. With an engine JOB, also in the "
                    "job's own interpreter: torch imports, CUDA available, GPU architecture supported by torch "
                    "and the engine's kernels, the engine imports (after torch), versions; its port free; disk "
                    "space where the model lives. With a build JOB: RAM and cores against its parallelism, "
                    "with a safe MAX_JOBS. Checks that do not concern the job are reported as skipped. "
                    "Exits 1 when any check fails.")
    p.add_argument("job", metavar="JOB", nargs="?", help="a job of the jobs file")
    p.add_argument("--json", action="store_true", help='print {"checks": [{"name", "ok", "detail"}]}')
    p.set_defaults(handler=run_doctor_cmd, remote_ok=True)


def run_doctor_cmd(args: argparse.Namespace) -> int:
    from gpudeck.console.commands._host import open_box
    # The checks run on the box (its driver, GPUs, interpreters, disk); printed here.
    with open_box(args) as box:
        payload = dict(box.doctor(args.job).payload)
    if not box.local:
        payload["host"] = box.name
    checks = payload["checks"]
    if args.json:
        print(strictjson.dumps(payload, indent=1))
    else:
        width = max(len(c["name"]) for c in checks)
        for c in checks:
            mark = "skip" if c.get("skipped") else ("ok" if c["ok"] else "FAIL")
            print(f"{mark:>4}  {c['name']:<{width}}  {c['detail']}")
    if not payload["ok"]:
        failed = ", ".join(c["name"] for c in checks if not c["ok"])
        raise CliError(f"doctor: failed: {failed}", code=1)
    return 0
