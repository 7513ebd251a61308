"""A real Prometheus for the exporter tests: started on 127.0.0.1 scraping one target every second, and queried."""
from __future__ import annotations

import json
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

from runsupport import free_port


def start_prometheus(binary: str, target: str, workdir: Path) -> tuple[subprocess.Popen, str]:
    """Prometheus scraping `target` (host:port) every second (1 s timeout); returns (process, its base URL)."""
    port = free_port()
    config = workdir / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                      "scrape_configs:\n  - job_name: gpudeck\n    scrape_interval: 1s\n"
                      f"    scrape_timeout: 1s\n    static_configs:\n      - targets: ['{target}']\n")
    proc = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                            stdout=subprocess.DEVNULL, stderr=open(workdir / "prometheus.log", "w"))
    return proc, f"http://127.0.0.1:{port}"


def prom_query(base: str, query: str) -> list[dict]:
    """The instant query's result vector ([] while Prometheus is not up yet)."""
    url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': query})}"
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            data = json.loads(reply.read())
    except OSError:
        return []
    return data["data"]["result"] if data.get("status") == "success" else []
