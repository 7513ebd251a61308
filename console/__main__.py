"""`python -m console` runs the gpudeck CLI."""
from console.cli import main

raise SystemExit(main())
