"""hosts.toml: values no connection could use are refused at FILE:LINE:COL; bracketed IPv6 destinations parse."""
from __future__ import annotations

import pytest

from gpudeck.jobs.hosts.config import HostConfigError, HostSpec, load_hosts


@pytest.mark.parametrize("ssh, expected", [
    ("root@[::1]:22", ("root", "::1", 22)),
    ("[::1]:2222", (None, "::1", 2222)),
    ("ops@[fe80::1]", ("ops", "fe80::1", None)),
    ("ssh://root@[::1]:22", ("root", "::1", 22)),
    ("::1", (None, "::1", None)),
    ("ops@box:2222", ("ops", "box", 2222)),
    ("box", (None, "box", None)),
])
def test_destinations_parse(ssh, expected):
    assert HostSpec("h", ssh=ssh).destination() == expected


@pytest.mark.parametrize("body, line, col, words", [
    ('[hosts.a]\nssh = "box:99999"\n', 2, 7, "port 99999 is out of range"),
    ('[hosts.a]\nssh = "box:0"\n', 2, 7, "port 0 is out of range"),
    ('[hosts.a]\nssh = "box:ssh"\n', 2, 7, "is not a number"),
    ('[hosts.a]\nssh = "root@[::1:22"\n', 2, 7, "bracketed host"),
    ('[hosts.a]\nssh = "root@"\n', 2, 7, "no host name"),
    ('[hosts.a]\nssh = "box"\nconnect_timeout_s = nan\n', 3, 21, "connect_timeout_s must be"),
    ('[hosts.a]\nssh = "box"\nconnect_timeout_s = inf\n', 3, 21, "connect_timeout_s must be"),
    ('[hosts.a]\nssh = "box"\nconnect_timeout_s = -1\n', 3, 21, "connect_timeout_s must be"),
    ('[hosts.a]\nssh = "box"\nkeepalive_s = 0\n', 3, 15, "keepalive_s must be"),
    ('[hosts.a]\nssh = "box"\nkeepalive_count = 0\n', 3, 19, "keepalive_count must be"),
    ('[hosts.a]\nssh = "box"\n\n  shell = "zsh"\n', 4, 3, "unknown key 'shell'"),
    ('[hosts.a]\nssh = "box"\nsimulated = "yes"\n', 3, 13, "simulated has the wrong type"),
    ('[hosts.a]\nssh = "box\n', 2, 11, "TOML syntax"),
])
def test_values_that_break_connecting_are_refused_where_they_are(tmp_path, body, line, col, words):
    path = tmp_path / "hosts.toml"
    path.write_text(body)
    with pytest.raises(HostConfigError) as err:
        load_hosts(path)
    message = str(err.value)
    assert message.startswith(f"{path}:{line}:{col}: ") and words in message and "\n" not in message
