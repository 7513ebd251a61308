"""The console's user settings file (~/.config/gpudeck/config.toml) and how CLI flags override it.

Its [notify.NAME] webhook tables belong to the core (gpudeck.jobs.spec.load_user_notify): runs read them, not the console.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from gpudeck.jobs.paths import config_dir

from gpudeck.console.errors import CliError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib


@dataclass(frozen=True)
class ConsoleConfig:
    theme: Optional[str] = None
    readonly: bool = False          # as --readonly: watch only, every acting key and command refused


def config_path() -> Path:
    return config_dir() / "config.toml"


def load_console_config(path: Path | None = None) -> ConsoleConfig:
    """Read the settings file; a missing file is an empty config, a broken one a CliError."""
    path = path or config_path()
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return ConsoleConfig()
    except OSError as exc:
        raise CliError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        data: dict[str, Any] = tomllib.loads(raw.decode("utf-8", errors="replace"))
    except tomllib.TOMLDecodeError as exc:
        raise CliError(f"{path}: {exc}") from None
    theme = data.get("theme")
    if theme is not None and not isinstance(theme, str):
        raise CliError(f"{path}: theme must be a string, got {type(theme).__name__}")
    readonly = data.get("readonly", False)
    if not isinstance(readonly, bool):
        raise CliError(f"{path}: readonly must be true or false, got {type(readonly).__name__}")
    return ConsoleConfig(theme=theme, readonly=readonly)
