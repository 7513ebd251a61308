"""Issue 9, logs -f: the current \\r redraw of an unfinished last line is shown while following, as a terminal would."""
from __future__ import annotations

import io
import os
import selectors
import subprocess
import time

from gpudeck.console.commands.logs import LinePrinter
from gpudeck.jobs.runs import latest_run

from runsupport import PY, REPO, cli, cli_env, wait_for, write_jobs


def test_logs_follow_shows_the_current_redraw_of_a_bar_without_newline(tmp_path, state):
    script = tmp_path / "bar.py"
    script.write_text("import sys, time\nprint('start', flush=True)\n"
                      "for i in range(1, 5):\n    sys.stdout.write(f'\\rstep {i}/4'); sys.stdout.flush(); time.sleep(0.3)\n"
                      "time.sleep(300)\n")
    jobs = write_jobs(tmp_path / "jobs.toml", {"bar": {"cmd": f"{PY} -u {script}"}})
    env = cli_env(state)
    assert cli(["--jobs", str(jobs), "start", "bar"], env).returncode == 0
    follower = subprocess.Popen([PY, "-m", "gpudeck.console.cli", "--jobs", str(jobs), "logs", "-f", "bar"],
                                cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    seen = b""
    try:
        sel = selectors.DefaultSelector()
        sel.register(follower.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + 20
        while b"step 4/4" not in seen and time.monotonic() < deadline:
            if sel.select(timeout=0.5):
                chunk = os.read(follower.stdout.fileno(), 65536)
                if not chunk:
                    break
                seen += chunk
    finally:
        follower.kill()
        follower.wait()
        cli(["--jobs", str(jobs), "stop", "bar", "--timeout", "2"], env)
    assert seen.startswith(b"start\n"), seen
    assert b"step 4/4\n" in seen, seen             # shown while the job still runs, without a newline of its own
    assert b"\r" not in seen and b"\x1b" not in seen  # not a terminal: plain lines


def test_on_a_terminal_the_redraw_replaces_itself_and_the_finished_line_replaces_it():
    out = io.BytesIO()
    printer = LinePrinter(out, tty=True)
    printer.show_partial(b"\rstep 1/4", now=0.0)
    printer.show_partial(b"\rstep 1/4\rstep 2/4\x1b]52;c;AAAA\x07", now=0.1)
    from gpudeck.jobs.logs.follow import LogLine
    printer.write(LogLine(0, b"\rstep 1/4\rstep 2/4\rdone", True))
    assert out.getvalue() == b"\r\x1b[Kstep 1/4\r\x1b[Kstep 2/4\r\x1b[Kdone\n"


def test_off_a_terminal_a_partial_line_already_printed_is_not_printed_again_when_it_ends():
    # `logs -f | cat`: the unterminated tail shown while following is the same text the
    # run's end flushes; a pipe cannot take a line back, so it must not get it twice.
    from gpudeck.jobs.logs.follow import LogLine
    out = io.BytesIO()
    printer = LinePrinter(out, tty=False)
    printer.write(LogLine(0, b"line-1", True))
    printer.show_partial(b"tail-without-newline", now=10.0)
    printer.end(LogLine(7, b"tail-without-newline", True))
    assert out.getvalue() == b"line-1\ntail-without-newline\n"
    # A redraw that moved on after it was shown still ends with its final state.
    out = io.BytesIO()
    printer = LinePrinter(out, tty=False)
    printer.show_partial(b"\rstep 1/4", now=10.0)
    printer.end(LogLine(0, b"\rstep 1/4\rstep 4/4", True))
    assert out.getvalue() == b"step 1/4\nstep 4/4\n"


def test_a_fifo_planted_as_output_log_never_blocks_a_reader(tmp_path):
    """A FIFO in place of output.log (a tampered run dir) is read as nothing, at once, by every log reader."""
    import threading

    from gpudeck.console.widgets.log_index import LogIndex
    from gpudeck.jobs.logs.follow import LogFollower, tail_offset
    fifo = tmp_path / "output.log"
    os.mkfifo(fifo)
    answers: dict = {}

    def read_all() -> None:
        answers["follower"] = LogFollower(str(fifo), 0).read()
        answers["tail"] = tail_offset(fifo, 10)
        index = LogIndex(str(fifo))
        answers["index"] = index.update()
        answers["lines"] = index.line_count

    reader = threading.Thread(target=read_all, daemon=True)
    reader.start()
    reader.join(timeout=10)
    assert not reader.is_alive(), "a log reader blocked on a FIFO"
    assert answers["follower"] == [] and answers["tail"] == 0 and answers["lines"] == 0
