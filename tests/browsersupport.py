"""A real headless Chromium for the HTML tests: installed from Debian's `chromium` package when missing, run with a throwaway profile and no network."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--mute-audio", "--hide-scrollbars"]
# What Chromium writes to stderr (with --enable-logging=stderr) for a page's console messages
# and uncaught errors, and for resources the page could not load.
_PAGE_PROBLEM = re.compile(r'(CONSOLE\(\d+\)|:CONSOLE:|Uncaught|Refused to|net::ERR_|Failed to load resource)')


def _find() -> Optional[str]:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def ensure_chromium() -> str:
    """The chromium binary, apt-installing Debian's package if it is not there (skip with the reason if it cannot be)."""
    found = _find()
    if found:
        return found
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip("chromium is not installed and cannot be installed here (needs root and apt-get)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    steps = (["apt-get", "update", "-qq"],
             ["apt-get", "install", "-y", "-q", "-o", "DPkg::Lock::Timeout=600", "chromium"])
    for step in steps:
        done = subprocess.run(step, env=env, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0 and step[1] == "install":
            pytest.skip(f"chromium could not be installed: {' '.join(step)} -> {done.stderr.strip()[-300:]}")
    found = _find()
    if not found:
        pytest.skip("apt-get installed chromium but no chromium binary is on PATH")
    return found


@dataclass
class PageResult:
    dom: str
    problems: list[str]          # console errors, uncaught exceptions, blocked or failed loads
    stderr: str


class Browser:
    def __init__(self, binary: str) -> None:
        self.binary = binary

    def _run(self, extra: list[str], url: str, timeout: float = 120) -> subprocess.CompletedProcess:
        with tempfile.TemporaryDirectory(prefix="gpudeck-chromium-") as profile:
            return subprocess.run([self.binary, *FLAGS, f"--user-data-dir={profile}", *extra, url],
                                  capture_output=True, text=True, timeout=timeout)

    def load(self, path: Path) -> PageResult:
        """Render the file, return its DOM after load and every console/network problem the page logged."""
        done = self._run(["--enable-logging=stderr", "--v=0", "--virtual-time-budget=3000", "--dump-dom"],
                         Path(path).resolve().as_uri())
        problems = [line for line in done.stderr.splitlines() if _PAGE_PROBLEM.search(line)]
        return PageResult(dom=done.stdout, problems=problems, stderr=done.stderr)

    def screenshot(self, path: Path, png: Path, width: int = 1000, height: int = 2600) -> Path:
        done = self._run([f"--screenshot={png}", f"--window-size={width},{height}", "--virtual-time-budget=3000"],
                         Path(path).resolve().as_uri())
        assert png.exists() and png.stat().st_size > 0, f"no screenshot: {done.stderr[-500:]}"
        return png


@pytest.fixture(scope="session")
def browser() -> Browser:
    return Browser(ensure_chromium())


# -- a live page driven through the DevTools protocol (the `gpudeck web` tests) ------------------------

# xterm.js draws with WebGL when it can, which headless Chromium without a GPU paints black in a
# screenshot and which leaves no text in the DOM. Refusing WebGL contexts before the page's scripts run
# makes xterm.js fall back to its DOM renderer: the screen is then `.xterm-rows` text, and paints.
NO_WEBGL = ('const getContext = HTMLCanvasElement.prototype.getContext;'
            'HTMLCanvasElement.prototype.getContext = function (kind, ...rest) {'
            '  return String(kind).startsWith("webgl") ? null : getContext.call(this, kind, ...rest); };')


class DevToolsPage:
    """One Chromium tab over its DevTools websocket (aiohttp's client): call, evaluate, press keys, screenshot."""

    def __init__(self, ws) -> None:
        self.ws = ws
        self._ids = 0

    async def call(self, method: str, **params):
        self._ids += 1
        rid = self._ids
        await self.ws.send_json({"id": rid, "method": method, "params": params})
        while True:
            message = await self.ws.receive_json(timeout=60)
            if message.get("id") == rid:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})

    async def evaluate(self, expression: str):
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result.get("result", {}).get("value")

    async def press(self, key: str) -> None:
        """A printable key, as a person types it into the focused element."""
        code = f"Digit{key}" if key.isdigit() else f"Key{key.upper()}"
        common = {"key": key, "code": code, "windowsVirtualKeyCode": ord(key.upper())}
        await self.call("Input.dispatchKeyEvent", type="keyDown", text=key, **common)
        await self.call("Input.dispatchKeyEvent", type="keyUp", **common)

    async def screenshot(self) -> bytes:
        import base64
        return base64.b64decode((await self.call("Page.captureScreenshot", format="png"))["data"])


