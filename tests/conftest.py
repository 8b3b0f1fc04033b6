"""The tests mirror the package's folders; helpers shared across folders (`fake_hub`, the tiny decoders, `run_script`)
are imported by module name, so every test folder is on the path whatever runs first."""

import sys
from pathlib import Path

for folder in sorted(path for path in Path(__file__).resolve().parent.iterdir() if path.is_dir()):
    if folder.name not in {"fixtures", "scripts", "__pycache__"} and str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
