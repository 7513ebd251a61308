"""Paints (text, style) parts straight into Strips, with theme styles resolved once per theme and background.

Content -> Strip conversion costs ~14 us per span on a slow core; the dashboard repaints
~100 spans per tick. Resolving each style string once and building Segments directly
makes a repainted line cost a few microseconds. Style strings use theme variables
("bold $warning", "$primary on $panel"); `$text-muted` is blended onto the widget's own
background, as Textual does for translucent colours.
"""
from __future__ import annotations

# Textual internals touched here (textual pinned to 8.2.x; tests/test_console_composed_lines.py
# compares every painted widget's lines with Textual's own on every view and state):
#   Widget._size  content_width: the size the compositor set, without Widget.size's screen-map
#     lookup (~20 us, ~20 a tick: ~0.4 ms of a ~2.5-3 ms tick);
#   Screen._compositor, Compositor._full_map, .visible_widgets, Widget._styles_cache.clear()
#     scrolled_out: a panel below the fold drops its lines instead of a whole-screen layout
#     (0.35 ms a tick, ~14 %);
#   Widget._set_dirty, Screen._dirty_widgets, `widget in screen._compositor`  repaint_regions:
#     no Prompt -> Update round trip per repainted panel (message handling 0.25 -> 0.07 ms, ~6 %);
#   Widget._styles_cache (._cache, ._dirty_lines, ._width), rich Style._link_id  PaintedLines composes a
#     repainted content line itself (UI compositor 0.90 -> 0.62 ms a tick, ~10 %).
# Each measured over 2 % of a UI tick, the bar an internal must clear to stay.

from typing import Any, Iterable, Optional, Sequence, Union

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style as RichStyle
from textual.color import Color
from textual.style import Style
from textual.geometry import Region
from textual.strip import Strip
from textual.markup import parse_style
from textual.widget import Widget

Part = Union[str, tuple[str, str]]


class StripPainter:
    """Owned by one widget. Call `invalidate()` whenever the widget's classes or focus change
    (never merely because its data did), and `ensure()` at the top of `render_line`: the widget's
    base style (walking the DOM costs ~0.1 ms) is then read again only after a change that can
    alter it, not on every tick's repaint. A theme change invalidates by itself."""

    def __init__(self, widget: Widget) -> None:
        self.widget = widget
        self.generation = 0          # bumps when resolved styles change: line caches compare it
        self._key: object = None
        self._checked = False
        self._base = RichStyle()
        self._styles: dict[str, RichStyle] = {}
        self._variables: dict[str, str] | None = None
        self._subscribed = False

    def _theme_changed(self, _theme: object) -> None:
        self.invalidate()
        self.widget.refresh()

    def invalidate(self) -> None:
        self._checked = False

    def ensure(self) -> None:
        """Drop resolved styles if the theme or the widget's own colours changed."""
        if self._checked:
            return
        self._checked = True
        if not self._subscribed:
            # Subscribing needs a mounted widget: the first paint is the first safe moment.
            self.widget.app.theme_changed_signal.subscribe(self.widget, self._theme_changed)
            self._subscribed = True
        base = self.widget.rich_style
        key = (self.widget.app.theme, base)
        if key != self._key:
            self._key = key
            self._base = base
            self._styles.clear()
            self._variables = None
            self.generation += 1

    def _resolve(self, style: str) -> RichStyle:
        resolved = self._styles.get(style)
        if resolved is None:
            base = self._base
            if not style:
                resolved = base
            else:
                if self._variables is None:
                    variables = dict(self.widget.app.theme_variables)
                    background = Color.from_rich_color(base.bgcolor) if base.bgcolor else Color(0, 0, 0)
                    variables["text-muted"] = (background + background.get_contrast_text(0.6)).hex
                    self._variables = variables
                resolved = base + parse_style(style, self._variables).rich_style
            self._styles[style] = resolved
        return resolved

    def strip(self, parts: Iterable[Part], width: int) -> Strip:
        # Runs of equal style become one segment: everything downstream (filters, the
        # compositor, the terminal's escape codes) costs per segment.
        texts: list[str] = []
        styles: list[RichStyle] = []
        last_style: object = None
        resolved = self._base
        for part in parts:
            text, style = (part, "") if isinstance(part, str) else part
            if not text:
                continue
            if style != last_style:
                last_style = style
                resolved = self._resolve(style)
            if styles and styles[-1] is resolved:
                texts[-1] += text
            else:
                texts.append(text)
                styles.append(resolved)
        # The strip's cell length is known here (ASCII: one cell a character), so Textual need
        # not measure every segment again, and padding to the width makes no second Strip.
        cells = sum(len(t) if t.isascii() else cell_len(t) for t in texts)
        if cells > width:
            return Strip([Segment(t, s) for t, s in zip(texts, styles)]).adjust_cell_length(width, self._base)
        if cells < width:
            if styles and styles[-1] is self._base:
                texts[-1] += " " * (width - cells)
            else:
                texts.append(" " * (width - cells))
                styles.append(self._base)
        return Strip([Segment(t, s) for t, s in zip(texts, styles)], width)

    def blank(self, width: int) -> Strip:
        return Strip.blank(width, self._base)


