"""The SSH side of a remote host (asyncssh): connect safely, start the agent, call it, keep the link alive.

Everything here honours ~/.ssh/config (HostName, User, Port, IdentityFile,
ProxyJump), the ssh-agent and known_hosts through asyncssh. Host keys are never
accepted silently, authentication is keys only (a TUI cannot answer a password
prompt), agent forwarding is off, and every connection has keepalive and a
connect timeout: asyncssh has neither by default, and a read on a dead link
would otherwise hang forever.
"""
from __future__ import annotations

import asyncio
import base64
import itertools
import os
import shlex
import time
from pathlib import Path
import warnings
from typing import Any, Callable, Optional

with warnings.catch_warnings():
    # cryptography >= 51 warns when asyncssh's import merely names its DSA classes: a note between
    # libraries that would otherwise open every --host command's stderr with ten lines.
    warnings.filterwarnings("ignore", message=r"DSA is deprecated", category=UserWarning)
    import asyncssh

from gpudeck.jobs.hosts.bundle import agent_zipapp
from gpudeck.jobs.hosts.config import HostSpec
from gpudeck.jobs.hosts.errors import (  # re-exported
    HostError as HostError, HostKeyError as HostKeyError, RemoteError as RemoteError)
from gpudeck.jobs.hosts.protocol import HELLO, PROTOCOL, decode, encode, patch
from gpudeck.jobs.hosts.replies import BadReply, check_reply

REMOTE_CACHE = ".cache/gpudeck"          # relative to the remote home (SFTP starts there)
NEED_AGENT = "gpudeck-need-agent"
# Link states, as every face shows them.
CONNECTING, LIVE, STALE, DOWN = "CONNECTING", "LIVE", "STALE", "DOWN"
# Reconnect backoff: 1, 2, 4 ... 60 s.
BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 60.0


# -- connecting ----------------------------------------------------------------------
def connect_options(spec: HostSpec) -> dict[str, Any]:
    user, host, port = spec.destination()
    opts: dict[str, Any] = {
        "host": host,
        "keepalive_interval": spec.keepalive_s,
        "keepalive_count_max": spec.keepalive_count,
        "connect_timeout": spec.connect_timeout_s,
        "login_timeout": spec.connect_timeout_s,
        # Keys only: no prompt can be answered inside the console.
        "password_auth": False,
        "kbdint_auth": False,
        "agent_forwarding": False,
    }
    if user:
        opts["username"] = user
    if port:
        opts["port"] = port
    return opts


def known_hosts_target(spec: HostSpec) -> tuple[str, int]:
    """(name, port) the server is recorded under in known_hosts, after ~/.ssh/config (HostName, Port, HostKeyAlias)."""
    import getpass

    from asyncssh.config import SSHClientConfig
    user, host, port = spec.destination()
    path = Path(os.path.expanduser("~/.ssh/config"))
    try:
        config = SSHClientConfig.load(None, [str(path)] if path.exists() else [], False, False, False,
                                      getpass.getuser(), user or "", host, port or ())
    except (OSError, asyncssh.Error, ValueError):
        return host, port or 22
    name = config.get("HostKeyAlias") or config.get("Hostname") or host
    configured = config.get("Port")                   # asyncssh parses Port to an int
    return str(name), port or (configured if isinstance(configured, int) and configured else 22)


def known_hosts_path() -> Path:
    return Path(os.path.expanduser("~/.ssh/known_hosts"))


async def fetch_host_key(spec: HostSpec) -> asyncssh.SSHKey:
    """The key the server presents (no authentication, nothing trusted)."""
    opts = connect_options(spec)
    try:
        key = await asyncio.wait_for(
            asyncssh.get_server_host_key(opts["host"], opts.get("port", ())), spec.connect_timeout_s)
    except (OSError, asyncssh.Error, asyncio.TimeoutError) as exc:
        raise HostError(f"{spec.name}: cannot reach {spec.ssh}: {_reason(exc)}") from None
    if key is None:
        raise HostError(f"{spec.name}: {spec.ssh} presented no host key")
    return key


