"""The tests mirror the package's folders; helpers shared across folders (`fake_hub`, the tiny decoders, `run_script`)
are imported by module name, so every test folder is on the path whatever runs first. The hypothesis profile
(`tests/hypothesis_profiles.py`: derandomized `ci` by default, `HYPOTHESIS_PROFILE=explore` for `make test-explore`)
is loaded here, before any test module is imported. Tests that need a live Label Studio server (`review`) or headless
Chromium (`browser`) run only when the marker expression names them (`make test-review`, `make test-docs`)."""

import sys
from pathlib import Path

for folder in sorted(path for path in Path(__file__).resolve().parent.iterdir() if path.is_dir()):
    if folder.name not in {"fixtures", "scripts", "__pycache__"} and str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
if str(Path(__file__).resolve().parent) not in sys.path:  # hypothesis_profiles, whatever the import mode
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from hypothesis_profiles import load_profile  # noqa: E402

load_profile()  # before any test module builds its settings: they inherit the profile's


def pytest_collection_modifyitems(config, items):
    """Deselect (not skip) the live-server and browser tests unless the marker expression names them: the default
    suite reports them as deselected, and `make test-review` / `make test-docs` run them."""
    expression = config.getoption("markexpr") or ""
    live = [item for item in items
            if any(item.get_closest_marker(marker) and marker not in expression for marker in ("browser", "review"))]
    if live:
        config.hook.pytest_deselected(items=live)
        items[:] = [item for item in items if item not in live]
