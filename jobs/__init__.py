"""gpudeck's headless core: telemetry, jobs, logs, engines. Never imports Textual or Rich."""

__version__ = "0.1.0"
