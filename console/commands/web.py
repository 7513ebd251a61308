"""`gpudeck web [--listen 127.0.0.1:8765] [--allow-actions]`: the console in a browser, through textual-serve."""
from __future__ import annotations

import argparse
import hmac
import secrets
import shlex
import sys
from pathlib import Path
from typing import Any, Optional

from gpudeck.console.errors import CliError
from gpudeck.console.listen import is_loopback, parse_listen

DEFAULT_LISTEN = "127.0.0.1:8765"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("web", help="serve the console to a browser (read-only unless --allow-actions)",
                       description="Serve the same console to a web browser through textual-serve: each "
                                   "browser tab gets its own console process. Read-only unless --allow-actions "
                                   "(the served command is `gpudeck --readonly ...`). Listens on localhost by "
                                   "default (reach it with `ssh -L 8765:127.0.0.1:8765 box`); listening on any "
                                   "other address puts a random token in the URL's path, and requests "
                                   "without it are refused. The global options (--demo, --jobs, --host, "
                                   "--theme, --refresh) go to the served console.")
    p.add_argument("--listen", metavar="HOST:PORT", default=DEFAULT_LISTEN,
                   help=f"address to listen on (default {DEFAULT_LISTEN}; [::1]:8765 for IPv6)")
    p.add_argument("--allow-actions", action="store_true",
                   help="let the browser start, stop, restart and pivot jobs (else it only watches)")
    p.add_argument("--host", metavar="NAME", dest="web_host", default=None,
                   help="the hosts.toml box the served console shows (as `gpudeck --host NAME web`); "
                        "read-only, it is reached through an agent that refuses to act")
    p.set_defaults(handler=run_web, remote_ok=True)


def served_command(args: argparse.Namespace, readonly: bool) -> str:
    """The console command each browser tab runs: this Python's gpudeck with the global options given."""
    argv = [sys.executable, "-m", "gpudeck"]
    if readonly:
        argv.append("--readonly")
    if getattr(args, "demo", False):
        argv.append("--demo")
    if getattr(args, "jobs_file", None):
        argv += ["--jobs", str(Path(args.jobs_file).expanduser().absolute())]
    for flag, value in (("--theme", getattr(args, "theme", None)), ("--host", getattr(args, "host", None))):
        if value:
            argv += [flag, value]
    refresh = getattr(args, "refresh", 1.0)
    if refresh not in (None, 1.0):
        argv += ["--refresh", f"{refresh:g}"]
    return shlex.join(argv)


def make_server(command: str, host: str, port: int, token: Optional[str]) -> Any:
    """A textual_serve Server whose every route sits under /TOKEN/ (with a token), which refuses a
    request without it, and which refuses what a foreign web page could send it: another Host name
    (DNS rebinding) and a websocket opened from another origin (a page on any site may open
    ws://127.0.0.1:8765: CORS does not cover websockets)."""
    import aiohttp_jinja2
    import jinja2
    from aiohttp import web
    from textual_serve.server import Server

    prefix = f"/{token}" if token else ""
    local_names = {"127.0.0.1", "localhost", "[::1]", f"[{host}]" if ":" in host else host}

    @web.middleware
    async def guard(request: Any, handler: Any) -> Any:
        where = request.host or ""
        if token is not None:
            first = request.path.lstrip("/").split("/", 1)[0]
            if not hmac.compare_digest(first.encode(), token.encode()):
                raise web.HTTPForbidden(text="gpudeck web: this address needs the token `gpudeck web` printed\n")
        elif (where if where.endswith("]") else where.rsplit(":", 1)[0]) not in local_names:
            raise web.HTTPForbidden(text="gpudeck web: served to localhost only\n")
        origin = request.headers.get("Origin")
        if request.path.endswith("/ws") and origin is not None and origin not in (f"http://{where}",
                                                                                 f"https://{where}"):
            raise web.HTTPForbidden(text="gpudeck web: a websocket from another site's page is refused\n")
        return await handler(request)

    class DeckServer(Server):
        def initialize_logging(self) -> None:
            import logging
            logging.basicConfig(level="WARNING", format="gpudeck web: %(message)s")

        async def on_startup(self, app: Any) -> None:
            pass                          # run_web says where it listens, in its own words

        async def handle_index(self, request: Any) -> Any:
            # The page's URLs name the address the browser used (a tunnel, a hostname), not the bind address.
            self.public_url = f"{request.scheme}://{request.host}"
            return await super().handle_index(request)

        async def _make_app(self) -> Any:
            app = web.Application(middlewares=[guard])
            aiohttp_jinja2.setup(app, loader=jinja2.FileSystemLoader(self.templates_path))
            # No download route and no static index: the console delivers no files.
            app.add_routes([
                web.get(prefix + "/", self.handle_index, name="index"),
                web.get(prefix + "/ws", self.handle_websocket, name="websocket"),
                web.static(prefix + "/static", self.statics_path, name="static"),
            ])
            return app

    return DeckServer(command, host=host, port=port, title="gpudeck")


def run_web(args: argparse.Namespace) -> int:
    from gpudeck.console.commands._host import host_spec
    from gpudeck.console.readonly import readonly_source
    host, port = parse_listen(args.listen, DEFAULT_LISTEN)
    if getattr(args, "web_host", None):
        args.host = args.web_host
    # The box is named once here, not in every browser tab: an unknown host is refused at start (exit 2).
    spec = host_spec(args)
    source = readonly_source(args)
    if source is None and spec.readonly:
        from gpudeck.jobs.hosts.config import hosts_file
        source = f"host {spec.name} has readonly = true in {hosts_file()}"
    readonly = source is not None or not args.allow_actions
    try:
        import textual_serve.server  # noqa: F401
    except ImportError as exc:
        raise CliError(f"web: needs textual-serve ({exc}): pip install 'gpudeck[web]'") from None
    token = None if is_loopback(host) else secrets.token_urlsafe(24)
    command = served_command(args, readonly)
    server = make_server(command, host, port, token)
    shown = f"[{host}]" if ":" in host else host
    if host in ("0.0.0.0", "::"):
        import socket
        shown = socket.gethostname()
    url = f"http://{shown}:{port}/" + (f"{token}/" if token else "")
    mode = (f"read-only ({source})" if source else "read-only (--allow-actions lets it act)") if readonly \
        else "actions ALLOWED: the browser can start, stop and pivot jobs"
    if not spec.local:
        mode += f"; box {spec.name}" + (" (its agent refuses to act)" if readonly else "")
    print(f"gpudeck web: {url}  {mode}", flush=True)
    if args.allow_actions and source is not None:
        print(f"gpudeck web: --allow-actions ignored: {source} keeps it read-only", flush=True)
    if token is None:
        print(f"gpudeck web: from a laptop: ssh -L {port}:127.0.0.1:{port} BOX, then open http://127.0.0.1:{port}/",
              flush=True)
    else:
        print("gpudeck web: not localhost: anyone with this URL (token included) sees the console; plain http",
              flush=True)
    try:
        server.serve()
    except OSError as exc:
        raise CliError(f"web: cannot listen on {args.listen}: {exc.strerror or exc}") from None
    return 0
