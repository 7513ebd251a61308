"""Webhook notifications of one alert, delivered outside the run: the four body formats, retries with backoff, a record of every attempt.

The run's HealthMonitor calls `launch()` for each new alert; it starts
`python -m gpudeck.jobs.notify RUN_DIR` in a new session, with the alert and the
targets in its environment (never in argv: `ps` shows argv to every user, and a
webhook URL is often its own token). Like an on_alert hook the child is recorded in
hooks.jsonl, so neither the runner's leftover sweep nor `gpudeck stop` counts it as
the job's: a crash is delivered while the job is being cleaned up, and the delivery
outlives the runner. Each target is tried in its own thread; every attempt lands in
the run's events.jsonl (NotifyDelivered / NotifyFailed, with the HTTP status or the
error, the URL redacted). The monitor never waits on any of it. Stdlib only
(urllib.request), like the runner.
"""
from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

from gpudeck.jobs.notify_targets import BACKOFF_S, redact_url, scrub, total_bound, wants
from gpudeck.jobs.runs import append_jsonl, open_private

ENV_ALERT = "GPUDECK_NOTIFY_ALERT"
ENV_TARGETS = "GPUDECK_NOTIFY_TARGETS"
NOTIFY_LOG = "notify.log"
HOOKS = "hooks.jsonl"
EVENTS = "events.jsonl"
# Text from the job's log: bounded before it goes to a chat (Discord refuses over 2,000 characters).
MAX_MESSAGE = 1800
# The child's own end, past every target's bound: a stuck DNS lookup or a server trickling
# bytes (urllib's timeout is per socket operation) must not keep it alive.
GRACE_S = 5.0
USER_AGENT = "gpudeck-notify"
# Non-2xx answers worth another try: the server is overloaded or briefly down. Other 4xx
# (a revoked token, a wrong URL) will not get better by asking again.
RETRY_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})

Record = Callable[[dict], None]


# -- bodies -------------------------------------------------------------------

def _iso(t: Any) -> Optional[str]:
    if not isinstance(t, (int, float)) or isinstance(t, bool):
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _clean(value: Any, limit: int = MAX_MESSAGE) -> str:
    from gpudeck.jobs.logs.sanitize import terminal_text
    return terminal_text("" if value is None else str(value).replace("\0", "\\0"), limit)


def summary_line(alert: Mapping[str, Any], host: str) -> str:
    sev = _clean(alert.get("severity") or "warning", 20)
    line = (f"[{sev}] {_clean(alert.get('job'), 80)} run {_clean(alert.get('run_id'), 40)} on {_clean(host, 80)}: "
            f"{_clean(alert.get('code'), 40)} — {_clean(alert.get('message'))}")
    if alert.get("hint"):
        line += f" ({_clean(alert.get('hint'), 400)})"
    return line


def _header(value: str) -> str:
    """A header value: one line; non-ASCII as RFC 2047 UTF-8 (what ntfy reads), since HTTP headers are Latin-1."""
    value = " ".join(value.split())
    if value.isascii():
        return value
    return "=?UTF-8?B?" + base64.b64encode(value.encode("utf-8")).decode("ascii") + "?="


def body(fmt: str, alert: Mapping[str, Any], host: str) -> tuple[bytes, dict[str, str]]:
    """The request body and headers of one format."""
    if fmt == "slack":
        # Slack reads &, < and > as markup (links, mentions): escaped as its docs say.
        text = summary_line(alert, host).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        return json.dumps({"text": text}).encode(), {"Content-Type": "application/json"}
    if fmt == "discord":
        # No mention from a log line may ping anyone (@everyone in a crash message).
        data: dict[str, Any] = {"content": summary_line(alert, host)[:2000], "allowed_mentions": {"parse": []}}
        return json.dumps(data).encode(), {"Content-Type": "application/json"}
    if fmt == "ntfy":
        error = alert.get("severity") == "error"
        text = _clean(alert.get("message"))
        if alert.get("hint"):
            text += f"\n{_clean(alert.get('hint'), 400)}"
        text += f"\n{_clean(alert.get('job'), 80)} run {_clean(alert.get('run_id'), 40)} on {_clean(host, 80)}"
        headers = {"Content-Type": "text/plain; charset=utf-8",
                   "Title": _header(f"gpudeck: {_clean(alert.get('job'), 80)} {_clean(alert.get('code'), 40)}"),
                   "Priority": "high" if error else "default",
                   "Tags": ("rotating_light" if error else "warning") + ",gpudeck," + _header(_clean(alert.get("code"), 40))}
        return text.encode("utf-8"), headers
    data = {"job": alert.get("job"), "run": alert.get("run_id"), "host": host, "code": alert.get("code"),
            "severity": alert.get("severity"), "message": _clean(alert.get("message"), 4000),
            "time": _iso(alert.get("t") if alert.get("t") is not None else alert.get("since")),
            "since": _iso(alert.get("since"))}
    for key in ("cause", "hint"):
        if alert.get(key):
            data[key] = _clean(alert.get(key), 400)
    return json.dumps(data).encode(), {"Content-Type": "application/json"}


