"""Webhook targets as declared in `[notify.NAME]` tables: their keys, validation and how a URL is shown (redacted).

A leaf under the spec: jobs.toml (gpudeck.jobs.spec) and the user's config.toml both
validate their tables here, with the caller's located `error` callback; delivery is
gpudeck.jobs.notify. A target travels as plain JSON (meta.json, pipeline records):
{"name", "url", "format", "on", "timeout_s", "retries", "source"}. Stdlib only.
"""
from __future__ import annotations

import difflib
import re
from typing import Any, Callable, Iterable, Mapping, Optional
from urllib.parse import urlsplit

FORMATS = ("json", "slack", "discord", "ntfy")
KEYS = ("url", "format", "on", "timeout_s", "retries")
# Every code the health rules raise (gpudeck.jobs.stalls.SEVERITY; a test keeps the two equal).
# Listed here, not imported: the spec sits below the stall rules.
ALERT_CODES = ("crashed", "stalled", "nccl_hang", "oom_risk", "spec_decode_ineffective")

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_RETRIES = 3
# One attempt waits at most this long for an answer; a webhook that needs longer is down.
MAX_TIMEOUT_S = 60.0
# Backoff doubles from BACKOFF_S (1 s, 2 s, 4 s, ...): five retries already span 31 s.
MAX_RETRIES = 5
BACKOFF_S = 1.0
# Everything a delivery may take, attempts and waits together: an alert an hour late helps nobody.
MAX_DELIVERY_S = 300.0

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")

# error(message, path, part): part "key" points at the key, "value" at its value.
ErrorFn = Callable[[str, tuple, str], None]
# text(value, path): the string with ${vars} expanded, or None when it reported an error itself.
TextFn = Callable[[Any, tuple], Optional[str]]


def redact_url(url: Any) -> str:
    """scheme://host[:port] and "/…" for the rest: a webhook's path or query is often its secret token."""
    try:
        parts = urlsplit(str(url))
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "(a URL)"
    if not parts.scheme or not host:
        return "(a URL)"
    shown = f"[{host}]" if ":" in host else host
    netloc = f"{shown}:{port}" if port is not None else shown
    rest = "/…" if (parts.path not in ("", "/") or parts.query or parts.fragment) else ""
    return f"{parts.scheme}://{netloc}{rest}"


def scrub(text: str, url: str) -> str:
    """An error text with the URL (or its path and query) replaced by its redacted form."""
    if not url:
        return text
    text = text.replace(url, redact_url(url))
    try:
        parts = urlsplit(url)
    except ValueError:
        return text
    # longest first: the path with its query, then each alone (an error may quote either)
    for secret in (parts.path + ("?" + parts.query if parts.query else ""), parts.path, parts.query,
                   parts.password or ""):
        if len(secret) > 1:
            text = text.replace(secret, "…")
    return text


def total_bound(target: Mapping[str, Any]) -> float:
    """The longest one target's delivery may take: every attempt's timeout and every backoff wait, capped."""
    retries = int(target.get("retries", DEFAULT_RETRIES))
    timeout = float(target.get("timeout_s", DEFAULT_TIMEOUT_S))
    waits = sum(BACKOFF_S * 2 ** i for i in range(retries))
    return min(MAX_DELIVERY_S, (retries + 1) * timeout + waits)


def wants(target: dict, code: str) -> bool:
    on = target.get("on")
    return not on or code in on


def merged(own: dict[str, dict], everyone: dict[str, dict]) -> list[dict]:
    """The targets of one jobs file: its own, then the user's config.toml ones it does not name itself."""
    out = [dict(t) for t in own.values()]
    out += [dict(t) for name, t in everyone.items() if name not in own]
    return out


def validate(table: Any, where: tuple, error: ErrorFn, text: TextFn, source: str = "") -> dict[str, dict]:
    """`notify = {NAME = {...}}` -> {NAME: target}; each problem goes to error(), located under `where`."""
    if not isinstance(table, dict):
        error(f"'notify' must be a table of [notify.NAME] tables, got {_type_name(table)}", where, "value")
        return {}
    targets: dict[str, dict] = {}
    for name, entry in table.items():
        target = _target(name, entry, where + (name,), error, text, source)
        if target is not None:
            targets[name] = target
    return targets