def content_width(widget: Widget) -> int:
    """`widget.size.width` without its cost: `size` finds the widget in the screen's map (~20 us on a
    slow core, and a tick asked it ~20 times); the outer size the compositor set at the last layout,
    less borders and padding, is the same number for a widget on screen."""
    return max(0, widget._size.width - widget.styles.gutter.width)


def scrolled_out(widget: Widget) -> bool:
    """Laid out on its screen but outside what the screen shows (scrolled out of a scrolling body)."""
    try:
        compositor = widget.screen._compositor
    except Exception:  # noqa: BLE001 - not on a screen (yet): nothing to decide, refresh as usual
        return False
    laid_out = compositor._full_map
    return bool(laid_out) and widget in laid_out and widget not in compositor.visible_widgets


def plain(parts: Iterable[Part]) -> str:
    return "".join(p if isinstance(p, str) else p[0] for p in parts)


def refresh_changed_lines(widget: Widget, shown: Sequence[object], new: Sequence[object], top: int = 0) -> None:
    """Repaint only the content lines whose description changed between `shown` and `new`.

    `widget.refresh()` repaints every line of the widget through Textual's styles cache and
    compositor (~0.08 ms a line on a slow core) and re-sends them to the terminal, borders
    included; most lines of a panel show the same text from one tick to the next. A line
    count change re-lays out the widget; a widget not laid out yet is repainted whole.
    """
    width = content_width(widget)
    if len(shown) != len(new):
        widget.refresh(layout=True)
    elif scrolled_out(widget):
        # Refreshing a widget the screen does not show makes Textual rebuild the layout map of the
        # whole screen at the next frame (~0.35 ms here, every tick, for a process table below the
        # fold). Its lines are repainted from scratch when a scroll shows it again.
        widget._styles_cache.clear()
    elif not width:
        widget.refresh()
    else:
        changed = [Region(0, top + y, width, 1) for y, (old, now) in enumerate(zip(shown, new)) if old != now]
        if changed:
            repaint_regions(widget, changed)


def repaint_regions(widget: Widget, regions: list[Region]) -> None:
    """`widget.refresh(*regions)` for a widget whose size and styles did not change, without the two
    messages a widget it costs: refresh() prompts the widget, whose idle handler posts an Update to the
    screen, whose handler marks it dirty (~0.05 ms a widget on a slow core, three widgets a tick).
    The screen is told directly, as that handler would, and prompted once."""
    try:
        screen = widget.screen
    except Exception:  # noqa: BLE001 - not on a screen (yet): Textual's way paints it when it is
        widget.refresh(*regions)
        return
    if not (widget.is_mounted and widget.display and screen in screen._compositor):
        widget.refresh(*regions)
        return
    widget._set_dirty(*regions)
    screen._dirty_widgets.add(widget)
    screen.check_idle()


class _Edges:
    """What Textual composes around a content line of one widget (border, padding), read back from
    a line its styles cache composed, and what composing needs besides: valid while that cache
    still holds the line it was read from (a resize, a style, class, focus or theme change clears it)."""

    __slots__ = ("y", "strip", "left", "right", "top", "bottom", "width", "content_width", "inner", "background")

    def __init__(self, y: int, strip: Strip, left: list, right: list, top: int, bottom: int, width: int,
                 content_width: int, inner: RichStyle, background: Color) -> None:
        self.y, self.strip, self.left, self.right = y, strip, left, right
        self.top, self.bottom, self.width, self.content_width = top, bottom, width, content_width
        self.inner, self.background = inner, background


