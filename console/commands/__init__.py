"""One module per CLI subcommand; each exposes `register(subparsers)` and is discovered by gpudeck.console.cli."""
