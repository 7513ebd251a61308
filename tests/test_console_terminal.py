"""The console's terminal driver on a real pty: its input thread sleeps between keys, yet a lone ESC,
other keys and q still work."""
from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import sys
import termios
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DEADLINE_S = 30.0     # generous: two cores shared by many test runs

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the quiet driver is Linux's")


class Console:
    """`python -m gpudeck.console ARGS` on a pty of 110x30, its output collected as it comes."""

    def __init__(self, args: list[str], tmp_path: Path) -> None:
        self.pid, self.master = pty.fork()
        if self.pid == 0:
            env = dict(os.environ, TERM="xterm-256color", PYTHONPATH=str(REPO), XDG_CONFIG_HOME=str(tmp_path))
            os.chdir(REPO)
            os.execve(sys.executable, [sys.executable, "-m", "gpudeck.console", *args], env)
        fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 110, 0, 0))
        self.output = b""
        self.status = None

    def read(self, timeout: float) -> None:
        if select.select([self.master], [], [], timeout)[0]:
            try:
                self.output += os.read(self.master, 65536)
            except OSError:                  # the console exited: the pty closed
                pass

    def wait_drawn(self, text: bytes, after: int = 0, what: str = "") -> None:
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline and text not in self.output[after:]:
            self.read(0.2)
        assert text in self.output[after:], f"never drew {text!r} ({what}); saw {self.output[-1500:]!r}"

    def settle(self, quiet_s: float = 0.5) -> None:
        """Read until the console has written nothing for `quiet_s` (a frame can span several reads)."""
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            before = len(self.output)
            self.read(quiet_s)
            if len(self.output) == before:
                return

    def press(self, keys: bytes) -> int:
        mark = len(self.output)
        os.write(self.master, keys)
        return mark

    def exited_within(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.read(0.05)
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self.status = status
                return True
        return False

    def close(self) -> None:
        if self.status is None:
            os.kill(self.pid, 9)
            os.waitpid(self.pid, 0)
        os.close(self.master)


def context_switches(pid: int) -> int:
    """Voluntary + involuntary context switches of every thread of `pid` so far (each wake-up counts)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            for line in Path(f"/proc/{pid}/task/{tid}/status").read_text().splitlines():
                if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                    total += int(line.split()[1])
        except OSError:          # a thread that ended meanwhile
            pass
    return total


def test_an_idle_console_sleeps_and_still_answers_esc_keys_and_q(tmp_path) -> None:
    console = Console(["--demo", "--refresh", "3600"], tmp_path)
    try:
        console.wait_drawn(b"GPUs (8)", what="the dashboard")
        # Let start-up settle (first sample, first paints), then count wake-ups over 3 s of nothing.
        # Textual's own input loop polls the tty 10 times a second: 30+ wake-ups in 3 s on its own.
        time.sleep(2.0)
        before = context_switches(console.pid)
        time.sleep(3.0)
        woken = context_switches(console.pid) - before
        assert woken < 12, f"the idle console woke {woken} times in 3 s"

        mark = console.press(b"?")
        console.wait_drawn(b"gpudeck keys", mark, "the help screen")
        console.settle()
        # A lone ESC is only known to be ESC when no more bytes follow: the driver must wake for
        # the parser's deadline even though it otherwise sleeps until input.
        mark = console.press(b"\x1b")
        # With no ticks (refresh 3600) nothing repaints the panels under the help but its closing.
        console.wait_drawn(b"GPUs (8)", mark, "the dashboard under the help, once ESC closed it")
        console.settle()
        mark = console.press(b"2")
        console.wait_drawn(b"REPLAY", mark, "the jobs view (the demo replays its recordings)")

        console.press(b"q")
        assert console.exited_within(10.0), f"q did not end the console; saw {console.output[-1500:]!r}"
        assert os.waitstatus_to_exitcode(console.status) == 0
        assert b"Traceback" not in console.output
    finally:
        console.close()
