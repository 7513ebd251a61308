"""`gpudeck logs JOB [-n N] [-f] [--run ID]`: a run's output as the job wrote it, made safe for the terminal."""
from __future__ import annotations

import argparse
import shutil
import sys
import time
from typing import TYPE_CHECKING, BinaryIO, Optional

from gpudeck.jobs.logs.sanitize import MAX_LINE_CHARS, sanitize_line

from gpudeck.console.errors import CliError

if TYPE_CHECKING:
    from gpudeck.jobs.logs.follow import LogLine

# Keep up to this much of a \r-redrawn long line's last segment to show it at the end.
_TAIL_KEEP = 64 * 1024


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("logs", help="print a job's output (sanitised); -f follows",
                       description="Print the output of JOB's latest run (or --run ID) as the job wrote it, "
                                   "with escape sequences and control characters removed and \\r progress "
                                   "redraws collapsed. Lines over 16K characters are cut for display; the "
                                   "run's output.log keeps every byte.")
    p.add_argument("job", metavar="JOB")
    p.add_argument("-n", "--lines", type=int, default=None, metavar="N", help="only the last N lines")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new output until the run ends")
    p.add_argument("--run", metavar="ID", default=None, help="a run id (or a unique part of one)")
    p.set_defaults(handler=run_logs, remote_ok=True)


# Not on a terminal (a pipe, a file), the unfinished last line is printed as a line of its own
# when it changed, at most this often: a bar redrawn 50 times a second is not 50 lines.
PARTIAL_EVERY_S = 1.0


class LinePrinter:
    """Writes LogLines to a byte stream: sanitised, huge lines shown once and cut, never held whole."""

    def __init__(self, out: BinaryIO, tty: bool = False) -> None:
        self.out = out
        self.tty = tty
        self.encoding = "utf-8"
        self._long_head: Optional[str] = None     # shown text of the first piece of a long line
        self._long_bytes = 0
        self._long_tail: Optional[bytes] = None   # since the last \r of a long redrawn line
        self._partial_shown: Optional[str] = None  # the redraw of the unfinished line shown last
        self._partial_on_screen = False            # tty: it sits on the cursor's row, to be replaced
        self._partial_at = float("-inf")

    def show_partial(self, partial: bytes, now: Optional[float] = None) -> None:
        """The unfinished last line as a terminal shows it now: its current `\r` redraw (follow mode).

        On a terminal it is drawn on the cursor's row (our own \r and erase-line, the job's
        bytes sanitised) and replaced by the next redraw or the finished line; elsewhere it
        is printed as a line when it changed, at most every PARTIAL_EVERY_S.
        """
        raw = partial
        if self._long_head is not None:
            if self._long_tail is None and b"\r" not in partial:
                return                  # a huge line still being written: shown once, when complete
            raw = (self._long_tail or b"") + partial
        text = sanitize_line(raw) if raw else ""
        if not text or text == self._partial_shown:
            return
        now = time.monotonic() if now is None else now
        if self.tty:
            width = max(10, shutil.get_terminal_size().columns - 1)
            self.out.write(b"\r\x1b[K" + text[:width].encode(self.encoding, "replace"))
            self._partial_on_screen = True
        else:
            if now - self._partial_at < PARTIAL_EVERY_S:
                return
            self.out.write(text.encode(self.encoding, "replace") + b"\n")
            self._partial_at = now
        self._partial_shown = text
        self.out.flush()

    def write(self, line: LogLine) -> None:
        if not line.complete or self._long_head is not None:
            self._piece(line)
            return
        self._emit(sanitize_line(line.data))

    def _piece(self, line: LogLine) -> None:
        if self._long_head is None:
            self._long_head = sanitize_line(line.data)
            self._long_bytes = 0
            self._long_tail = None
        self._long_bytes += len(line.data)
        cut = line.data.rfind(b"\r")
        if cut >= 0:
            self._long_tail = line.data[cut + 1:][-_TAIL_KEEP:]
        elif self._long_tail is not None:
            self._long_tail = (self._long_tail + line.data)[-_TAIL_KEEP:]
        if line.complete:
            if self._long_tail is not None:
                # A progress bar redrawn for hours without a newline: show its last state.
                self._emit(sanitize_line(self._long_tail))
            else:
                head = self._long_head[:MAX_LINE_CHARS]
                self._emit(f"{head} …[line of {self._long_bytes} bytes, cut for display]")
            self._long_head = None
            self._long_tail = None

    def finish(self) -> None:
        if self._long_head is not None:
            self._emit(f"{self._long_head[:MAX_LINE_CHARS]} …[unfinished line of {self._long_bytes} bytes]")
            self._long_head = None

    def end(self, tail: Optional[LogLine] = None) -> None:
        """The output's end: the source's unterminated last line (if any), a long line still open, all flushed."""
        if tail is not None:
            self.write(tail)
        self.finish()
        self.flush()

    def _emit(self, text: str) -> None:
        if not self.tty and self._partial_shown is not None and text == self._partial_shown:
            self._partial_shown = None      # a pipe already has this line (shown while unfinished)
            return
        if self._partial_on_screen:
            self.out.write(b"\r\x1b[K")          # the finished line replaces its last redraw
            self._partial_on_screen = False
        self._partial_shown = None
        self.out.write(text.encode(self.encoding, "replace") + b"\n")

    def flush(self) -> None:
        self.out.flush()


def run_logs(args: argparse.Namespace) -> int:
    """The run's bytes from its box by offset, split into lines and sanitised here (the same printer for any box)."""
    from gpudeck.jobs.logs.follow import LogFollower
    if args.lines is not None and args.lines < 0:
        raise CliError("-n must be 0 or more", code=2)
    from gpudeck.console.commands._host import open_box
    printer = LinePrinter(sys.stdout.buffer, tty=sys.stdout.isatty())
    lines = LogFollower("", 0)            # used only to split the arriving bytes into lines

    def write(chunk: bytes) -> None:
        for line in lines.feed(chunk):
            printer.write(line)
        printer.flush()

    def idle() -> None:
        if lines.partial:
            printer.show_partial(lines.partial)     # a \r progress bar being redrawn, no newline yet

    with open_box(args) as box:
        # Idle reads at most PARTIAL_EVERY_S apart: a bar's last redraw shows within about a second.
        box.follow_log(args.job, write, run=args.run, tail=args.lines, follow=args.follow, wait_s=PARTIAL_EVERY_S,
                       on_idle=idle)
    printer.end(lines.flush())
    return 0
