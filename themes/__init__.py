"""gpudeck's Textual themes: the definitions, their names, and which one a console starts with."""
from __future__ import annotations

from textual.theme import BUILTIN_THEMES, Theme

DEFAULT_THEME = "gpudeck-dark"

# Widgets colour by the standard theme variables only ($success, $warning, $error,
# $primary, $accent, $panel, $foreground…), so Textual's built-in themes work too.
GPUDECK_THEMES: dict[str, Theme] = {
    "gpudeck-dark": Theme(
        name="gpudeck-dark",
        primary="#4FB3FF",
        secondary="#7AA2F7",
        accent="#E0AF68",
        warning="#E0AF68",
        error="#F7768E",
        success="#9ECE6A",
        foreground="#C9D1D9",
        background="#0D1117",
        surface="#131A23",
        panel="#1C2633",
        dark=True,
    ),
    "gpudeck-light": Theme(
        name="gpudeck-light",
        primary="#0969DA",
        secondary="#6639BA",
        accent="#BC4C00",
        warning="#9A6700",
        error="#CF222E",
        success="#1A7F37",
        foreground="#1F2328",
        background="#F6F8FA",
        surface="#FFFFFF",
        panel="#E3E8EE",
        dark=False,
    ),
    # For glare, projectors and low vision: pure black, saturated hues, no alpha.
    "gpudeck-contrast": Theme(
        name="gpudeck-contrast",
        primary="#00FFFF",
        secondary="#FFFF00",
        accent="#FFFF00",
        warning="#FFD700",
        error="#FF4040",
        success="#00FF00",
        foreground="#FFFFFF",
        background="#000000",
        surface="#000000",
        panel="#202020",
        boost="#303030",
        dark=True,
        luminosity_spread=0.3,
        text_alpha=1.0,
    ),
}

# The order `t` cycles through.
THEME_CYCLE: tuple[str, ...] = tuple(GPUDECK_THEMES)


def known_theme_names() -> list[str]:
    """Every name --theme / config accepts: gpudeck's own, then Textual's built-ins."""
    return [*GPUDECK_THEMES, *sorted(n for n in BUILTIN_THEMES if n not in GPUDECK_THEMES)]


def is_known_theme(name: str) -> bool:
    return name in GPUDECK_THEMES or name in BUILTIN_THEMES


def unknown_theme(name: str, source: str) -> str:
    """The one-line reason an unknown theme name is refused, saying where it came from."""
    choices = ", ".join(known_theme_names()[:3])
    return f"unknown theme {name!r} ({source}); choose one of {choices} or a Textual built-in theme"


def next_theme(current: str) -> str:
    """The theme after `current` in the cycle (a non-gpudeck theme cycles back to the first)."""
    try:
        position = THEME_CYCLE.index(current)
    except ValueError:
        return THEME_CYCLE[0]
    return THEME_CYCLE[(position + 1) % len(THEME_CYCLE)]


__all__ = ["DEFAULT_THEME", "GPUDECK_THEMES", "THEME_CYCLE", "known_theme_names", "is_known_theme", "next_theme",
           "unknown_theme"]
