"""STAND-IN engine for GPU pivot tests (not vLLM): a torch process that holds GPU memory and answers /health.

    python tests/gpu/torch_engine_standin.py --port P --gib G [--hold-after-term S]

Allocates G GiB on the visible GPU, then logs vLLM's readiness line and serves
/health on P. On SIGTERM it keeps the memory for S more seconds before exiting
(an engine slow to tear down).
"""
import argparse
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import torch

ap = argparse.ArgumentParser()
ap.add_argument("--port", type=int, required=True)
ap.add_argument("--gib", type=float, default=2.0)
ap.add_argument("--hold-after-term", type=float, default=0.0)
args = ap.parse_args()

block = torch.empty(int(args.gib * 2**30), dtype=torch.uint8, device="cuda")
block.fill_(1)
torch.cuda.synchronize()
free, total = torch.cuda.mem_get_info()
print(f"stand-in holds {args.gib} GiB; GPU free at start {free / 2**30:.1f} of {total / 2**30:.1f} GiB", flush=True)


def on_term(*_):
    def later():
        time.sleep(args.hold_after_term)
        sys.stdout.flush()
        import os
        os._exit(0)
    threading.Thread(target=later, daemon=True).start()


signal.signal(signal.SIGTERM, on_term)


class Health(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *a):
        pass


server = HTTPServer(("127.0.0.1", args.port), Health)
print("INFO:     Application startup complete.", flush=True)
server.serve_forever()
