"""`python -m gpudeck.console` runs the gpudeck CLI."""
from gpudeck.console.cli import main

raise SystemExit(main())