def _recorded_keys(spec: HostSpec) -> list[str]:
    """Fingerprints known_hosts already holds for this host (empty: the host is unknown)."""
    path = known_hosts_path()
    if not path.exists():
        return []
    try:
        name, port = known_hosts_target(spec)
        trusted = asyncssh.read_known_hosts(str(path)).match(name, "", port)[0]
    except (OSError, ValueError, asyncssh.Error):
        return []
    return [k.get_fingerprint() for k in trusted]


async def _host_key_error(spec: HostSpec, exc: Exception) -> HostKeyError:
    try:
        key = await fetch_host_key(spec)
        fingerprint = key.get_fingerprint()
    except HostError:
        fingerprint = None
    recorded = _recorded_keys(spec)
    hint = f"if you trust it, run `gpudeck hosts trust {spec.name}`"
    if recorded:
        return HostKeyError(
            f"{spec.name}: HOST KEY CHANGED for {spec.ssh}: it now presents {fingerprint or '?'}, "
            f"known_hosts has {', '.join(recorded)}; refused (someone may be intercepting; {hint} "
            f"after checking with the box's admin)", fingerprint)
    return HostKeyError(f"{spec.name}: unknown host key for {spec.ssh} ({fingerprint or '?'}); refused; {hint}",
                        fingerprint)


def _known_hosts_names(name: str, port: int) -> set[str]:
    """Every name a known_hosts line may record this host under: as written and as resolved
    (asyncssh checks the peer's address too), `[name]:port` off port 22, both forms on it."""
    import socket
    hosts = {name.lower()}
    try:
        hosts |= {str(info[4][0]) for info in socket.getaddrinfo(name, port, type=socket.SOCK_STREAM)}
    except (OSError, UnicodeError):
        pass
    if port == 22:
        return hosts | {f"[{h}]:22" for h in hosts}
    return {f"[{h}]:{port}" for h in hosts}


def _hashed_match(token: str, names: set[str]) -> bool:
    """`|1|salt|hash` (HashKnownHosts yes): base64 HMAC-SHA1 of the name, keyed with the salt."""
    import hashlib
    import hmac
    try:
        _, magic, salt, digest = token.split("|")
        salt_bytes, digest_bytes = base64.b64decode(salt), base64.b64decode(digest)
    except ValueError:
        return False
    return magic == "1" and any(
        hmac.compare_digest(hmac.new(salt_bytes, n.encode(), hashlib.sha1).digest(), digest_bytes) for n in names)


def _hash_name(name: str) -> str:
    import hashlib
    import hmac
    salt = os.urandom(20)
    digest = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"


def trust_host_key(spec: HostSpec, key: asyncssh.SSHKey) -> Path:
    """Record `key` as the host's only key in ~/.ssh/known_hosts.

    Every earlier entry for the host goes: plain or hashed (`|1|salt|hash`, what
    HashKnownHosts yes writes), by name or address, `[name]:port` form too. An old
    key left beside the new one would still be accepted: trusting a changed key
    must retire the old one. A name in a comma list is taken out of that list, the
    rest of the line kept; @revoked and @cert-authority lines are the admin's and
    stay. The new entry is hashed when the file already hashes its names.
    """
    name, port = known_hosts_target(spec)
    entry = name if port == 22 else f"[{name}]:{port}"
    names = _known_hosts_names(name, port)
    path = known_hosts_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    lines = path.read_text().splitlines() if path.exists() else []
    kept, hashed = [], False
    for line in lines:
        fields = line.split(None, 1)
        if not fields or fields[0].startswith(("#", "@")) or len(fields) < 2:
            kept.append(line)
            continue
        patterns = fields[0].split(",")
        hashed = hashed or any(p.startswith("|") for p in patterns)
        left = [p for p in patterns
                if not (_hashed_match(p, names) if p.startswith("|") else p.lower() in names)]
        if len(left) == len(patterns):
            kept.append(line)
        elif left:
            kept.append(f"{','.join(left)} {fields[1]}")
    kept.append(f"{_hash_name(entry) if hashed else entry} {key.export_public_key('openssh').decode().strip()}")
    tmp = path.with_suffix(".gpudeck-tmp")
    tmp.write_text("\n".join(kept) + "\n")
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return path


