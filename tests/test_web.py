"""`gpudeck web`: the console served through textual-serve, driven in a real headless Chromium."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from browsersupport import (NO_WEBGL, TEXT_BOXES_JS, DevToolsBrowser, DevToolsPage, browser,  # noqa: F401
                            cell_pixels, css_rgb, png_pixels)
from runsupport import free_port

pytest.importorskip("textual_serve", reason="textual-serve is not installed (pip install -e '.[web]')")
aiohttp = pytest.importorskip("aiohttp")

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


class Served:
    """`gpudeck ... web --listen ADDR` in its own process group: the URL it printed, stopped at the end."""

    def __init__(self, tmp_path: Path, *args: str, listen: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUDECK_")}
        env.update(XDG_CONFIG_HOME=str(tmp_path / "config"), GPUDECK_STATE_DIR=str(tmp_path / "state"))
        self.proc = subprocess.Popen([sys.executable, "-m", "gpudeck", *args, "web", "--listen", listen],
                                     cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True)
        self.lines = [self.proc.stdout.readline() for _ in range(2)]
        assert self.lines[0].startswith("gpudeck web: http://"), self.lines
        self.url = self.lines[0].split()[2]
        self.port = int(listen.rsplit(":", 1)[1])
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/nothing", timeout=2)
            except urllib.error.HTTPError:
                break                               # it answers
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"gpudeck web did not listen: {self.lines}")
                time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


def status(url: str, headers: dict | None = None) -> int:
    try:
        return urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10).status
    except urllib.error.HTTPError as exc:
        return exc.code


async def screen_text(page: DevToolsPage) -> str:
    return await page.evaluate("(document.querySelector('.xterm-rows') || {}).innerText || ''") or ""


async def wait_text(page: DevToolsPage, wanted: list[str], what: str, timeout: float = 90) -> str:
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        text = await screen_text(page)
        if all(w in text for w in wanted):
            return text
        await asyncio.sleep(0.25)
    raise AssertionError(f"{what}: {wanted} not on the page after {timeout:g}s; it shows:\n{text[-3000:]}")


def painted_text_problems(shot: bytes, where: dict, chars: list[dict] | None = None) -> list[str]:
    """Why the screenshot does not show `where["text"]` in the character boxes the DOM gave (none: it does).

    Each character's box must hold glyph pixels in the text's colour and background around them (a
    letter is no solid block), each space's box none, and next to nothing in a colour the text is not
    drawn in: a blank screenshot, one of another page, or one where the text is painted elsewhere
    than the DOM says each fail.
    """
    width, _, rows = png_pixels(shot)
    bpp = len(rows[0]) // width
    fg, bg = css_rgb(where["fg"]), css_rgb(where["bg"])
    problems = []
    for ch, box in zip(where["text"], chars or where["chars"]):
        glyph, back, other = cell_pixels(rows, bpp, box, fg, bg, where["dpr"])
        cell = glyph + back + other
        if other > 0.1 * cell:
            problems.append(f"{ch!r}: {other} of {cell} pixels in neither the text's nor the background's colour")
        elif ch == " " and glyph > 2:
            problems.append(f"{ch!r}: {glyph} glyph pixels where a space is")
        elif ch != " " and glyph < 0.1 * cell:
            problems.append(f"{ch!r}: {glyph} glyph pixels of {cell}: nothing painted")
        elif ch != " " and back < 0.1 * cell:
            problems.append(f"{ch!r}: {glyph} of {cell} pixels in the text's colour: a block, not a glyph")
    return problems


def test_the_console_in_chromium_renders_the_dashboard_and_takes_keys(browser, tmp_path) -> None:
    served = Served(tmp_path, "--demo", listen=f"127.0.0.1:{free_port()}")
    chromium = DevToolsBrowser(browser.binary, width=1000, height=640)
    try:
        assert served.url == f"http://127.0.0.1:{served.port}/" and "read-only" in served.lines[0]
        assert f"ssh -L {served.port}:127.0.0.1:{served.port}" in served.lines[1]

        async def drive() -> tuple[str, str, bytes, dict]:
            async with aiohttp.ClientSession() as session:
                async with session.ws_connect(await chromium.page_ws_url(session), max_msg_size=0) as ws:
                    page = DevToolsPage(ws)
                    await page.call("Page.enable")
                    await page.call("Page.addScriptToEvaluateOnNewDocument", source=NO_WEBGL)
                    await page.call("Page.navigate", url=served.url)
                    dashboard = await wait_text(page, ["GPUs (8)", "SIMULATED", "H200", "2 Jobs"], "the dashboard")
                    await asyncio.sleep(0.5)                 # the frame painted, not only in the DOM
                    # Where the GPU panel's title is on screen, measured in the DOM just before the shot.
                    where = await page.evaluate(f"({TEXT_BOXES_JS})('GPUs (')")
                    shot = await page.screenshot()
                    await page.evaluate("document.querySelector('.xterm-helper-textarea').focus()")
                    await page.press("2")
                    jobs = await wait_text(page, ["SIMULATED REPLAY", "vllm-k2", "sglang-k2"], "the jobs view after 2")
                    await page.press("s")                    # refused: a notice, nothing started
                    jobs = await wait_text(page, ["actions off"], "the refusal of s")
                    return dashboard, jobs, shot, where

        dashboard, jobs, shot, where = asyncio.run(drive())
    finally:
        chromium.close()
        served.stop()
    assert "SIMULATED" in dashboard and "listening ports" in dashboard
    assert "vllm-k2" in jobs and "Start" not in jobs.splitlines()[-1]     # the footer offers no Start
    assert not (tmp_path / "state" / "runs").exists()
    # The screenshot is the dashboard, painted: many colours, the SIMULATED labels' and memory bars' amber.
    width, height, rows = png_pixels(shot)
    (tmp_path / "dashboard.png").write_bytes(shot)
    assert width == 1000 and height > 300, (width, height)
    bpp = len(rows[0]) // width
    colours = {row[x:x + 3] for row in rows[::4] for x in range(0, len(row), bpp * 2)}
    assert len(colours) > 40, f"a near-blank screenshot ({len(colours)} colours)"
    lit = sum(1 for row in rows[::4] for x in range(0, len(row), bpp * 2) if sum(row[x:x + 3]) > 200)
    assert lit > 0.03 * (height // 4) * (width // 2), "the screenshot is mostly dark: nothing was painted"
    # The GPU panel's title: the DOM's box of "GPUs (" lies on the top edge of the bordered panel whose
    # rows are the eight GPUs, and the screenshot has that text's glyphs in exactly those boxes.
    assert where is not None and where["panel"] is not None, where
    box, panel, scale = where["box"], where["panel"], where["dpr"]
    assert [r.split()[1:3] for r in panel["rows"]] == [[str(i), "H200"] for i in range(8)], panel["rows"]
    assert panel["left"] <= box["left"] < box["right"] <= panel["right"], (box, panel)
    assert panel["top"] <= box["top"] < box["bottom"] <= panel["bottom"], (box, panel)
    assert box["bottom"] - panel["top"] <= (box["bottom"] - box["top"]) + 1, "the title is not on the top edge"
    assert box["right"] * scale <= width and box["bottom"] * scale <= height, (box, width, height)
    assert painted_text_problems(shot, where) == [], painted_text_problems(shot, where)
    # ... and a check that passes on any painted page would pass one cell off too: it must not.
    cell = where["chars"][1]["left"] - where["chars"][0]["left"]
    shifted = [dict(c, left=c["left"] - cell, right=c["right"] - cell) for c in where["chars"]]
    assert painted_text_problems(shot, where, shifted), "the check cannot tell where the title is painted"
    amber = sum(1 for row in rows[int(panel["top"] * scale):int(panel["bottom"] * scale)]
                for x in range(int(panel["left"] * scale) * bpp, int(panel["right"] * scale) * bpp, bpp)
                if row[x] > 180 and 100 < row[x + 1] < 200 and row[x + 2] < 130)
    assert amber > 500, f"no SIMULATED amber or memory bars in the GPU panel ({amber} pixels)"


def png(width: int, height: int, paint) -> bytes:
    """An 8-bit RGB PNG whose pixel (x, y) is paint(x, y)."""
    import struct
    import zlib
    raw = b"".join(b"\0" + b"".join(bytes(paint(x, y)) for x in range(width)) for y in range(height))

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def test_the_painted_text_check_fails_a_blank_a_foreign_or_a_misplaced_screenshot() -> None:
    """painted_text_problems, on screenshots made by hand: the title as the DOM places it passes; the same
    page blank, a page in other colours, or the title painted one cell over, each fail."""
    fg, bg = (201, 209, 217), (13, 17, 23)
    chars = [{"left": 20 + 10 * k, "right": 30 + 10 * k, "top": 18, "bottom": 36} for k in range(6)]
    where = {"text": "GPUs (", "chars": chars, "fg": "rgb(201, 209, 217)", "bg": "rgba(13, 17, 23, 1)", "dpr": 1}

    def glyphs(offset: int):
        # a bar in the middle of each painted cell: "GPUs" and "(", not the space
        def paint(x: int, y: int):
            k, within = divmod(x - 20 - offset, 10)
            return fg if 0 <= k < 6 and k != 4 and 3 <= within <= 6 and 22 <= y <= 32 else bg
        return paint
    assert painted_text_problems(png(100, 50, glyphs(0)), where) == []
    assert len(painted_text_problems(png(100, 50, lambda x, y: bg), where)) == 5          # blank: nothing painted
    assert len(painted_text_problems(png(100, 50, lambda x, y: (255, 255, 255)), where)) == 6   # another page
    assert len(painted_text_problems(png(100, 50, lambda x, y: fg), where)) == 6          # solid text colour
    moved = painted_text_problems(png(100, 50, glyphs(10)), where)                        # one cell to the right
    assert moved and any("' '" in p for p in moved) and any("'G'" in p for p in moved), moved


def test_beyond_localhost_a_token_is_needed_and_foreign_pages_are_refused(tmp_path) -> None:
    served = Served(tmp_path, "--demo", listen=f"0.0.0.0:{free_port()}")
    try:
        token_url = served.url
        token = token_url.rstrip("/").rsplit("/", 1)[1]
        assert len(token) >= 24 and "token included" in served.lines[1]
        base = f"http://127.0.0.1:{served.port}"
        assert status(f"{base}/") == 403 and status(f"{base}/ws") == 403 and status(f"{base}/static/js/textual.js") == 403
        wrong = token[:-1] + ("y" if token[-1] != "y" else "z")     # (a token can end in any letter)
        assert status(f"{base}/{wrong}/") == 403
        assert status(f"{base}/{token}/") == 200 and status(f"{base}/{token}/static/js/textual.js") == 200
        page = urllib.request.urlopen(f"{base}/{token}/", timeout=10).read().decode()
        assert f"ws://127.0.0.1:{served.port}/{token}/ws" in page

        async def websocket(path: str, origin: str | None) -> str:
            async with aiohttp.ClientSession() as session:
                try:
                    async with session.ws_connect(f"ws://127.0.0.1:{served.port}{path}?width=80&height=24",
                                                  headers={"Origin": origin} if origin else {}) as ws:
                        await ws.close()
                        return "open"
                except aiohttp.WSServerHandshakeError as exc:
                    return str(exc.status)

        assert asyncio.run(websocket(f"/{token}/ws", f"http://127.0.0.1:{served.port}")) == "open"
        assert asyncio.run(websocket(f"/{token}/ws", "https://evil.example")) == "403"
        assert asyncio.run(websocket("/ws", None)) == "403"
    finally:
        served.stop()


def test_localhost_refuses_other_host_names_and_foreign_websockets(tmp_path) -> None:
    served = Served(tmp_path, "--demo", listen=f"127.0.0.1:{free_port()}")
    try:
        base = f"http://127.0.0.1:{served.port}"
        assert status(f"{base}/") == 200
        assert status(f"{base}/", {"Host": f"localhost:{served.port}"}) == 200
        assert status(f"{base}/", {"Host": f"rebound.example:{served.port}"}) == 403     # DNS rebinding
        assert status(f"{base}/ws", {"Origin": "https://evil.example", "Connection": "Upgrade",
                                     "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
                                     "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}) == 403
    finally:
        served.stop()


def test_served_command_is_read_only_unless_actions_are_allowed(tmp_path, monkeypatch) -> None:
    import argparse

    from gpudeck.console.commands.web import parse_listen, served_command
    from gpudeck.console.errors import CliError
    args = argparse.Namespace(demo=False, jobs_file="jobs.toml", theme=None, host="box", refresh=2.0)
    ro = served_command(args, readonly=True)
    assert ro.startswith(f"{sys.executable} -m gpudeck --readonly ") and "--host box --refresh 2" in ro
    assert str(Path("jobs.toml").absolute()) in ro
    assert "--readonly" not in served_command(args, readonly=False)
    assert parse_listen("[::1]:8765", "x") == ("::1", 8765) and parse_listen("0.0.0.0:80", "x") == ("0.0.0.0", 80)
    for bad in ("8765", "host:", "host:0", "host:70000", ":8765"):
        with pytest.raises(CliError) as info:
            parse_listen(bad, "x")
        assert info.value.code == 2
    # --allow-actions under a read-only setting stays read-only, and says so.
    from gpudeck.console.cli import main
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.setenv("GPUDECK_READONLY", "1")
    import gpudeck.console.commands.web as web

    class NoServe:
        def __init__(self, command, *a, **kw):
            NoServe.command = command

        def serve(self):
            pass
    monkeypatch.setattr(web, "make_server", lambda command, *a, **kw: NoServe(command))
    assert main(["web", "--allow-actions"]) == 0
    assert " --readonly" in NoServe.command


def test_web_host_is_served_to_every_tab_read_only(tmp_path, monkeypatch, capsys) -> None:
    """`gpudeck web --host box`: the served command carries `--host box` (and `--readonly` unless actions are
    allowed, or the host is readonly in hosts.toml); an unknown host is refused at start, not in each tab."""
    import gpudeck.console.commands.web as web
    from gpudeck.console.cli import main
    hosts = tmp_path / "hosts.toml"
    hosts.write_text('[hosts.box]\nssh = "box"\n\n[hosts.watched]\nssh = "watched"\nreadonly = true\n')
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.setenv("GPUDECK_HOSTS", str(hosts))
    monkeypatch.delenv("GPUDECK_READONLY", raising=False)
    served: list[str] = []

    class NoServe:
        def serve(self) -> None:
            pass
    monkeypatch.setattr(web, "make_server", lambda command, *a, **kw: served.append(command) or NoServe())

    def tab(*argv: str) -> list[str]:
        assert main(list(argv)) == 0
        return served[-1].split()
    argv = tab("web", "--host", "box")
    assert argv[:3] == [sys.executable, "-m", "gpudeck"] and "--readonly" in argv
    assert argv[argv.index("--host") + 1] == "box"
    out = capsys.readouterr().out
    assert "read-only" in out and "box box (its agent refuses to act)" in out, out
    assert tab("--host", "box", "web")[-2:] == ["--host", "box"]          # the global form, the same
    assert "--readonly" in tab("--readonly", "web", "--host", "box", "--allow-actions")
    acting = tab("web", "--host", "box", "--allow-actions")
    assert "--readonly" not in acting and acting[-2:] == ["--host", "box"]
    # a host that is readonly in hosts.toml stays so, --allow-actions or not, and the line says why
    assert "--readonly" in tab("web", "--host", "watched", "--allow-actions")
    assert "host watched has readonly = true" in capsys.readouterr().out
    served.clear()
    assert main(["web", "--host", "nosuch"]) == 2 and not served
    assert "no host named 'nosuch'" in capsys.readouterr().err
