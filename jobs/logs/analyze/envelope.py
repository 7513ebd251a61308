"""Container log envelopes: docker's json-file records (`{"log":"…\\n","stream":"stderr","time":"…"}`) read as the text they carry.

A file under /var/lib/docker/containers/*/ holds one JSON object per line; the log's text, JSON-escaped
(`\\"`, `\\n`, `\\t`, `\\u001b`), is its "log" field. Unwrapped here, before the scanner sees a byte, the
file reads as the plain log would (engine, phase, progress, failure and its line): each record is one
line of the file and one line of the text, so line numbers are the file's. Docker cuts a line longer
than 16 KiB into records without the trailing newline: those are joined into one line, and the lines
they took in the file follow it empty. Whether the file is one is decided on its first non-blank line
(the envelope found anywhere in it: a wrapper's prefix before it is kept); the same whatever the
chunking. Escapes decode to the bytes they stand for (an ESC among them): what reaches a terminal goes
through sanitize as every log's bytes do.
"""
from __future__ import annotations

import json
import re
from typing import Optional

from . import regexcache

# The record's start, with the spaces another encoder than docker's may put in (`{"log": "…`).
OPEN = regexcache.compile(rb'\{\s*"log"\s*:\s*"')
# The "log" field's string literal, decoded from its opening quote (control bytes taken as they are).
_STRING = json.JSONDecoder(strict=False)
UNDECIDED_MAX = 1 << 16      # a first line this long without its newline: no envelope, read as it is
PENDING_MAX = 1 << 20        # a partial line kept at most this long, then passed on unread as an envelope


class Unwrapper:
    """Feed it a log's bytes in pieces; it returns the bytes the scanner reads (complete lines unwrapped)."""

    __slots__ = ("on", "pending", "owed")

    def __init__(self) -> None:
        self.on: Optional[bool] = None   # None: not decided yet
        self.pending = b""               # the partial line held back
        self.owed = 0                    # newlines of joined partial records, written after their line ends

    def feed(self, data: bytes) -> bytes:
        buf = self.pending + data if self.pending else data
        if self.on is None:
            start = len(buf) - len(buf.lstrip())
            nl = buf.find(b"\n", start)
            if nl < 0:
                if len(buf) > UNDECIDED_MAX:
                    self.on, self.pending = False, b""
                    return buf
                self.pending = buf
                return b""
            self.on = OPEN.search(buf, start, nl) is not None
            if not self.on:
                self.pending = b""
                return buf
        end = buf.rfind(b"\n") + 1
        if end == 0 and len(buf) <= PENDING_MAX:
            self.pending = buf
            return b""
        if end == 0:
            end = len(buf)
        self.pending = buf[end:]
        return self._unwrap(buf[:end])

    def finish(self) -> bytes:
        rest, self.pending = self.pending, b""
        if not self.on:
            return rest
        out = self._unwrap(rest) if rest else b""
        return out + b"\n" * self.owed if self.owed else out

    def _unwrap(self, block: bytes) -> bytes:
        out = []
        lines = block.split(b"\n")
        last = len(lines) - 1
        for i, line in enumerate(lines):
            if i == last and not line:
                break
            text = _record_text(line, self.owed > 0)
            if text is None:                 # not a record: as it is
                out.append(line + b"\n" if i < last else line)
            elif text.endswith(b"\n"):
                out.append(text + b"\n" * self.owed)
                self.owed = 0
            else:                            # a partial record: its line goes on in the next one
                out.append(text)
                self.owed += 1
        return b"".join(out)


def _record_text(line: bytes, continued: bool) -> Optional[bytes]:
    """The text a record line carries (a wrapper's prefix kept, not on a continued line), or None."""
    m = OPEN.search(line)
    if m is None:
        return None
    s = line.decode("utf-8", "surrogateescape")
    j = len(line[:m.start()].decode("utf-8", "surrogateescape"))
    try:
        value, _ = _STRING.raw_decode(s, j + len(m.group()) - 1)
    except ValueError:                       # cut short or a bad escape: no record
        return None
    text = value if continued else s[:j] + value
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:               # a lone \ud800 escape: its bytes, which the scanner replaces
        return text.encode("utf-8", "surrogatepass")
