"""The link keeper: one background process per host holds the SSH link; CLI commands reach it over a Unix socket.

A cold `gpudeck --host box start` would otherwise import asyncssh, shake hands and
start the agent every time (about a second on a small laptop). The first command
starts `python -m gpudeck.jobs.hosts.mux` detached; it keeps a HostLink (keepalive,
reconnect with backoff) and answers one JSON-line request per socket connection,
so later commands cost a Unix-socket round trip plus the work on the box. It exits
after GPUDECK_MUX_IDLE_S (default 600 s) without requests, or at once when the host
key was refused (the operator must decide first). The client half is stdlib only.
"""
from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

from gpudeck.jobs.hosts.config import HostSpec
from gpudeck.jobs.hosts.errors import HostError, HostKeyError, RemoteError

IDLE_S = 600.0
START_WAIT_S = 15.0           # the keeper's socket must appear within this


def runtime_dir() -> Path:
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    path = Path(base) / f"gpudeck-{os.getuid()}"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = path.stat()
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise HostError(f"{path}: not a private directory of this user; refusing to put the SSH link socket there")
    return path


def socket_path(spec: HostSpec) -> Path:
    """One keeper per host definition (and HOME: another ~/.ssh is another identity)."""
    key = json.dumps([dataclasses.asdict(spec), os.path.expanduser("~")], sort_keys=True)
    return runtime_dir() / f"mux-{spec.name}-{hashlib.sha256(key.encode()).hexdigest()[:12]}.sock"


# sun_path holds 108 bytes on Linux (104 on BSDs): a deeper runtime dir cannot have a keeper.
_SUN_PATH_MAX = 100


def enabled(spec: Optional[HostSpec] = None) -> bool:
    """The keeper is used unless GPUDECK_SSH_MUX=0, or its socket path would be too long to bind."""
    if os.environ.get("GPUDECK_SSH_MUX", "1") in ("0", "no", "off", ""):
        return False
    if spec is not None:
        try:
            return len(str(socket_path(spec)).encode()) <= _SUN_PATH_MAX
        except (HostError, OSError):
            return False
    return True


# -- client (stdlib only) ---------------------------------------------------------------
def _connect(path: Path) -> Optional[socket.socket]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
        return sock
    except OSError:
        sock.close()
        return None


def _spawn(spec: HostSpec, path: Path) -> None:
    log = open(path.with_suffix(".log"), "ab")
    subprocess.Popen([sys.executable, "-m", "gpudeck.jobs.hosts.mux", json.dumps(dataclasses.asdict(spec))],
                     stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, close_fds=True)
    log.close()


def call(spec: HostSpec, op: str, params: Optional[dict] = None, *, timeout: float = 60.0,
         retry: bool = True) -> Any:
    """One request through the host's keeper (started if it is not running)."""
    path = socket_path(spec)
    sock = _connect(path)
    if sock is None:
        _spawn(spec, path)
        deadline = time.monotonic() + START_WAIT_S
        while sock is None:
            if time.monotonic() > deadline:
                raise HostError(f"{spec.name}: the SSH link keeper did not start (see {path.with_suffix('.log')})")
            time.sleep(0.02)
            sock = _connect(path)
    with sock:
        # The keeper answers within `timeout` (or says why not); the margin covers its own overhead.
        sock.settimeout(timeout + 30)
        sock.sendall((json.dumps({"op": op, "params": params or {}, "timeout": timeout, "retry": retry})
                      + "\n").encode())
        data = b""
        try:
            while not data.endswith(b"\n"):
                chunk = sock.recv(1 << 20)
                if not chunk:
                    break
                data += chunk
        except socket.timeout:
            raise HostError(f"{spec.name}: no answer from the SSH link keeper within {timeout + 30:g} s") from None
    if not data:
        raise HostError(f"{spec.name}: the SSH link keeper went away during {op}")
    reply = json.loads(data)
    if reply.get("ok"):
        return reply.get("result")
    kind = reply.get("kind")
    if kind == "remote":
        raise RemoteError(reply["error"], code=reply.get("code") or 2)
    if kind == "hostkey":
        raise HostKeyError(reply["error"])
    raise HostError(reply["error"])


# -- the keeper ----------------------------------------------------------------------------
def serve(spec: HostSpec, idle_s: float) -> int:
    import asyncio

    from gpudeck.jobs.hosts.ssh import HostLink

    path = socket_path(spec)
    # One keeper per socket: a second one started by a racing command just leaves.
    lock = os.open(str(path.with_suffix(".lock")), os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return 0
    path.with_suffix(".pid").write_text(str(os.getpid()))

    async def main() -> None:
        link = HostLink(spec)
        link.start()
        state = {"active": 0, "last": time.monotonic()}

        def retire() -> None:
            if state.get("retired"):
                return
            state["retired"] = True
            server.close()
            try:
                path.unlink()
            except OSError:
                pass
            os.close(lock)            # releases the flock: a new keeper may start at once
            stop.set()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            state["active"] += 1
            try:
                line = await reader.readline()
                request = json.loads(line)
                try:
                    result = await link.call(request["op"], request.get("params"), timeout=request.get("timeout"),
                                             retry=bool(request.get("retry", True)))
                    reply = {"ok": True, "result": result}
                except HostKeyError as exc:
                    reply = {"ok": False, "kind": "hostkey", "error": str(exc)}
                    # The operator's next step is `gpudeck hosts trust`: the command after it must
                    # start a fresh keeper that reads the new known_hosts, not reach this one. So
                    # this keeper stops serving (socket gone, lock released) before it answers.
                    retire()
                except RemoteError as exc:
                    reply = {"ok": False, "kind": "remote", "error": str(exc), "code": exc.code}
                except HostError as exc:
                    reply = {"ok": False, "kind": "host", "error": str(exc)}
                writer.write((json.dumps(reply, separators=(",", ":")) + "\n").encode())
                await writer.drain()
            except (OSError, ValueError, KeyError):
                pass                  # a client that went away or sent garbage
            finally:
                state["active"] -= 1
                state["last"] = time.monotonic()
                writer.close()

        if path.exists():
            path.unlink()             # a dead keeper's socket (we hold the lock: nobody else serves it)
        server = await asyncio.start_unix_server(handle, path=str(path))
        os.chmod(path, 0o600)
        stop = asyncio.Event()
        # SIGTERM/SIGHUP: leave cleanly (socket removed, link closed) instead of dying mid-state.
        for sig in (signal.SIGTERM, signal.SIGHUP):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        try:
            while not stop.is_set():
                try:
                    await asyncio.wait_for(stop.wait(), 0.5)
                except asyncio.TimeoutError:
                    pass
                idle = state["active"] == 0 and time.monotonic() - state["last"] > idle_s
                refused = state["active"] == 0 and link._task is not None and link._task.done()
                if idle or refused:
                    break
        finally:
            if not state.get("retired"):
                server.close()
                try:
                    path.unlink()
                except OSError:
                    pass
            await link.close()

    try:
        asyncio.run(main())
    finally:
        pid_file = path.with_suffix(".pid")
        try:
            if pid_file.read_text() == str(os.getpid()):     # a successor keeper may own it by now
                pid_file.unlink()
        except OSError:
            pass
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    spec = HostSpec(**json.loads(args[0]))
    idle = float(os.environ.get("GPUDECK_MUX_IDLE_S") or IDLE_S)
    return serve(spec, idle)


if __name__ == "__main__":
    raise SystemExit(main())
