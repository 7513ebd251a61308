"""STAND-IN package named like SGLang so that `python -m sglang.launch_server` runs the stand-in (tests only)."""