def _target(name: str, entry: Any, at: tuple, error: ErrorFn, text: TextFn, source: str) -> Optional[dict]:
    ok = True
    if not _NAME_RE.fullmatch(name):
        error(f"bad notify target name {name!r}: use letters, digits, '.', '_' and '-' (at most 64), "
              "starting with a letter or digit", at, "key")
        ok = False
    if not isinstance(entry, dict):
        error(f"notify target {name!r} must be a table ([notify.{name}]), got {_type_name(entry)}", at, "value")
        return None
    for key in entry:
        if key not in KEYS:
            error(f"unknown key {key!r} in notify target {name!r}{_suggest(key, KEYS)}", at + (key,), "key")
            ok = False
    target: dict[str, Any] = {"name": name, "url": None, "format": "json", "on": [],
                              "timeout_s": DEFAULT_TIMEOUT_S, "retries": DEFAULT_RETRIES, "source": source}
    if "url" not in entry:
        error(f"notify target {name!r} has no url (the webhook to POST to)", at, "key")
        ok = False
    else:
        url = text(entry["url"], at + ("url",)) if isinstance(entry["url"], str) else None
        if not isinstance(entry["url"], str):
            error(f"url must be a string, got {_type_name(entry['url'])}", at + ("url",), "value")
            ok = False
        elif url is None:
            ok = False
        else:
            problem = _url_problem(url)
            if problem:
                error(problem, at + ("url",), "value")
                ok = False
            target["url"] = url
    if "format" in entry:
        fmt = entry["format"]
        if not isinstance(fmt, str) or fmt not in FORMATS:
            shown = repr(fmt) if isinstance(fmt, str) and len(fmt) <= 40 else _type_name(fmt)
            error(f"format must be one of {', '.join(FORMATS)}; got {shown}{_suggest(fmt, FORMATS)}",
                  at + ("format",), "value")
            ok = False
        else:
            target["format"] = fmt
    if "on" in entry:
        codes = _codes(entry["on"], at + ("on",), error)
        if codes is None:
            ok = False
        else:
            target["on"] = codes
    if "timeout_s" in entry:
        value = entry["timeout_s"]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            error(f"timeout_s must be a number of seconds, got {_type_name(value)}", at + ("timeout_s",), "value")
            ok = False
        elif not 0 < value <= MAX_TIMEOUT_S:
            error(f"timeout_s must be more than 0 and at most {MAX_TIMEOUT_S:g} seconds, got {value!r}",
                  at + ("timeout_s",), "value")
            ok = False
        else:
            target["timeout_s"] = float(value)
    if "retries" in entry:
        value = entry["retries"]
        if isinstance(value, bool) or not isinstance(value, int):
            error(f"retries must be an integer 0..{MAX_RETRIES}, got {_type_name(value)}", at + ("retries",), "value")
            ok = False
        elif not 0 <= value <= MAX_RETRIES:
            error(f"retries must be 0..{MAX_RETRIES}, got {value!r}", at + ("retries",), "value")
            ok = False
        else:
            target["retries"] = value
    return target if ok else None


def _url_problem(url: str) -> Optional[str]:
    """Why a URL cannot be POSTed to, in words that never repeat the URL (it may hold a token)."""
    if not url.strip():
        return "url is empty"
    if any(ord(c) <= 32 or ord(c) == 127 for c in url):
        return "url contains a space or a control character"
    try:
        parts = urlsplit(url)
        parts.port
    except ValueError:
        return "url is not a valid URL (a bad port or bracketed host?)"
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        said = f"{scheme!r}" if scheme and len(scheme) <= 20 else "none"
        return f"url must start with http:// or https:// (scheme {said})"
    if not parts.hostname:
        return "url has no host"
    return None


def _codes(value: Any, at: tuple, error: ErrorFn) -> Optional[list[str]]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list):
        error(f"on must be a list of alert codes ({', '.join(ALERT_CODES)}), got {_type_name(value)}", at, "value")
        return None
    if not items:
        error("on is empty: leave it out to be told of every alert", at, "value")
        return None
    codes: list[str] = []
    ok = True
    for index, code in enumerate(items):
        where = at if isinstance(value, str) else at + (index,)
        if not isinstance(code, str):
            error(f"on items must be alert codes (strings), got {_type_name(code)}", where, "value")
            ok = False
        elif code not in ALERT_CODES:
            shown = repr(code) if len(code) <= 40 else repr(code[:37] + "...")
            error(f"unknown alert code {shown} in on{_suggest(code, ALERT_CODES)}; the codes are "
                  f"{', '.join(ALERT_CODES)}", where, "value")
            ok = False
        elif code in codes:
            error(f"on lists {code!r} twice", where, "value")
            ok = False
        else:
            codes.append(code)
    return codes if ok else None


def _suggest(word: Any, choices: Iterable[str]) -> str:
    if not isinstance(word, str):
        return ""
    matches = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {matches[0]!r}?)" if matches else ""


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    for kind, name in ((int, "an integer"), (float, "a float"), (str, "a string"), (list, "an array"),
                       (dict, "a table")):
        if isinstance(value, kind):
            return name
    return f"a {type(value).__name__}"