class DevToolsBrowser:
    """Headless Chromium with --remote-debugging-port=0 (the port it picked is read from its profile)."""

    def __init__(self, binary: str, width: int = 1280, height: int = 800) -> None:
        import time
        self.profile = tempfile.TemporaryDirectory(prefix="gpudeck-chromium-")
        self.proc = subprocess.Popen([binary, *FLAGS, f"--user-data-dir={self.profile.name}",
                                      "--remote-debugging-port=0", f"--window-size={width},{height}", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        active = Path(self.profile.name) / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (active.exists() and "\n" in active.read_text()):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.close()
                raise RuntimeError("chromium did not open its DevTools port")
            time.sleep(0.05)
        self.port = int(active.read_text().split()[0])

    async def page_ws_url(self, session) -> str:
        targets = await (await session.get(f"http://127.0.0.1:{self.port}/json/list")).json()
        return next(t for t in targets if t["type"] == "page")["webSocketDebuggerUrl"]

    def close(self) -> None:
        import signal
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.profile.cleanup()


def png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """(width, height, rows of RGB(A) bytes) of an 8-bit RGB or RGBA PNG: enough to look at a screenshot."""
    import struct
    import zlib
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, chunks, header = 8, [], None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            chunks.append(body)
        pos += 12 + length
    width, height, depth, colour = header[:4]
    assert depth == 8 and colour in (2, 6), f"PNG depth {depth} colour type {colour}"
    bpp = 3 if colour == 2 else 4
    raw = zlib.decompress(b"".join(chunks))
    stride = width * bpp
    rows, previous = [], bytearray(stride)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - bpp] if i >= bpp else 0
            up, corner = previous[i], previous[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + left) & 255
            elif kind == 2:
                line[i] = (line[i] + up) & 255
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 255
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                line[i] = (line[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 255
        rows.append(bytes(line))
        previous = line
    return width, height, rows


# -- where a text is on the page, and whether the screenshot shows it there ------------------------------

# The on-screen box of each character of the first `needle` in the xterm DOM renderer's rows (a DOM
# Range per character: xterm.js sizes every cell alike, so a Range's box is the cell it is painted in),
# the colours its span is drawn in, and the box of the bordered panel whose top edge holds it
# (from the `╭` left of it to the `╯` that closes that column's box).
TEXT_BOXES_JS = r"""
((needle) => {
  const rows = [...document.querySelector('.xterm-rows').children];
  const texts = rows.map(r => r.textContent);
  const box = (r, i, j) => {
    const walker = document.createTreeWalker(rows[r], NodeFilter.SHOW_TEXT);
    const range = document.createRange();
    let seen = 0, element = null;
    for (let n = walker.nextNode(); n; n = walker.nextNode()) {
      const end = seen + n.data.length;
      if (seen <= i && i < end) { range.setStart(n, i - seen); element = n.parentElement; }
      if (seen < j && j <= end) range.setEnd(n, j - seen);
      seen = end;
    }
    const b = range.getBoundingClientRect();
    return [{left: b.left, top: b.top, right: b.right, bottom: b.bottom}, element];
  };
  const row = texts.findIndex(t => t.includes(needle));
  if (row < 0) return null;
  const col = texts[row].indexOf(needle);
  const chars = [...needle].map((_, k) => box(row, col + k, col + k + 1)[0]);
  const [whole, element] = box(row, col, col + needle.length);
  let painted = element;
  while (painted && ['transparent', 'rgba(0, 0, 0, 0)'].includes(getComputedStyle(painted).backgroundColor))
    painted = painted.parentElement;
  const left = texts[row].lastIndexOf('\u256d', col);
  const right = texts[row].indexOf('\u256e', col);
  let bottom = -1;
  for (let r = row + 1; r < rows.length && bottom < 0; r++) if (texts[r][left] === '\u2570') bottom = r;
  const panel = left < 0 || right < 0 || bottom < 0 ? null : {
    left: box(row, left, left + 1)[0].left, top: box(row, left, left + 1)[0].top,
    right: box(bottom, right, right + 1)[0].right, bottom: box(bottom, right, right + 1)[0].bottom,
    rows: texts.slice(row + 1, bottom)};
  return {text: needle, box: whole, chars, panel, dpr: devicePixelRatio, fg: getComputedStyle(element).color,
          bg: painted ? getComputedStyle(painted).backgroundColor : null};
})
"""


def css_rgb(value: str) -> tuple[int, int, int]:
    """`rgb(201, 209, 217)` (or rgba) as a tuple."""
    inner = value[value.index("(") + 1:value.index(")")]
    r, g, b = (int(float(part)) for part in inner.split(",")[:3])
    return r, g, b


def cell_pixels(rows: list[bytes], bpp: int, box: dict, fg: tuple[int, int, int], bg: tuple[int, int, int],
                scale: float = 1.0) -> tuple[int, int, int]:
    """(glyph, background, other) pixel counts of the screenshot inside `box` (CSS px, times `scale`).

    A pixel is a glyph's when it lies on the segment from the background colour to the text colour
    (anti-aliasing blends the two) past its middle, background when before it, other when off that
    segment (a colour this text is not drawn in, a white page included). One pixel is left off each
    edge: a neighbour's anti-aliased edge is not this cell's.
    """
    import math
    d = [f - b for f, b in zip(fg, bg)]
    dd = sum(x * x for x in d) or 1
    x0, x1 = math.ceil(box["left"] * scale) + 1, math.floor(box["right"] * scale) - 1
    y0, y1 = math.ceil(box["top"] * scale) + 1, math.floor(box["bottom"] * scale) - 1
    glyph = back = other = 0
    for y in range(max(0, y0), min(len(rows), y1)):
        row = rows[y]
        for x in range(max(0, x0), min(len(row) // bpp, x1)):
            v = [row[x * bpp + k] - bg[k] for k in range(3)]
            t = sum(a * b for a, b in zip(v, d)) / dd
            off = math.sqrt(sum((v[k] - t * d[k]) ** 2 for k in range(3)))
            if off > 40 or not -0.15 <= t <= 1.15:
                other += 1
            elif t > 0.5:
                glyph += 1
            else:
                back += 1
    return glyph, back, other
