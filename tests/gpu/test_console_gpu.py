"""The console dashboard on real NVIDIA GPUs: one line or card per device, real names, never SIMULATED.

Run on a GPU machine:  .venv/bin/python -m pytest tests/gpu/test_console_gpu.py -v
Skips cleanly without a GPU.
"""
from __future__ import annotations

import asyncio
import time

import pytest

pynvml = pytest.importorskip("pynvml")

pytestmark = pytest.mark.gpu


def _device_names() -> list[str]:
    try:
        pynvml.nvmlInit()
        try:
            names = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
                names.append(name.decode() if isinstance(name, bytes) else name)
            return names
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001
        return []


NAMES = _device_names()
if not NAMES:
    pytest.skip("no NVIDIA GPU / driver here", allow_module_level=True)

from gpudeck.jobs.telemetry.history import History  # noqa: E402
from gpudeck.jobs.telemetry.sampler import make_sampler  # noqa: E402

from gpudeck.console.app import make_app  # noqa: E402
from gpudeck.console.format import short_gpu_name  # noqa: E402
from gpudeck.console.widgets.box_header_panel import BoxHeaderPanel  # noqa: E402
from gpudeck.console.widgets.gpu_card_panel import GpuCardPanel  # noqa: E402
from gpudeck.console.widgets.gpu_grid_panel import GpuGridPanel  # noqa: E402
from gpudeck.console.widgets.gpu_lines_panel import GpuLinesPanel  # noqa: E402


def _lines_text(widget) -> str:
    return "\n".join(widget.render_line(y).text for y in range(widget.size.height))


@pytest.mark.parametrize("size", [(80, 24), (200, 60)])
def test_dashboard_shows_every_real_gpu_by_name(size) -> None:
    async def run() -> None:
        sampler = make_sampler()
        app = make_app(sampler=sampler, history=History(), refresh=0.5)
        try:
            async with app.run_test(size=size) as pilot:
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline and (app.snapshot is None or app.ticks < 2):
                    await pilot.pause(0.1)
                assert app.snapshot is not None and len(app.snapshot.gpus) == len(NAMES)
                await pilot.pause(0.2)
                header = _lines_text(app.screen.query_one(BoxHeaderPanel))
                assert f"{len(NAMES)} GPUs" in header and "SIMULATED" not in header
                grid = app.screen.query_one(GpuGridPanel)
                if grid.cards_mode:
                    cards = list(app.screen.query(GpuCardPanel))
                    assert [c.border_title.split(" · ")[1] for c in cards] == [short_gpu_name(n) for n in NAMES]
                    assert all(c.border_subtitle is None for c in cards)
                else:
                    lines = _lines_text(app.screen.query_one(GpuLinesPanel)).splitlines()
                    assert len(lines) == len(NAMES)
                    for line, name in zip(lines, NAMES):
                        assert short_gpu_name(name)[:8] in line and "SIM" not in line
                print(f"console on {len(NAMES)} real GPU(s) at {size[0]}x{size[1]}: "
                      f"{'cards' if grid.cards_mode else 'lines'}, {app.ticks} ticks")
        finally:
            sampler.close()

    asyncio.run(run())
