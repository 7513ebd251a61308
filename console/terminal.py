"""The console's terminal driver: its input thread sleeps until a key arrives instead of waking 10 times a second."""
from __future__ import annotations

# Textual internals touched here (textual pinned to 8.2.x; tests/test_console_terminal.py drives the
# driver in a real pty):
#   textual._xterm_parser.XTermParser and its _timeout_time  the parser Textual's own input thread
#     uses, and the deadline by which it decides what a lone ESC was (else FALLBACK_POLL_S);
#   textual._time.get_time  the clock that deadline is measured on;
#   LinuxDriver.run_input_thread (overridden), ._debug, .exit_event, .fileno.
# What it buys: an idle console wakes on input instead of 10 times a second (30 -> < 12 wake-ups in
# 3 idle seconds; the input loop was 1.6-2.0 of ~6 ms/s of the console's CPU, ~30 %).

import os
import selectors
import threading
from codecs import getincrementaldecoder
from typing import Any, Optional

from textual._time import get_time
from textual._xterm_parser import XTermParser
from textual.drivers.linux_driver import LinuxDriver

# Textual's own input loop polls the tty every 0.1 s even when nothing happens: on an idle
# dashboard that loop is the console's whole CPU use (~0.17 % of a core, a third of the 2 s
# refresh budget next to nvitop). This one blocks until input, its parser's escape-key
# deadline, or the driver's exit wakes it through a pipe.
FALLBACK_POLL_S = 0.1   # when the parser's deadline cannot be read (a Textual we do not know)


class _WakingEvent(threading.Event):
    """The driver's exit flag: setting it also wakes the input thread's select."""

    def __init__(self, wake_fd: int) -> None:
        super().__init__()
        self._wake_fd = wake_fd

    def set(self) -> None:
        super().set()
        try:
            os.write(self._wake_fd, b"x")
        except OSError:          # pipe full (already woken) or closed: the flag is set either way
            pass


class QuietLinuxDriver(LinuxDriver):
    """LinuxDriver whose input thread blocks in select() between keys."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self.exit_event = _WakingEvent(self._wake_w)

    def run_input_thread(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self.fileno, selectors.EVENT_READ, "tty")
        selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        parser = XTermParser(self._debug)
        decode = getincrementaldecoder("utf-8")().decode
        try:
            self._drain_wake()                  # a wake left over from an earlier input thread
            while not self.exit_event.is_set():
                self._read_ready(selector, selector.select(self._select_timeout(parser)), parser, decode, final=False)
            self._read_ready(selector, selector.select(0), parser, decode, final=True)
        finally:
            selector.close()
            try:
                for _event in parser.feed(""):
                    pass
            except Exception:  # noqa: BLE001 - an unfinished sequence at exit is dropped, as Textual does
                pass

    def _select_timeout(self, parser: XTermParser) -> Optional[float]:
        """None (sleep until input) unless the parser waits to decide what a lone ESC was."""
        try:
            deadline = parser._timeout_time
        except AttributeError:
            return FALLBACK_POLL_S
        if deadline is None:
            return None
        return max(0.0, deadline - get_time()) + 0.001

    def _read_ready(self, selector: selectors.BaseSelector, ready: list, parser: XTermParser, decode: Any, *, final: bool) -> None:
        for key, mask in ready:
            if key.data == "wake":
                self._drain_wake()
            elif mask & selectors.EVENT_READ:
                raw = os.read(self.fileno, 4096)
                if not raw:                     # the terminal is gone: stop watching it, do not spin
                    selector.unregister(self.fileno)
                    continue
                for event in parser.feed(decode(raw, final=final)):
                    self.process_message(event)
        for event in parser.tick():
            self.process_message(event)

    def _drain_wake(self) -> None:
        try:
            while os.read(self._wake_r, 512):
                pass
        except (BlockingIOError, OSError):
            pass

    def close(self) -> None:
        super().close()
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
