"""The dashboard view: every GPU, the host, the listening ports and the GPU processes on one screen."""
from __future__ import annotations

from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import Footer

from gpudeck.console.compositor import DeckScreen

from gpudeck.console.widgets.box_header_panel import BoxHeaderPanel
from gpudeck.console.widgets.gpu_grid_panel import Density, GpuGridPanel
from gpudeck.console.widgets.gpu_process_table import GpuProcessTable
from gpudeck.console.widgets.host_panel import HostPanel
from gpudeck.console.widgets.ports_table import PortsTable

DENSITY_CYCLE: tuple[Density, ...] = ("auto", "lines", "cards")


class DashboardScreen(DeckScreen):
    """Its widgets follow the app's telemetry feed themselves; the screen only lays them out."""

    DEFAULT_CSS = """
    DashboardScreen #dashboard-body {
        height: 1fr;
        scrollbar-size-vertical: 1;
    }
    DashboardScreen #dashboard-lower {
        height: auto;
    }
    DashboardScreen #dashboard-lower > HostPanel {
        width: 1fr;
    }
    DashboardScreen #dashboard-lower > PortsTable {
        width: 1fr;
    }
    DashboardScreen.-narrow #dashboard-lower {
        layout: vertical;
    }
    DashboardScreen.-narrow #dashboard-lower > PortsTable {
        width: 100%;
    }
    """

    # Side by side needs room for a readable host panel and a ports table with its process names.
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (110, "-wide")]

    BINDINGS = [
        Binding("d", "cycle_density", "Density", id="dashboard.density",
                tooltip="GPU cards: auto, one line each, or full cards"),
    ]

    def compose(self) -> ComposeResult:
        yield BoxHeaderPanel("dashboard", id="header")
        with VerticalScroll(id="dashboard-body"):
            yield GpuGridPanel(id="gpus")
            with Horizontal(id="dashboard-lower"):
                yield HostPanel(id="host")
                yield PortsTable(id="ports")
            yield GpuProcessTable(id="gpu-processes")
        yield Footer()

    def on_resize(self, event: events.Resize) -> None:
        # Before compose has mounted the grid there is nothing to size (it reads the screen size on mount).
        for grid in self.query(GpuGridPanel):
            grid.set_screen_size(event.size.width, event.size.height)

    def action_cycle_density(self) -> None:
        grid = self.query_one(GpuGridPanel)
        density = DENSITY_CYCLE[(DENSITY_CYCLE.index(grid.density) + 1) % len(DENSITY_CYCLE)]
        grid.set_density(density)
        self.notify(f"GPU cards: {density}", timeout=2)