def _reason(exc: BaseException) -> str:
    if isinstance(exc, asyncio.TimeoutError):
        return "timed out"
    if isinstance(exc, asyncssh.PermissionDenied):
        return "permission denied (gpudeck uses keys only: ssh-agent or IdentityFile)"
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


async def open_connection(spec: HostSpec) -> asyncssh.SSHClientConnection:
    opts = connect_options(spec)
    try:
        return await asyncio.wait_for(asyncssh.connect(**opts), spec.connect_timeout_s * 2)
    except asyncssh.HostKeyNotVerifiable as exc:
        raise await _host_key_error(spec, exc) from None
    except (OSError, asyncssh.Error, asyncio.TimeoutError, ValueError) as exc:
        raise HostError(f"{spec.name}: cannot connect to {spec.ssh}: {_reason(exc)}") from None


# -- the agent channel -------------------------------------------------------------------
# One interpreter start decides and runs: the box's own gpudeck if it speaks our protocol,
# else the zipapp from the cache, else it asks for the upload. (Two starts, a probe then
# the agent, cost a visible fraction of a second on a loaded box.)
_BOOT = """import os, sys
mode, proto, name = sys.argv[1], int(sys.argv[2]), sys.argv[3]
via = None
if mode != "zipapp":
    try:
        import gpudeck.jobs.hosts.protocol as p
        via = "installed" if p.PROTOCOL == proto else None
    except ImportError:
        pass
if via is None:
    for m in [m for m in sys.modules if m == "gpudeck" or m.startswith("gpudeck.")]:
        del sys.modules[m]
    if mode == "installed":
        sys.stderr.write("no gpudeck speaking protocol %d on this host\\n" % proto)
        sys.exit(3)
    f = os.path.join(os.path.expanduser("~"), ".cache", "gpudeck", name)
    if not os.path.isfile(f):
        print("NEED", os.path.expanduser("~"), flush=True)
        sys.exit(0)
    sys.path.insert(0, f)
    via = "zipapp"
from gpudeck.jobs.hosts.agent import main
sys.exit(main(sys.argv[4:], via=via))
""".replace("NEED", NEED_AGENT)


def _agent_command(spec: HostSpec, zip_name: str) -> str:
    python = spec.python
    if python.startswith("~/"):
        python = "$HOME/" + shlex.quote(python[2:])
    else:
        python = shlex.quote(python)
    args = [spec.agent, str(PROTOCOL), zip_name]
    if spec.jobs:
        args += ["--jobs", spec.jobs]
    if spec.state_dir:
        args += ["--state-dir", spec.state_dir]
    if spec.simulated:
        args.append("--simulated")
    if spec.readonly:
        args.append("--readonly")
    return f"exec {python} -c {shlex.quote(_BOOT)} {' '.join(shlex.quote(a) for a in args)}"


