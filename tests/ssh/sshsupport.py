"""A real OpenSSH server on 127.0.0.1 for the SSH tests and bench: installed if missing, own keys, own config.

Each `Sshd` is one `sshd -D` listening on a random loopback port with its own host
key and authorized_keys; a `ClientHome` is the laptop side: a HOME with
~/.ssh/config aliases, the client key, known_hosts and ~/.config/gpudeck/hosts.toml.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from runsupport import free_port

SSHD = "/usr/sbin/sshd"


def ensure_openssh() -> Optional[str]:
    """Install openssh-server (and the client tools) if missing; None when usable, else why not."""
    if os.path.exists(SSHD) and shutil.which("ssh-keygen"):
        return None
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return "openssh-server is not installed and cannot be installed here (needs root and apt-get)"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    lock = ["-o", "DPkg::Lock::Timeout=600"]
    subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, timeout=900)
    done = subprocess.run(["apt-get", "install", "-y", "-q", *lock, "openssh-server", "openssh-client"],
                          env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0 or not os.path.exists(SSHD):
        return f"installing openssh-server failed: {(done.stderr or done.stdout).strip()[-300:]}"
    return None


def keygen(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpudeck-test", "-f", str(path)],
                   check=True, capture_output=True)
    return path


def _children(pid: int) -> list[int]:
    kids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid:
            kids.append(int(entry))
    return kids


@dataclass
class Sshd:
    """One sshd as the current user: `start()`, `stop()`, `kill_sessions()` (the per-connection sshd processes)."""

    root: Path
    client_pub: Path
    port: int = field(default_factory=free_port)
    proc: Optional[subprocess.Popen] = None

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        self.host_key = self.root / "host_ed25519"
        if not self.host_key.exists():
            keygen(self.host_key)
        self.home = self.root / "home"              # the remote user's HOME (agent cache lives here)
        self.home.mkdir(exist_ok=True)
        (self.root / "authorized_keys").write_text(self.client_pub.read_text())
        self.config = self.root / "sshd_config"
        self.write_config()

    def write_config(self) -> None:
        user = os.environ.get("USER") or "root"
        self.config.write_text("\n".join([
            f"Port {self.port}",
            "ListenAddress 127.0.0.1",
            f"HostKey {self.host_key}",
            f"PidFile {self.root / 'sshd.pid'}",
            f"AuthorizedKeysFile {self.root / 'authorized_keys'}",
            f"AllowUsers {user}",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PermitRootLogin prohibit-password",   # the tests may run as root
            "StrictModes no",                      # keys live in temp dirs
            "UsePAM no",
            "AllowAgentForwarding no",
            "MaxStartups 200",
            "MaxSessions 50",
            f"SetEnv HOME={self.home}",
            f"Subsystem sftp {'/usr/lib/openssh/sftp-server' if os.path.exists('/usr/lib/openssh/sftp-server') else 'internal-sftp'}",
            "LogLevel ERROR",
            "",
        ]))

    def start(self) -> "Sshd":
        os.makedirs("/run/sshd", exist_ok=True)       # privilege-separation directory sshd insists on
        log = open(self.root / "sshd.log", "ab")
        self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(self.config)], stdout=log, stderr=log,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited: {(self.root / 'sshd.log').read_text()[-500:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    s.settimeout(2)
                    if s.recv(4).startswith(b"SSH-"):
                        return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("sshd did not listen within 20 s")

    def sessions(self) -> list[int]:
        """The per-connection sshd processes (children of the listener)."""
        return _children(self.proc.pid) if self.proc is not None else []

    def kill_sessions(self) -> list[int]:
        killed = []
        for pid in self.sessions():
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
        return killed

    def freeze(self) -> list[int]:
        """The box vanishes without a goodbye (lid closed, cable pulled): listener and sessions SIGSTOPped.

        Their sockets stay open and silent, so only keepalive can tell the link is dead.
        """
        pids = [self.proc.pid, *self.sessions()] if self.proc is not None else []
        for pid in pids:
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                pass
        self._frozen = pids
        return pids

    def thaw(self) -> None:
        for pid in getattr(self, "_frozen", []):
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        self._frozen = []

    def stop(self) -> None:
        """Listener and every session gone (SIGKILL)."""
        if self.proc is None:
            return
        self.thaw()
        for pid in [*self.sessions(), self.proc.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=10)
        self.proc = None

    def host_pub(self) -> str:
        return Path(str(self.host_key) + ".pub").read_text().strip()


@dataclass
class ClientHome:
    """The laptop: HOME with ~/.ssh/{config,known_hosts,id}, ~/.config/gpudeck/hosts.toml."""

    root: Path

    def __post_init__(self) -> None:
        self.ssh_dir = self.root / ".ssh"
        self.ssh_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.key = self.ssh_dir / "id_ed25519"
        if not self.key.exists():
            keygen(self.key)
        self.pub = Path(str(self.key) + ".pub")
        self.config_dir = self.root / ".config" / "gpudeck"
        self.config_dir.mkdir(parents=True, exist_ok=True)
        self._aliases: dict[str, str] = {}
        self.known_hosts = self.ssh_dir / "known_hosts"
        self.runtime = self.root / "run"
        self.runtime.mkdir(mode=0o700, exist_ok=True)

    def stop_keepers(self) -> None:
        """End the SSH link keepers the CLI started for this HOME (they would idle out anyway)."""
        for pid_file in self.runtime.glob("gpudeck-*/mux-*.pid"):
            try:
                os.kill(int(pid_file.read_text()), signal.SIGTERM)
            except (OSError, ValueError):
                pass

    def add_alias(self, alias: str, sshd: Sshd) -> None:
        user = os.environ.get("USER") or "root"
        self._aliases[alias] = "\n".join([
            f"Host {alias}", "  HostName 127.0.0.1", f"  Port {sshd.port}", f"  User {user}",
            f"  IdentityFile {self.key}", "  IdentitiesOnly yes", ""])
        (self.ssh_dir / "config").write_text("\n".join(self._aliases.values()))

    def trust(self, sshd: Sshd) -> None:
        lines = [ln for ln in (self.known_hosts.read_text().splitlines() if self.known_hosts.exists() else [])
                 if not ln.startswith(f"[127.0.0.1]:{sshd.port} ")]
        lines.append(f"[127.0.0.1]:{sshd.port} {sshd.host_pub()}")
        self.known_hosts.write_text("\n".join(lines) + "\n")

    def write_hosts(self, text: str) -> Path:
        path = self.config_dir / "hosts.toml"
        path.write_text(text)
        return path

    def env(self, **extra: str) -> dict:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("GPUDECK_") and k not in ("SSH_AUTH_SOCK", "XDG_CONFIG_HOME", "XDG_STATE_HOME")}
        env["HOME"] = str(self.root)
        # Named, not only dropped: tests copy this env over os.environ, where the suite's own empty
        # XDG_CONFIG_HOME (conftest) would otherwise hide the laptop's hosts.toml.
        env["XDG_CONFIG_HOME"] = str(self.root / ".config")
        # The CLI's SSH link keepers (jobs/hosts/mux.py) put their sockets here and idle out quickly.
        env["XDG_RUNTIME_DIR"] = str(self.runtime)
        env["GPUDECK_MUX_IDLE_S"] = "20"
        env["GPUDECK_STATE_DIR"] = str(self.root / "local-state")
        env.update(extra)
        return env
