"""`python -m hf_defer train|predict|evaluate ...`: the `hf-defer` command."""

from .commands.cli import main

raise SystemExit(main())
