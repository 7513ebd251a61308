"""Write docs/BOX.md from the Box interface itself: each method's signature and docstring, each result's fields.

    python docs/make_box_reference.py          # rewrite docs/BOX.md
    python docs/make_box_reference.py --check  # exit 1 if docs/BOX.md is stale (tests/test_box.py runs this)
"""
from __future__ import annotations

import dataclasses
import inspect
import sys
import typing
from pathlib import Path

from gpudeck.jobs import box as box_module
from gpudeck.jobs.box import analyze_result, results
from gpudeck.jobs.box.serve import OPS

OUT = Path(__file__).resolve().parent / "BOX.md"

INTRO = """# The Box interface

Generated from `jobs/box/__init__.py`, `jobs/box/results.py` and `analyze_result.py` by `docs/make_box_reference.py`; do not edit.

A **box** is a machine with GPUs and jobs. Every face of gpudeck — each CLI command, the console's
views, the exporter, the web console — speaks to a box through this one interface: `LocalBox` answers
with the core on this machine, `RemoteBox` sends the same call over SSH to the box's agent, which
answers it with the LocalBox there. Both return the same typed results and raise only `BoxError`
(its `code` is the exit code a CLI gives it: 2 refused, 1 failed or unreachable, 3 no GPU telemetry).
`--host NAME` (or `$GPUDECK_HOST`, or the console's box switcher) only chooses the box.

```python
from gpudeck.jobs.box import open_box
with open_box("gpu-7") as box:          # None or "local": this machine
    run = box.start("vllm")
    box.follow_log("vllm", sys.stdout.buffer.write, follow=True)
```
"""


def _signature(method: typing.Any) -> str:
    sig = inspect.signature(method)
    params = [p for name, p in sig.parameters.items() if name != "self"]
    text = f"({', '.join(str(p) for p in params)}) -> {sig.return_annotation}"
    return text.replace("'", "")          # annotations are strings (from __future__ import annotations)


def render() -> str:
    wire = {method: f"`{op}`" for op, (method, _, _) in OPS.items()}
    # The calls the agent answers with more than one Box call's worth of protocol (agent.py).
    wire.update({"info": "`hello`", "status": "`status` (1 Hz: `poll`, as deltas)",
                 "pivot": "`pivot`, then `pivot_progress` and `pivot_ready`", "run_record": "`run_file` per file",
                 "follow_log": "`logs` from each offset"})
    out = [INTRO, "## Methods\n"]
    for name, member in box_module.Box.__dict__.items():
        if name.startswith("_") or not callable(member):
            continue
        doc = inspect.cleandoc(member.__doc__ or "")
        over = f" — over SSH: {wire[name]}" if name in wire else ""
        out.append(f"### `{name}{_signature(member)}`{over}\n\n{doc}\n")
    out.append("## Results\n")
    for name, cls in vars(results).items():
        # (AnalyzeResult lives in analyze_result.py, re-exported by results.py: see there)
        if not (inspect.isclass(cls) and dataclasses.is_dataclass(cls)) or cls.__module__ not in (
                results.__name__, analyze_result.__name__):
            continue
        out.append(f"### `{name}`\n\n{inspect.cleandoc(cls.__doc__ or '')}\n")
        out.append("| field | type |\n|---|---|")
        for f in dataclasses.fields(cls):
            out.append(f"| `{f.name}` | `{f.type}` |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is stale: run python docs/make_box_reference.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
