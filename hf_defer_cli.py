"""Launcher of the `hf-defer` console command.

`import hf_defer` loads torch and transformers and registers the deferral model type (seconds); `hf-defer --help`,
`hf-defer --version` and a mistyped command should not wait for that. This launcher runs the command module,
`hf_defer/commands/cli.py` (standard library only at import), under its own name without importing the `hf_defer`
package first; a command imports the package when it runs. `python -m hf_defer` runs the same `main` after a normal
import.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

_MODULE = "hf_defer.commands.cli"


def main() -> int:
    """Runs `hf_defer.commands.cli.main` on `sys.argv[1:]` and returns its exit status."""
    return command_module().main()


def command_module() -> Any:
    """`hf_defer.commands.cli`, run from its file without importing the `hf_defer` package (`scripts/run_deferral.py`
    uses it too, so that its mistakes are answered before torch is imported)."""
    module = sys.modules.get(_MODULE)
    if module is None:
        package = importlib.util.find_spec("hf_defer")  # finds the package without running its __init__
        if package is None or not package.submodule_search_locations:
            raise SystemExit("hf-defer: the hf_defer package is not installed in this Python environment.")
        path = Path(next(iter(package.submodule_search_locations))) / "commands" / "cli.py"
        spec = importlib.util.spec_from_file_location(_MODULE, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[_MODULE] = module  # a later `import hf_defer.commands.cli` finds this one
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[_MODULE]
            raise
    return module


if __name__ == "__main__":
    raise SystemExit(main())