class AgentChannel:
    """One agent process over one SSH channel: requests by id, replies matched to waiting callers."""

    def __init__(self, spec: HostSpec, conn: asyncssh.SSHClientConnection, process: Any, hello: dict) -> None:
        self.spec = spec
        self.conn = conn
        self.process = process
        self.hello = hello
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._closed: Optional[str] = None
        self.bytes_out = 0
        self.bytes_in = 0
        self._reader = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    async def open(cls, spec: HostSpec, conn: Optional[asyncssh.SSHClientConnection] = None) -> "AgentChannel":
        conn = conn if conn is not None else await open_connection(spec)
        try:
            zip_name, _ = agent_zipapp()
            for attempt in range(2):
                process = await conn.create_process(_agent_command(spec, zip_name), encoding=None)
                first = await asyncio.wait_for(process.stdout.readline(), spec.connect_timeout_s * 3)
                if first.startswith(NEED_AGENT.encode() + b" ") and attempt == 0:
                    process.close()
                    # The shell's $HOME, not SFTP's start directory: they can differ.
                    await upload_agent(conn, first[len(NEED_AGENT) + 1:].decode().strip())
                    continue
                try:
                    hello = decode(first)
                except ValueError:
                    hello = {}
                if hello.get("hello") == HELLO:
                    try:
                        check_reply("hello", hello, spec.name)
                    except BadReply as exc:
                        process.close()
                        raise HostError(str(exc)) from None
                    if spec.readonly and hello.get("readonly") is not True:
                        # An agent that did not take --readonly (an old installed gpudeck) would act:
                        # a read-only host is watched through an agent that refuses, or not at all.
                        process.close()
                        raise HostError(f"{spec.name}: the agent there does not enforce read-only "
                                        f"(agent {hello.get('version')}); not connecting to a readonly host")
                if hello.get("hello") != HELLO:
                    err = b""
                    try:
                        err = await asyncio.wait_for(process.stderr.read(4096), 1.0)
                    except (asyncio.TimeoutError, asyncssh.Error):
                        pass
                    process.close()
                    text = (err or first).decode("utf-8", "replace").strip().splitlines()
                    raise HostError(f"{spec.name}: the agent did not start with {spec.python}: "
                                    f"{text[-1] if text else 'no output'}")
                return cls(spec, conn, process, hello)
            raise HostError(f"{spec.name}: the uploaded agent is not where it was written")
        except (OSError, asyncssh.Error, asyncio.TimeoutError) as exc:
            conn.close()
            raise HostError(f"{spec.name}: starting the agent failed: {_reason(exc)}") from None
        except BaseException:
            conn.close()
            raise

    async def _read(self) -> None:
        reason = "connection lost"
        try:
            while True:
                line = await self.process.stdout.readline()
                if not line:
                    break
                self.bytes_in += len(line)
                try:
                    message = decode(line)
                except ValueError:
                    continue
                rid = message.get("id")
                fut = self._pending.pop(rid, None) if isinstance(rid, int) else None
                if fut is not None and not fut.done():
                    fut.set_result(message)
        except (OSError, asyncssh.Error) as exc:
            reason = f"connection lost: {_reason(exc)}"
        except asyncio.CancelledError:
            reason = "closed"
        except Exception as exc:           # a reply nothing above foresaw: the link closes (and is remade), never wedges
            reason = f"unreadable reply ({type(exc).__name__})"
        self._fail_all(reason)

    def _fail_all(self, reason: str) -> None:
        self._closed = self._closed or reason
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(HostError(f"{self.spec.name}: {reason}"))
        self._pending.clear()

    @property
    def closed(self) -> bool:
        return self._closed is not None

    async def call(self, op: str, params: Optional[dict] = None, timeout: Optional[float] = None) -> Any:
        if self._closed is not None:
            raise HostError(f"{self.spec.name}: {self._closed}")
        rid = next(self._ids)
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        data = encode({"id": rid, "op": op, "params": params or {}})
        try:
            self.process.stdin.write(data)
            self.bytes_out += len(data)
        except (OSError, asyncssh.Error) as exc:
            self._pending.pop(rid, None)
            raise HostError(f"{self.spec.name}: connection lost: {_reason(exc)}") from None
        try:
            reply = await (asyncio.wait_for(fut, timeout) if timeout else fut)
        except asyncio.TimeoutError:
            self._pending.pop(rid, None)
            # What is left of the caller's timeout: said to a tenth, never "1.81095 s".
            waited = timeout or 0.0                 # only a call with a timeout times out
            raise HostError(f"{self.spec.name}: no answer to {op} within {round(waited, 1):g} s") from None
        if not reply.get("ok"):
            raise RemoteError(f"{self.spec.name}: {reply.get('error')}", code=_error_code(reply.get("code")))
        return reply.get("result")

    async def close(self) -> None:
        self._closed = self._closed or "closed"
        try:
            self.process.stdin.write_eof()
        except (OSError, asyncssh.Error):
            pass
        self.conn.close()
        self._reader.cancel()
        try:
            await asyncio.wait_for(self.conn.wait_closed(), 2.0)
        except (asyncio.TimeoutError, OSError, asyncssh.Error):
            pass