# -- one target ------------------------------------------------------------------

class _NoRedirect(urllib.request.HTTPRedirectHandler):
    # A POST redirected becomes a GET without its body: a 3xx is reported, never followed.
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)

# post's signature: (url, body, headers, timeout) -> (HTTP status, error); tests pass a fake.
Sender = Callable[[str, bytes, Mapping[str, str], float], tuple[Optional[int], Optional[str]]]


def post(url: str, data: bytes, headers: Mapping[str, str], timeout: float) -> tuple[Optional[int], Optional[str]]:
    """(HTTP status, None) when the server answered, (None, error) when it did not; never raises."""
    request = urllib.request.Request(url, data=data, method="POST",
                                     headers={"User-Agent": USER_AGENT, **headers})
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            response.read(64 * 1024)
            return response.status, None
    except urllib.error.HTTPError as exc:
        exc.close()
        return exc.code, None
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, (socket.timeout, TimeoutError)):
            return None, f"no answer within {round(timeout, 1):g} s"
        return None, scrub(str(reason), url)
    except (socket.timeout, TimeoutError):
        return None, f"no answer within {round(timeout, 1):g} s"
    except Exception as exc:  # noqa: BLE001 - a reset, a bad status line: recorded, never raised
        return None, scrub(f"{type(exc).__name__}: {exc}", url)


def deliver(target: Mapping[str, Any], alert: Mapping[str, Any], host: str, record: Record, *,
            sleep: Callable[[float], None] = time.sleep, send: Sender = post) -> bool:
    """POST one alert to one target: retries with doubling backoff, bounded in total; each attempt recorded."""
    url = str(target.get("url") or "")
    fmt = str(target.get("format") or "json")
    retries = int(target.get("retries") or 0)
    timeout = float(target.get("timeout_s") or 10.0)
    attempts = retries + 1
    deadline = time.monotonic() + total_bound(target)
    data, headers = body(fmt, alert, host)
    base = {"target": target.get("name"), "url": redact_url(url), "format": fmt, "code": alert.get("code"),
            "alert_since": alert.get("since")}
    for attempt in range(1, attempts + 1):
        left = deadline - time.monotonic()
        started = time.monotonic()
        status, error = send(url, data, headers, max(0.1, min(timeout, left)))
        took = round(time.monotonic() - started, 3)
        if status is not None and 200 <= status < 300:
            record({"event": "NotifyDelivered", **base, "attempt": attempt, "attempts": attempts,
                    "status": status, "took_s": took})
            return True
        wait = BACKOFF_S * 2 ** (attempt - 1)
        again = (attempt < attempts and (status is None or status in RETRY_STATUSES)
                 and time.monotonic() + wait + 0.1 < deadline)
        record({"event": "NotifyFailed", **base, "attempt": attempt, "attempts": attempts,
                **({"status": status} if status is not None else {"error": error}),
                "took_s": took, "final": not again, **({"retry_in_s": wait} if again else {})})
        if not again:
            return False
        sleep(wait)
    return False


