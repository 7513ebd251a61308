"""STAND-IN for an SGLang server, for tests only — SGLang itself cannot run on these machines.

It reproduces SGLang's documented outside behaviour: startup log lines in SGLang's
format, no HTTP port until the weights are "loaded", /health 503 while warming up,
`The server is fired up and ready to roll!` once ready, /metrics only with
--enable-metrics (404 otherwise) in SGLang's metric names, `POST /generate`, and
periodic `Decode batch.` stats lines while generating. It computes nothing.

    python tests/engines/sglang_standin.py --model-path M --port P [--enable-metrics]
        [--load-seconds S] [--accept-len L --accept-rate R]
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def log(msg: str, rank: str = " TP0") -> None:
    stamp = datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    print(f"[{stamp}{rank}] {msg}", flush=True)


class State:
    def __init__(self, args) -> None:
        self.args = args
        self.ready = False
        self.running = 0
        self.prompt_tokens = 0
        self.gen_tokens = 0
        self.lock = threading.Lock()


def make_handler(state: State):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt, *a):      # SGLang logs requests through uvicorn's format
            print(f'[{datetime.now():%Y-%m-%d %H:%M:%S}] INFO:     {self.client_address[0]}:'
                  f'{self.client_address[1]} - "{self.command} {self.path} HTTP/1.1" {a[1] if len(a) > 1 else ""}',
                  flush=True)

        def _send(self, code: int, body: str, ctype: str = "application/json") -> None:
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path in ("/health", "/health_generate"):
                return self._send(200 if state.ready else 503, "" if state.ready else "starting")
            if self.path == "/get_model_info":
                return self._send(200, json.dumps({"model_path": state.args.model_path,
                                                   "is_generation": True}))
            if self.path == "/get_server_info":
                return self._send(200, json.dumps(vars(state.args)))
            if self.path == "/metrics" and state.args.enable_metrics:
                return self._send(200, metrics_text(state), "text/plain; version=0.0.4")
            return self._send(404, json.dumps({"detail": "Not Found"}))

        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            if self.path != "/generate":
                return self._send(404, json.dumps({"detail": "Not Found"}))
            n = int((body.get("sampling_params") or {}).get("max_new_tokens", 16))
            prompt = str(body.get("text", ""))
            with state.lock:
                state.running += 1
                state.prompt_tokens += max(1, len(prompt.split()))
            for _ in range(n):
                time.sleep(0.005)
                with state.lock:
                    state.gen_tokens += 1
            with state.lock:
                state.running -= 1
            return self._send(200, json.dumps({"text": " stand-in" * n,
                                               "meta_info": {"completion_tokens": n}}))
    return Handler


def metrics_text(state: State) -> str:
    a = state.args
    lines = []

    def gauge(name, value, help_):
        lines.extend([f"# HELP sglang:{name} {help_}", f"# TYPE sglang:{name} gauge",
                      f'sglang:{name}{{model_name="{a.model_path}"}} {float(value)}'])

    def counter(name, value, help_):
        lines.extend([f"# HELP sglang:{name} {help_}", f"# TYPE sglang:{name} counter",
                      f'sglang:{name}_total{{model_name="{a.model_path}"}} {float(value)}'])
    with state.lock:
        gauge("num_running_reqs", state.running, "The number of running requests.")
        gauge("num_queue_reqs", 0, "The number of requests in the waiting queue.")
        gauge("token_usage", 0.01 * state.running, "The token usage.")
        gauge("gen_throughput", 180.0 if state.running else 0.0, "The generation throughput (token/s).")
        if a.accept_len:
            gauge("spec_accept_length", a.accept_len, "The average acceptance length.")
            gauge("spec_accept_rate", a.accept_rate, "The average acceptance rate.")
        counter("prompt_tokens", state.prompt_tokens, "Number of prefill tokens processed.")
        counter("generation_tokens", state.gen_tokens, "Number of generation tokens processed.")
    return "\n".join(lines) + "\n"


def stats_loop(state: State) -> None:
    while True:
        time.sleep(0.5)
        with state.lock:
            running = state.running
        if running:
            spec = (f"accept len: {state.args.accept_len:.2f}, accept rate: {state.args.accept_rate:.2f}, "
                    if state.args.accept_len else "")
            log(f"Decode batch. #running-req: {running}, #token: {40 * running}, token usage: 0.01, "
                f"{spec}cuda graph: True, gen throughput (token/s): 180.00, #queue-req: 0, ")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-path", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--enable-metrics", action="store_true")
    p.add_argument("--load-seconds", type=float, default=0.5)
    p.add_argument("--warmup-seconds", type=float, default=0.3)
    p.add_argument("--accept-len", type=float, default=0.0)
    p.add_argument("--accept-rate", type=float, default=0.0)
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    state = State(args)
    log(f"server_args=ServerArgs(model_path='{args.model_path}', port={args.port}, tp_size={args.tp}, "
        f"enable_metrics={args.enable_metrics})", rank="")
    log("Load weight begin. avail mem=78.50 GB")
    time.sleep(args.load_seconds)
    log("Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=60.10 GB, mem usage=18.40 GB.")
    log("KV Cache is allocated. #tokens: 400000, K size: 20.00 GB, V size: 20.00 GB")
    log("Memory pool end. avail mem=19.80 GB")
    log("Capture cuda graph begin. This can take up to several minutes. avail mem=19.70 GB")
    log("Capture cuda graph end. Time elapsed: 0.10 s. mem usage=0.40 GB. avail mem=19.30 GB.")
    server = ThreadingHTTPServer((args.host, args.port), make_handler(state))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    log(f"INFO:     Uvicorn running on http://{args.host}:{args.port} (Press CTRL+C to quit)", rank="")
    time.sleep(args.warmup_seconds)       # SGLang's own warmup: /get_model_info, then one /generate
    state.ready = True
    log("The server is fired up and ready to roll!", rank="")
    threading.Thread(target=stats_loop, args=(state,), daemon=True).start()
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    raise SystemExit(main())