async def upload_agent(conn: asyncssh.SSHClientConnection, home: str) -> str:
    """SFTP the zipapp to ~/.cache/gpudeck/ under its hash name (written aside, then renamed: never half a file)."""
    name, data = agent_zipapp()
    cache = f"{home.rstrip('/')}/{REMOTE_CACHE}" if home.startswith("/") else REMOTE_CACHE
    async with conn.start_sftp_client() as sftp:
        await sftp.makedirs(cache, exist_ok=True)
        tmp = f"{cache}/.{name}.{os.getpid()}.tmp"
        async with sftp.open(tmp, "wb", asyncssh.SFTPAttrs(permissions=0o600)) as fh:
            await fh.write(data)
        try:
            await sftp.posix_rename(tmp, f"{cache}/{name}")
        except asyncssh.SFTPError:
            await sftp.rename(tmp, f"{cache}/{name}")
    return name


# -- a kept link (console, logs -f) ----------------------------------------------------------
class HostLink:
    """A host's agent kept connected: CONNECTING (first attempt), LIVE, DOWN (reconnecting with backoff
    1, 2, 4 ... 60 s). STALE is the fleet's word for LIVE with data older than it should be.

    `call()` waits for the link when it is down (up to `timeout`), so a caller that
    retries by offset (logs -f) resumes right after the reconnect.
    """

    def __init__(self, spec: HostSpec, *, on_change: Optional[Callable[["HostLink"], None]] = None,
                 backoff_first_s: float = BACKOFF_FIRST_S, backoff_max_s: float = BACKOFF_MAX_S) -> None:
        self.spec = spec
        self.state = CONNECTING
        self.error: Optional[str] = None
        self.since = time.time()
        self.last_reply: Optional[float] = None      # wall time of the last answer from the agent
        self.next_retry: Optional[float] = None
        self.hello: dict = {}
        self.connects = 0
        self.bytes_in = 0
        self.bytes_out = 0
        self._channel: Optional[AgentChannel] = None
        self._backoff_first = backoff_first_s
        self._backoff_max = backoff_max_s
        self._on_change = on_change
        self._changed = asyncio.Event()            # set on every state change: wakes callers waiting for the link
        self._kick = asyncio.Event()               # set by a caller: retry now instead of after the backoff
        self.refused: Optional[HostKeyError] = None   # the host key was refused: no retry until trusted
        self.attempts = 0                          # finished connection attempts
        self._attempt_done = 0.0                   # monotonic time the last one finished
        self._task: Optional[asyncio.Task] = None
        self._closing = False

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._keep())

    def _set(self, state: str, error: Optional[str] = None) -> None:
        if state != self.state or error != self.error:
            self.state, self.error, self.since = state, error, time.time()
            self._changed.set()
            if self._on_change is not None:
                self._on_change(self)

    async def _keep(self) -> None:
        delay = self._backoff_first
        while not self._closing:
            if not self.connects:
                # Only the first attempt reads CONNECTING: a host that dropped stays DOWN
                # (with its last data and age) until a reconnect has actually succeeded.
                self._set(CONNECTING, self.error)
            try:
                channel = await AgentChannel.open(self.spec)
            except HostKeyError as exc:
                # Retrying cannot help until the operator decides about the key.
                self.refused = exc
                self.attempts, self._attempt_done = self.attempts + 1, time.monotonic()
                self.next_retry = None
                self._set(DOWN, str(exc))
                return
            except HostError as exc:
                self.attempts, self._attempt_done = self.attempts + 1, time.monotonic()
                self.next_retry = time.time() + delay
                self._set(DOWN, str(exc))
                # Backoff, cut short when a command asks for the host (the lid just opened:
                # nobody should wait out a 60 s backoff to see the box again).
                self._kick.clear()
                try:
                    await asyncio.wait_for(self._kick.wait(), delay)
                except asyncio.TimeoutError:
                    pass
                delay = min(delay * 2, self._backoff_max)
                continue
            self._channel, self.hello, self.next_retry = channel, channel.hello, None
            self.connects += 1
            self.last_reply = time.time()
            delay = self._backoff_first
            self._set(LIVE)
            self._changed.set()
            await channel._reader                   # ends when the link dies
            self.bytes_in += channel.bytes_in
            self.bytes_out += channel.bytes_out
            self._channel = None
            if self._closing:
                break
            self._set(DOWN, f"{self.spec.name}: {channel._closed or 'connection lost'}")
        self._set(DOWN, self.error or "closed")

    def traffic(self) -> tuple[int, int]:
        ch = self._channel
        return (self.bytes_in + (ch.bytes_in if ch else 0), self.bytes_out + (ch.bytes_out if ch else 0))

    async def call(self, op: str, params: Optional[dict] = None, timeout: Optional[float] = None,
                   retry: bool = True, wake: bool = True) -> Any:
        """One request; when the link is down, wait for it (within `timeout`) instead of failing at once.

        A link that never came up fails with the reason of a fresh attempt (the CLI
        says why). `wake` (a person asked: a CLI command) cuts a pending backoff short;
        background polling passes False so the backoff holds. `retry=False` is for
        actions: a start whose answer was lost is not sent twice.
        """
        self.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if self._channel is None or self._channel.closed:
                if self._task is not None and self._task.done():
                    if self.refused is not None:
                        raise self.refused          # the key refusal itself: its keeper retires on it
                    raise HostError(self.error or f"{self.spec.name}: down")
                if self.connects == 0 and self.state == DOWN:
                    # Never up: the verdict of an attempt that ended just now stands; an older
                    # one is re-tried at once (if woken) and that attempt decides.
                    if not wake or time.monotonic() - self._attempt_done < 1.0:
                        raise HostError(self.error or f"{self.spec.name}: down")
                    seen = self.attempts
                    self._kick.set()
                    while self.attempts == seen and (self._channel is None or self._channel.closed):
                        left = None if deadline is None else max(0.0, deadline - time.monotonic())
                        self._changed.clear()
                        try:
                            await asyncio.wait_for(self._changed.wait(), left)
                        except asyncio.TimeoutError:
                            raise HostError(self.error or f"{self.spec.name}: not connected") from None
                    continue
                if wake:
                    self._kick.set()
                # No await between the check above and this wait: a state change cannot slip past.
                self._changed.clear()
                try:
                    await asyncio.wait_for(self._changed.wait(), remaining)
                except asyncio.TimeoutError:
                    raise HostError(self.error or f"{self.spec.name}: not connected") from None
                continue
            try:
                result = await self._channel.call(op, params, remaining)
            except HostError:
                if not retry or (deadline is not None and time.monotonic() >= deadline):
                    raise
                await asyncio.sleep(0)      # the keeper sees the dead channel and reconnects
                continue
            self.last_reply = time.time()
            # Outside the retry above: a bad reply is the box's answer, asking again would get it again.
            return check_reply(op, result, self.spec.name)

    async def close(self) -> None:
        self._closing = True
        if self._channel is not None:
            await self._channel.close()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - closing never fails
                pass


class DeltaState:
    """The latest full payload of a delta-sent request (status, jobs), rebuilt from each reply."""

    def __init__(self, unpack: Optional[Callable[[dict], dict]] = None) -> None:
        self.value: Optional[dict] = None          # as on the wire
        self._unpack = unpack

    def apply(self, reply: dict) -> dict:
        """The payload after this reply, unpacked for the faces."""
        if "full" in reply:
            self.value = reply["full"]
        elif self.value is not None:
            self.value = patch(self.value, reply.get("delta"))
        else:
            raise HostError("delta without a base (agent restarted mid-stream)")
        return self._unpack(self.value) if self._unpack is not None else self.value


def decode_log_chunk(reply: dict) -> bytes:
    return base64.b64decode(reply.get("data") or "")


def _error_code(value: object) -> int:
    """The exit code an agent's error reply names (1 or 2; 3 for --require-gpu); 2 for anything else it sends."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value in (1, 2, 3) else 2