def deliver_all(targets: Iterable[Mapping[str, Any]], alert: Mapping[str, Any], host: str, record: Record,
                **kwargs: Any) -> dict[str, Optional[bool]]:
    """Every target that wants this alert, each in its own thread; {name: delivered (None: cut off)}."""
    chosen = [t for t in (_usable(t) for t in targets) if t is not None and wants(t, str(alert.get("code")))]
    results: dict[str, Optional[bool]] = {str(t.get("name")): None for t in chosen}
    threads = []
    for target in chosen:
        def work(target: Mapping[str, Any] = target) -> None:
            try:
                results[str(target.get("name"))] = deliver(target, alert, host, record, **kwargs)
            except Exception as exc:  # noqa: BLE001 - a bug here still leaves a record, never a silent loss
                results[str(target.get("name"))] = False
                record({"event": "NotifyFailed", "target": target.get("name"), "url": redact_url(target.get("url")),
                        "format": target.get("format"), "code": alert.get("code"), "final": True,
                        "error": scrub(f"{type(exc).__name__}: {exc}", str(target.get("url")))})
        thread = threading.Thread(target=work, name=f"notify-{target.get('name')}", daemon=True)
        thread.start()
        threads.append((target, thread))
    started = time.monotonic()
    for target, thread in threads:
        thread.join(max(0.0, started + total_bound(dict(target)) + GRACE_S - time.monotonic()))
        if thread.is_alive():
            record({"event": "NotifyFailed", "target": target.get("name"), "url": redact_url(target.get("url")),
                    "format": target.get("format"), "code": alert.get("code"), "final": True,
                    "error": f"still not delivered after {total_bound(dict(target)) + GRACE_S:g} s; given up"})
    return results


def _usable(target: Any) -> Optional[dict]:
    """A target as meta.json holds it, with its numbers clamped: a hand-edited one cannot stall or crash delivery."""
    if not isinstance(target, Mapping) or not isinstance(target.get("url"), str):
        return None
    from gpudeck.jobs.notify_targets import DEFAULT_RETRIES, DEFAULT_TIMEOUT_S, MAX_RETRIES, MAX_TIMEOUT_S
    out = dict(target)
    try:
        out["timeout_s"] = min(MAX_TIMEOUT_S, max(0.1, float(out.get("timeout_s", DEFAULT_TIMEOUT_S))))
    except (TypeError, ValueError):
        out["timeout_s"] = DEFAULT_TIMEOUT_S
    try:
        out["retries"] = min(MAX_RETRIES, max(0, int(out.get("retries", DEFAULT_RETRIES))))
    except (TypeError, ValueError):
        out["retries"] = DEFAULT_RETRIES
    if not isinstance(out.get("on"), list):
        out["on"] = []
    return out


# -- the run's side ------------------------------------------------------------------

