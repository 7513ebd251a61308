"""`python -m gpudeck` runs the gpudeck CLI, as the `gpudeck` command does.

entry/ installs as the gpudeck package itself and holds only this file. It has no __init__.py on
purpose: gpudeck stays a namespace package, whose parts are jobs/, console/ and themes/ (a regular
package would run its __init__ in every runner, and import-linter takes gpudeck.jobs as a root
only under a namespace package).
"""
from gpudeck.console.cli import main

raise SystemExit(main())
