"""A spoofed gpudeck agent for the SSH tests: speaks the wire protocol, answers what a scenario file says (stdlib only).

Started on the "box" through hosts.toml's `python` (a wrapper script that ignores the
boot code). The scenario, re-read at every request so a test can change it mid-run:
{"hello": {...} (optional), "OP": [reply, reply, ...]} — each request of OP gets the
next reply (the last one repeats); "silent" never answers; {"error": "..."} answers
ok=false. Every request is appended to SCENARIO.requests as one JSON line.
"""
import json
import os
import sys


def main() -> None:
    path = sys.argv[1]
    out = sys.stdout.buffer
    counts: dict = {}

    def send(message: dict) -> None:
        out.write((json.dumps(message) + "\n").encode())
        out.flush()

    with open(path) as fh:
        scenario = json.load(fh)
    send(scenario.get("hello") or {"hello": "gpudeck-agent", "protocol": 1, "version": "0-spoofed",
                                   "via": "spoofed", "python": "3", "pid": os.getpid(), "hostname": "spoofed"})
    for line in sys.stdin.buffer:
        request = json.loads(line)
        op = request.get("op")
        with open(path + ".requests", "a") as log:
            log.write(json.dumps(request) + "\n")
        with open(path) as fh:
            scenario = json.load(fh)
        replies = scenario.get(op)
        if not replies:
            send({"id": request.get("id"), "ok": False, "error": f"unknown request {op!r}"})
            continue
        i = counts.get(op, 0)
        counts[op] = i + 1
        reply = replies[min(i, len(replies) - 1)]
        if reply == "silent":
            continue
        if isinstance(reply, dict) and set(reply) == {"error"}:
            send({"id": request.get("id"), "ok": False, "error": reply["error"]})
            continue
        send({"id": request.get("id"), "ok": True, "result": reply})


if __name__ == "__main__":
    main()