def launch(run_dir: Path, alert: Mapping[str, Any], targets: list) -> Optional[subprocess.Popen]:
    """Start the detached delivery of one alert (None when no target wants it); returns at once."""
    code = str(alert.get("code"))
    chosen = [dict(t) for t in targets if isinstance(t, Mapping) and t.get("url") and wants(dict(t), code)]
    if not chosen:
        return None
    run_dir = Path(run_dir)
    env = {k: v for k, v in os.environ.items() if "\0" not in v and k != "GPUDECK_RUN_ID"}
    # Bounded: one environment string over 128 KiB would make the exec fail (and the message is cut anyway).
    small = {k: (v[:4000] if isinstance(v, str) else v) for k, v in dict(alert).items()}
    env[ENV_ALERT] = json.dumps(small, default=str).replace("\0", "\\0")
    env[ENV_TARGETS] = json.dumps(chosen)
    try:
        out_fd = open_private(run_dir / NOTIFY_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    except OSError:
        out_fd = os.open(os.devnull, os.O_WRONLY)
    with open(out_fd, "ab") as out:
        child = subprocess.Popen([sys.executable, "-m", "gpudeck.jobs.notify", str(run_dir)],
                                 env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                 start_new_session=True, close_fds=True, cwd=str(run_dir))
    # Recorded before anything else looks: the runner's leftover sweep and `stop` skip this session.
    from gpudeck.jobs.procs import identity
    ident = identity(child.pid)
    append_jsonl(run_dir / HOOKS, {"pid": child.pid, "start": ident.start if ident else None,
                                   "t": round(time.time(), 3), "code": code, "notify": True})
    return child


def deliveries(events: Iterable[Mapping[str, Any]], started: Optional[float]) -> list[dict]:
    """The NotifyDelivered / NotifyFailed events of a run, for its post-mortem (URLs redacted again)."""
    out = []
    for ev in events:
        kind = ev.get("event")
        if kind not in ("NotifyDelivered", "NotifyFailed", "NotifyConfigInvalid"):
            continue
        t = ev.get("t") if isinstance(ev.get("t"), (int, float)) else None
        row = {"outcome": {"NotifyDelivered": "delivered", "NotifyFailed": "failed"}.get(kind, "config"),
               "t": t, "at_s": round(t - started, 3) if t is not None and started is not None else None}
        for key in ("target", "format", "code", "attempt", "attempts", "status", "error", "final", "retry_in_s",
                    "took_s"):
            if ev.get(key) is not None:
                row[key] = ev[key]
        if ev.get("url") is not None:
            row["url"] = redact_url(ev["url"]) if "://" in str(ev["url"]) else str(ev["url"])
        out.append(row)
    return out


def describe(row: Mapping[str, Any]) -> str:
    """One line of a delivery for the post-mortem's faces (plain text; the renderer escapes it)."""
    if row.get("outcome") == "config":
        return f"notify settings not read: {row.get('error')}"
    who = f"{row.get('target')} ({row.get('format')}, {row.get('url')})"
    tries = f"attempt {row.get('attempt')} of {row.get('attempts')}" if row.get("attempts") else "delivery"
    if row.get("outcome") == "delivered":
        return f"{row.get('code')} → {who}: delivered on {tries} (HTTP {row.get('status')})"
    why = f"HTTP {row['status']}" if row.get("status") is not None else str(row.get("error") or "failed")
    then = f", retrying in {row['retry_in_s']:g} s" if row.get("retry_in_s") else (", given up" if row.get("final") else "")
    return f"{row.get('code')} → {who}: {tries} failed: {why}{then}"


def run_targets(jobs_file: Any) -> tuple[list[dict], Optional[str]]:
    """The targets a run of this jobs file notifies: its own [notify.*] and the user's config.toml ones.

    A broken config.toml costs its own targets only (the problem comes back to be recorded);
    `gpudeck check` names every error in it.
    """
    from gpudeck.jobs.spec import load_user_notify
    own = getattr(jobs_file, "notify", None) or {}
    errors: Sequence[object]
    try:
        everyone, errors = load_user_notify()
    except Exception as exc:  # noqa: BLE001 - a start never fails for the notifications
        everyone, errors = {}, [f"{type(exc).__name__}: {exc}"]
    from gpudeck.jobs.notify_targets import merged
    return merged(own, everyone), (str(errors[0]) if errors else None)


# -- the child ------------------------------------------------------------------------

def _leave_run_cgroup() -> None:
    """Born in the run's cgroup (the runner is in it): move to the one above, as an on_alert hook does."""
    from gpudeck.jobs import cgroups
    here = cgroups.current_cgroup()
    if here and here.rstrip("/").rsplit("/", 1)[-1].startswith("gpudeck-"):
        cgroups.leave(here.rstrip("/").rsplit("/", 1)[0] or "/")


def main(argv: Optional[list[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m gpudeck.jobs.notify RUN_DIR (alert and targets in the environment)", file=sys.stderr)
        return 2
    run_dir = Path(args[0])
    try:
        alert = json.loads(os.environ.pop(ENV_ALERT, "{}"))
        targets = json.loads(os.environ.pop(ENV_TARGETS, "[]"))
    except ValueError as exc:
        print(f"gpudeck: notify: unreadable alert or targets: {exc}", flush=True)
        return 2
    try:
        _leave_run_cgroup()
    except Exception:  # noqa: BLE001 - staying in the run's cgroup is not worth losing the alert over
        pass
    lock = threading.Lock()

    def record(event: dict) -> None:
        with lock:
            try:
                append_jsonl(run_dir / EVENTS, {"t": round(time.time(), 3), **event})
            except OSError as exc:
                print(f"gpudeck: notify: events.jsonl: {exc}", flush=True)

    results = deliver_all(targets if isinstance(targets, list) else [], alert if isinstance(alert, dict) else {},
                          socket.gethostname(), record)
    # os._exit: a thread still stuck in a socket call must not hold the process open.
    sys.stdout.flush()
    os._exit(0 if all(results.values()) else 1)


if __name__ == "__main__":
    raise SystemExit(main())
