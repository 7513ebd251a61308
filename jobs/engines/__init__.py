"""Engine-aware jobs: vLLM / SGLang profiles, readiness, serving metrics, discovery, doctor, pivot."""
