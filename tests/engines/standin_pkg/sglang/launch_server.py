"""STAND-IN for `python -m sglang.launch_server`: runs tests/engines/sglang_standin.py (tests only, not SGLang)."""
import runpy
import sys
from pathlib import Path

if __name__ == "__main__":
    # The marker argument keeps the stand-in recognisable in `ps` output.
    sys.argv = [sys.argv[0]] + [a for a in sys.argv[1:] if a != "--gpudeck-stand-in"]
    runpy.run_path(str(Path(__file__).resolve().parents[2] / "sglang_standin.py"), run_name="__main__")
