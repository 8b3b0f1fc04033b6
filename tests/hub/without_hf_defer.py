"""The start of a script run in a fresh interpreter where hf_defer cannot be imported (any `import hf_defer...` raises
`ModuleNotFoundError`), so that a saved folder's remote code is shown to load on its own (`trust_remote_code=True`)."""

BLOCK_HF_DEFER = r"""
import json, sys

class BlockHfDefer:
    def find_spec(self, name, path=None, target=None):
        if name == "hf_defer" or name.startswith("hf_defer."):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked for this test)")

sys.meta_path.insert(0, BlockHfDefer())
"""
