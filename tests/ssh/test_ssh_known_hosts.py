"""Host keys and destinations against a real sshd: trusting a changed key retires the old one, hashed
known_hosts included; a bracketed IPv6 destination connects."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sshsupport import ClientHome, Sshd, ensure_openssh, keygen

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
USER = os.environ.get("USER") or "root"


@pytest.fixture
def box(tmp_path):
    """One sshd and one laptop HOME of this test's own (the session lab's known_hosts stays untouched)."""
    reason = ensure_openssh()
    if reason:
        pytest.skip(reason)
    client = ClientHome(tmp_path / "laptop")
    sshd = Sshd(tmp_path / "box", client.pub)
    (tmp_path / "jobs.toml").write_text('[jobs.hello]\ncmd = "echo hello"\n')
    yield client, sshd
    client.stop_keepers()
    sshd.stop()


def gd(client: ClientHome, *args: str) -> subprocess.CompletedProcess:
    # No link keeper: each command meets the server (and its key) itself.
    return subprocess.run([sys.executable, "-m", "gpudeck.console.cli", *args], cwd=REPO,
                          env=client.env(GPUDECK_SSH_MUX="0"), capture_output=True, text=True, timeout=90)


def hosts_toml(client: ClientHome, tmp_path: Path, ssh: str) -> None:
    client.write_hosts(f'[hosts.box]\nssh = "{ssh}"\njobs = "{tmp_path / "jobs.toml"}"\n'
                       f'state_dir = "{tmp_path / "state"}"\nsimulated = true\nconnect_timeout_s = 5\n')


def fingerprint(pub: Path) -> str:
    return subprocess.run(["ssh-keygen", "-lf", str(pub)], capture_output=True, text=True, check=True).stdout.split()[1]


def test_trusting_a_changed_key_retires_the_old_one_in_a_hashed_known_hosts(box, tmp_path):
    client, sshd = box
    old = keygen(tmp_path / "old_host_key")
    old_pub = Path(str(old) + ".pub").read_text().split()[:2]
    client.add_alias("box", sshd)
    hosts_toml(client, tmp_path, "box")
    entry = f"[127.0.0.1]:{sshd.port}"
    # What a Debian laptop holds after meeting the box once: HashKnownHosts yes (ssh-keygen -H
    # hashes exactly as ssh does), plus an entry for another port of the same address that must survive.
    client.known_hosts.write_text(f"{entry} {' '.join(old_pub)}\n[127.0.0.1]:1 {' '.join(old_pub)}\n")
    subprocess.run(["ssh-keygen", "-H", "-f", str(client.known_hosts)], check=True, capture_output=True)
    assert entry not in client.known_hosts.read_text() and "|1|" in client.known_hosts.read_text()
    # ... and a plain copy in a comma list, as an older ssh wrote it.
    with client.known_hosts.open("a") as fh:
        fh.write(f"otherbox,{entry} {' '.join(old_pub)}\n")
    sshd.start()

    out = gd(client, "--host", "box", "jobs")
    assert out.returncode == 1 and "HOST KEY CHANGED" in out.stderr, out.stderr
    out = gd(client, "hosts", "trust", "box", "--yes")
    assert out.returncode == 0, out.stderr
    assert gd(client, "--host", "box", "jobs").returncode == 0

    # OpenSSH's own reading of the file: one key for the box, the new one, hashed like the rest.
    found = subprocess.run(["ssh-keygen", "-F", entry, "-f", str(client.known_hosts)],
                           capture_output=True, text=True).stdout
    keys = [line for line in found.splitlines() if line and not line.startswith("#")]
    assert len(keys) == 1 and keys[0].split()[2] == sshd.host_pub().split()[1] and keys[0].startswith("|1|")
    text = client.known_hosts.read_text()
    assert entry not in text and f"otherbox {' '.join(old_pub)}" in text
    other = subprocess.run(["ssh-keygen", "-F", "[127.0.0.1]:1", "-f", str(client.known_hosts)],
                           capture_output=True, text=True).stdout
    assert old_pub[1] in other

    # The box presents the old key again (a restored image, or someone in the middle): refused.
    sshd.stop()
    sshd.host_key = old
    sshd.write_config()
    sshd.start()
    out = gd(client, "--host", "box", "jobs")
    assert out.returncode == 1 and "HOST KEY CHANGED" in out.stderr, out.stderr
    assert fingerprint(Path(str(old) + ".pub")) in out.stderr


def test_a_bracketed_ipv6_destination_connects(box, tmp_path):
    client, sshd = box
    sshd.config.write_text(sshd.config.read_text() + "ListenAddress ::1\n")
    sshd.start()
    client.known_hosts.write_text(f"[::1]:{sshd.port} {sshd.host_pub()}\n")
    # No ~/.ssh/config alias: the user, address and port all come from the destination.
    hosts_toml(client, tmp_path, f"{USER}@[::1]:{sshd.port}")
    out = gd(client, "--host", "box", "jobs")
    assert out.returncode == 0 and "hello" in out.stdout, out.stderr