def _plain_box(widget: Widget) -> bool:
    """Whether Textual's styles cache does no more to a content line than pad it and add its
    border: no tint, opacity, text opacity, hatch or outline, and no link to underline on hover."""
    styles = widget.styles
    if styles.tint.a or styles.text_opacity != 1.0 or widget.opacity != 1.0:
        return False
    if styles.has_rule("hatch") and styles.hatch != "none":
        return False
    if any(edge for edge, _ in styles.outline):
        return False
    return not (widget.auto_links and widget.hover_style._link_id)


class PaintedLines:
    """Mixin for widgets whose lines are lists of (text, style) parts painted by a StripPainter.

    Each line's Strip is cached by (parts, width, theme generation), so a line whose text
    and styles did not change costs a dict lookup when Textual asks for it again.

    A repainted content line skips Textual's styles cache (`render_lines`): that composes the
    line again from the widget's CSS (~0.2 ms a call and ~30 us a line on a slow core, against
    a few us for the painter), though only the content changed. The border and padding around it
    are read back from a line the styles cache composed, and checked once: composing that line
    here must give the same segments, or the widget keeps Textual's path.
    """

    _painter_: StripPainter | None = None
    _edges_: Optional[_Edges] = None
    composed_lines = 0           # lines composed here rather than by the styles cache (tests read it)

    @property
    def _painter(self) -> StripPainter:
        if self._painter_ is None:
            self._painter_ = StripPainter(self)      # type: ignore[arg-type]
        return self._painter_

    def painted_line(self, y: int, lines: Sequence[Iterable[Part]]) -> Strip:
        width = content_width(self)                  # type: ignore[arg-type]
        painter = self._painter
        painter.ensure()
        if y >= len(lines):
            return painter.blank(width)
        cache: dict[int, tuple[object, Strip]] = self.__dict__.setdefault("_painted_strips", {})
        key = (lines[y], width, painter.generation)
        cached = cache.get(y)
        if cached is None or cached[0] != key:
            cached = (key, painter.strip(lines[y], width))
            cache[y] = cached
        return cached[1]

    def render_lines(self, crop: Region) -> list[Strip]:
        cache = self._styles_cache                   # type: ignore[attr-defined]
        lines, dirty = cache._cache, cache._dirty_lines
        edges = self._edges_
        rows = crop.line_range
        if (edges is None or lines.get(edges.y) is not edges.strip or cache._width != edges.width
                or self._size.width != edges.width                                  # type: ignore[attr-defined]
                or any((y in dirty or y not in lines) and not edges.top <= y < edges.bottom for y in rows)):
            # Not composed here yet, the styles cache was cleared, or a border line needs painting.
            strips = super().render_lines(crop)      # type: ignore[misc]
            self._edges_ = self._read_edges()
            return strips
        strips = []
        for y in rows:
            strip = None if y in dirty else lines.get(y)
            if strip is None:
                strip = self._compose_line(edges, y)
                lines[y] = strip
                if y == edges.y:
                    edges.strip = strip
                self.composed_lines += 1
            strips.append(strip)
        dirty.difference_update(rows)
        filters = self.get_line_filters()            # type: ignore[attr-defined]
        if filters:
            background = edges.background
            for index, strip in enumerate(strips):
                for line_filter in filters:
                    strip = strip.apply_filter(line_filter, background)
                strips[index] = strip
        if crop.column_span != (0, edges.width):
            x1, x2 = crop.column_span
            strips = [strip.crop(x1, x2) for strip in strips]
        return strips

    def _compose_line(self, edges: _Edges, y: int) -> Strip:
        content = self.render_line(y - edges.top)   # type: ignore[attr-defined]
        if content.cell_length != edges.content_width:
            content = content.adjust_cell_length(edges.content_width, edges.inner)
        return Strip([*edges.left, *content, *edges.right], edges.width)

    def _read_edges(self) -> Optional[_Edges]:
        """The edges of a content line the styles cache holds, if composing it here matches."""
        widget: Any = self
        cache = widget._styles_cache
        width, height = widget._size
        gutter = widget.styles.gutter
        top, bottom = gutter.top, height - gutter.bottom
        y = next((y for y in range(top, bottom) if y in cache._cache and y not in cache._dirty_lines), None)
        if y is None or cache._width != width or not _plain_box(widget):
            return None
        strip = cache._cache[y]
        base_background, background = widget.background_colors
        inner = Style(background=base_background + background).rich_style
        edges = _Edges(y, strip, list(strip.crop(0, gutter.left)), list(strip.crop(width - gutter.right, width)),
                       top, bottom, width, width - gutter.width, inner, background)
        if list(self._compose_line(edges, y)) != list(strip):
            return None
        return edges
