"""Telemetry: GPU (NVML or simulated), host (psutil), listening ports -> immutable Snapshots."""
