"""Run history: the SQLite run index, the runner's per-run summary, retention and post-mortem reports."""
