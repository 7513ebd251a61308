"""Make raw job output safe for a terminal: no escape sequence, control character or invalid UTF-8 gets through.

Job output is untrusted bytes: a colour code is harmless, but OSC 52 writes the
operator's clipboard, other sequences retitle windows, move the cursor or hide
lines. Every sequence is removed (not interpreted), every other control except
TAB is dropped, invalid UTF-8 becomes U+FFFD, bidirectional-override controls
(which make text read differently from what it is) are shown escaped as `<U+202E>`,
and a `\\r`-redrawn progress line shows what a terminal would have left visible:
its last segment. Only the display is changed; the bytes on disk stay exactly
what the job wrote.

`sanitize_text` is THE sanitizer for every string that came from a job, a log, a
process table or a config before it reaches a terminal (CLI and console alike).
"""
from __future__ import annotations

import re

# Longest line returned by default; the rest is replaced by a marker naming the
# size. A 20 MB line on disk stays whole; a terminal does not need it all.
MAX_LINE_CHARS = 16384
# Each char decodes from at most 4 bytes: cutting the bytes first keeps a huge
# line's cost proportional to what is shown.
_BYTES_PER_CHAR = 4

_SEQUENCE = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"                  # CSI (7- and 8-bit), possibly cut short
    r"|(?:\x1b\]|\x9d)[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"  # OSC: titles, hyperlinks, OSC 52 clipboard
    r"|(?:\x1b[PX^_]|[\x90\x98\x9e\x9f])[^\x1b\x9c]*(?:\x1b\\|\x9c)?"  # DCS, SOS, PM, APC strings
    r"|\x1b[ -/]*[0-~]?"                                  # any other ESC sequence, or a lone ESC
)
# Everything below 0x20 except TAB, DEL, and the C1 range.
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")
# Bidi embeddings/overrides/isolates and the implicit marks: "Trojan Source" text
# that displays in another order than it reads. Shown, not obeyed.
_BIDI = re.compile(r"[\u202a-\u202e\u2066-\u2069\u200e\u200f\u061c]")
_NEEDS_WORK = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u200e\u200f\u061c]")


def last_segment(raw: bytes) -> bytes:
    """What a terminal leaves visible of a `\\r`-redrawn line: the last non-empty segment.

    "50%\\r100%\\n" -> "100%"; a CRLF line ending is not a redraw.
    """
    if raw.endswith(b"\n"):
        raw = raw[:-1]
    raw = raw.rstrip(b"\r")
    cut = raw.rfind(b"\r")
    return raw if cut < 0 else raw[cut + 1:]


def sanitize_text(text: str) -> str:
    """Remove escape sequences and control characters (TAB kept) from already-decoded text."""
    if not _NEEDS_WORK.search(text):
        return text
    text = _SEQUENCE.sub("", text)
    text = _CONTROL.sub("", text)
    return _BIDI.sub(lambda m: f"<U+{ord(m.group()):04X}>", text)


def terminal_text(value: object, limit: int | None = None) -> str:
    """Any value (None, a number, a job's message) as one terminal-safe line, cut to `limit` chars."""
    if value is None:
        return ""
    text = value if isinstance(value, str) else str(value)
    if limit is not None and len(text) > limit * 2:
        text = text[:limit * 2]          # bound the work before sanitising a huge value
    text = sanitize_text(text)
    return text[:limit] if limit is not None else text


def sanitize_line(raw: bytes, max_chars: int | None = MAX_LINE_CHARS) -> str:
    """One raw line (with or without its `\\n`) as terminal-safe text of at most about `max_chars`.

    A longer line ends with a marker saying how many bytes were not shown.
    """
    segment = last_segment(raw)
    dropped = 0
    if max_chars is not None and len(segment) > max_chars * _BYTES_PER_CHAR:
        dropped = len(segment) - max_chars * _BYTES_PER_CHAR
        segment = segment[:max_chars * _BYTES_PER_CHAR]
    text = sanitize_text(segment.decode("utf-8", "replace"))
    if max_chars is not None and len(text) > max_chars:
        dropped += len(text[max_chars:].encode("utf-8"))
        text = text[:max_chars]
    if dropped:
        text += f" …[{dropped} more bytes not shown]"
    return text


def sanitize_block(raw: bytes, max_chars: int | None = MAX_LINE_CHARS) -> list[str]:
    """Several `\\n`-separated lines at once (a trailing newline does not add an empty line)."""
    if not raw:
        return []
    parts = raw.split(b"\n")
    if parts[-1] == b"":
        parts.pop()
    return [sanitize_line(p, max_chars) for p in parts]


def fold(text: str, width: int) -> list[str]:
    """Hard-wrap text into pieces of at most `width` characters (at least one piece)."""
    if width <= 0 or len(text) <= width:
        return [text]
    return [text[i:i + width] for i in range(0, len(text), width)]
