"""The dashboard view: every GPU, the host, the listening ports and the GPU processes on one screen."""
from __future__ import annotations

from textual import events
from textual.css.query import NoMatches
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer

from gpudeck.console.telemetry_view import TelemetryView
from gpudeck.console.widgets.box_header_panel import BoxHeaderPanel
from gpudeck.console.widgets.gpu_grid_panel import Density, GpuGridPanel
from gpudeck.console.widgets.gpu_process_table import GpuProcessTable
from gpudeck.console.widgets.host_panel import HostPanel
from gpudeck.console.widgets.ports_table import PortsTable

DENSITY_CYCLE: tuple[Density, ...] = ("auto", "lines", "cards")


class DashboardScreen(Screen):
    """Implements the app's telemetry-screen protocol: `apply_telemetry(view)` after every tick."""

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

    # Ticks and resizes can reach the screen before its widgets are mounted (seen on a
    # loaded machine): until on_mount they are skipped, and on_mount catches up.
    _mounted_widgets = False

    def on_mount(self) -> None:
        self._mounted_widgets = True
        self.query_one(GpuGridPanel).set_screen_size(*self.app.size)
        view = getattr(self.app, "telemetry", None)
        if view is not None:
            self.apply_telemetry(view)

    def on_screen_resume(self) -> None:
        # Invisible screens are not refreshed per tick, so catch up when shown again.
        view = getattr(self.app, "telemetry", None)
        if view is not None:
            self.apply_telemetry(view)

    def on_resize(self, event: events.Resize) -> None:
        if not self._mounted_widgets:
            return
        self.query_one(GpuGridPanel).set_screen_size(event.size.width, event.size.height)

    def apply_telemetry(self, view: TelemetryView) -> None:
        if not self._mounted_widgets:
            return
        try:
            header = self.query_one(BoxHeaderPanel)
            grid = self.query_one(GpuGridPanel)
            host = self.query_one(HostPanel)
            ports = self.query_one(PortsTable)
            processes = self.query_one(GpuProcessTable)
        except NoMatches:
            return    # the app is shutting down and the widgets are already gone
        header.apply_telemetry(view)
        grid.apply_telemetry(view)
        host.apply_telemetry(view)
        ports.apply_snapshot(view.snapshot, view.stale)
        processes.apply_snapshot(view.snapshot, view.stale)

    def action_cycle_density(self) -> None:
        grid = self.query_one(GpuGridPanel)
        density = DENSITY_CYCLE[(DENSITY_CYCLE.index(grid.density) + 1) % len(DENSITY_CYCLE)]
        grid.set_density(density)
        self.notify(f"GPU cards: {density}", timeout=2)
