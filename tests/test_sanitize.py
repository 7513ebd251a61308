"""Job output made terminal-safe: escape sequences, OSC 52, C0/C1 controls, invalid UTF-8, \\r redraws, 20 MB lines; following by offset."""
from __future__ import annotations

import re

from hypothesis import given, settings, strategies as st

from gpudeck.jobs.logs.follow import LogFollower, follow, tail_offset
from gpudeck.jobs.logs.sanitize import MAX_LINE_CHARS, fold, sanitize_block, sanitize_line
from gpudeck.jobs.runs import latest_run

from runsupport import cli, cli_env, wait_for, write_jobs

# Nothing a terminal could act on: C0 except TAB/LF, DEL, C1.
UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")

HOSTILE = (
    b"\x1b]52;c;cm0gLXJmIH4K\x07clipboard-set\n"            # OSC 52: write the clipboard
    b"\x1b]0;owned title\x1b\\title-set\n"                    # OSC 0 with ST
    b"\x1b]8;;http://evil.example/\x1b\\link\x1b]8;;\x1b\\\n"  # hyperlink
    b"\x1b[2J\x1b[H\x1b[31mred\x1b[0m cleared\n"              # erase screen, home, colour
    b"\x1bP+q544e\x1b\\dcs\n"                                 # DCS (XTGETTCAP)
    b"\x1b_apc payload\x1b\\apc\n"
    b"\x9b6n 8-bit CSI raw\n"                                 # raw C1 byte: invalid UTF-8
    b"\xc2\x9b6n 8-bit CSI encoded\n"                         # C1 CSI as valid UTF-8 (U+009B)
    b"\xc2\x9d0;title\xc2\x9c osc8\n"
    b"bell\x07 backspace\x08 nul\x00 del\x7f vt\x0b ff\x0c\n"
    b"bad utf8 \xff\xfe\xed\xa0\x80 end\n"
    b"lone esc \x1b\n"
    b"cut sequence \x1b[1;3"                                   # a sequence cut by the end of a line
    b"\n"
    b"10%\r50%\r100% done\n"
    b"tab\tkept\n"
)


def assert_safe(text: str) -> None:
    assert not UNSAFE.search(text), repr(UNSAFE.search(text).group())
    assert "\x1b" not in text and "\r" not in text


def test_each_hostile_line_is_neutralised():
    lines = sanitize_block(HOSTILE)
    for line in lines:
        assert_safe(line)
    text = "\n".join(lines)
    assert "cm0gLXJmIH4K" not in text and "owned title" not in text and "evil.example" not in text
    assert "clipboard-set" in text and "title-set" in text and "red cleared" in text
    assert "\ufffd" in lines[10]                   # invalid UTF-8 became the replacement character
    assert lines[13] == "100% done"               # the last \r segment: what a terminal would show
    assert lines[14] == "tab\tkept"
    assert len(lines) == 15


def test_crlf_is_a_line_ending_not_a_redraw():
    assert sanitize_line(b"hello\r\n") == "hello"
    assert sanitize_line(b"50%\r\n") == "50%"
    assert sanitize_line(b"a\rb\r") == "b"
    assert sanitize_line(b"") == ""


def test_huge_line_is_cut_with_a_marker_and_fast():
    raw = b"x" * 20_000_000
    text = sanitize_line(raw)
    assert len(text) < MAX_LINE_CHARS + 100
    assert text.startswith("x" * 100) and "more bytes not shown" in text
    assert fold("abcdefg", 3) == ["abc", "def", "g"]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_any_bytes_come_out_terminal_safe(raw):
    assert_safe(sanitize_line(raw))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from([b"\x1b", b"[", b"]", b"P", b"\\", b"\x07", b"\x9b", b"\xc2\x9b", b"\xc2\x9d",
                                 b"\xc2\x9c", b"0", b";", b"m", b"a", b"\r", b"\xff", b"\t", b"\x00"]), max_size=60))
def test_escape_fragments_in_any_order_come_out_safe(parts):
    assert_safe(sanitize_line(b"".join(parts)))


def test_follower_reads_by_offset_keeps_the_partial_tail_and_splits_huge_lines(tmp_path):
    path = tmp_path / "out.log"
    path.write_bytes(b"one\ntw")
    f = LogFollower(path, max_line_bytes=10)
    assert [(l.offset, l.data, l.complete) for l in f.read()] == [(0, b"one", True)]
    assert f.partial == b"tw" and f.offset == 4
    with open(path, "ab") as fh:
        fh.write(b"o\n" + b"z" * 25 + b"\nend")
    got = [(l.offset, l.data, l.complete) for l in f.read()]
    assert got == [(4, b"two", True), (8, b"z" * 10, False), (18, b"z" * 10, False), (28, b"z" * 5, True)]
    assert f.read() == []
    tail = f.flush()
    assert (tail.offset, tail.data) == (34, b"end")
    # Resuming from a stored offset sees exactly the rest.
    again = LogFollower(path, 8, max_line_bytes=100)
    assert [l.data for l in again.read()] == [b"z" * 25]


def test_tail_offset_counts_lines_from_the_end(tmp_path):
    path = tmp_path / "t.log"
    path.write_bytes(b"a\nb\nc\n")
    assert tail_offset(path, 1) == 4 and tail_offset(path, 2) == 2 and tail_offset(path, 9) == 0
    path.write_bytes(b"a\nb\nunterminated")
    assert tail_offset(path, 1) == 4
    big = tmp_path / "big.log"
    big.write_bytes(b"".join(b"%d\n" % i for i in range(100_000)))
    off = tail_offset(big, 3, block=4096)
    assert big.read_bytes()[off:] == b"99997\n99998\n99999\n"


def test_follow_stops_after_done_and_flushes_the_tail(tmp_path):
    path = tmp_path / "f.log"
    path.write_bytes(b"x\ny")
    assert [l.data for l in follow(path, done=lambda: True, poll_s=0.01)] == [b"x", b"y"]


def test_logs_cli_never_lets_hostile_bytes_reach_stdout(tmp_path, state):
    payload = tmp_path / "payload.bin"
    payload.write_bytes(HOSTILE + b"A" * 20_000_000 + b"\x1b]52;c;aGlkZGVu\x07\nafter the huge line\n")
    jobs = write_jobs(tmp_path / "jobs.toml", {"hostile": {"cmd": f"cat {payload}"}})
    env = cli_env(state)
    assert cli(["--jobs", str(jobs), "start", "hostile"], env).returncode == 0
    run = wait_for(lambda: (r := latest_run("hostile")) and r.exit_record() and r, timeout=60, what="the job")
    assert run.log_path.read_bytes() == payload.read_bytes(), "the log on disk must stay byte-exact"
    for args in (["logs", "hostile"], ["logs", "hostile", "-f"], ["logs", "hostile", "-n", "3"]):
        out = cli(["--jobs", str(jobs), *args], env, timeout=120)
        assert out.returncode == 0, out.stderr
        text = out.stdout.decode("utf-8")            # valid UTF-8, whatever the job wrote
        assert_safe(text.replace("\n", ""))
        assert len(out.stdout) < 200_000, "a 20 MB line must be cut for the terminal"
        assert text.rstrip("\n").endswith("after the huge line")
        assert "aGlkZGVu" not in text
    full = cli(["--jobs", str(jobs), "logs", "hostile"], env).stdout.decode()
    assert "clipboard-set" in full and "cut for display" in full and "100% done" in full
