"""Saving, sharing and loading a deferral model's folder: the `save_pretrained`, `push_to_hub` and `from_pretrained`
of [`EncoderForDeferral`] (a mixin), and `move_saved_files`, which never loses a file of the folder silently.

Like ``modeling_deferral.py``, this module imports only ``transformers``, the standard library and, relatively,
``.pipeline_deferral``: it is copied next to the weights for remote-code loading (``trust_remote_code=True``).
"""

from __future__ import annotations

import filecmp
import inspect
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel
from transformers.dynamic_module_utils import custom_object_save

from .library_mode import library_function
from .pipeline_deferral import CUSTOM_PIPELINES, REMOTE_TASK

WEIGHTS_FILE = re.compile(r"(adapter_)?model(-\d{5}-of-\d{5})?\.safetensors|model\.safetensors\.index\.json")
STANDARD_CONFIGS = ("config.json", "adapter_config.json")  # with the weights, what save_pretrained always replaces


def move_saved_files(stage: str | os.PathLike, folder: str | os.PathLike, overwrite: bool = False,
                     replace_standard: bool = False) -> list[str]:
    """Moves the files saved into ``stage`` into ``folder``, never losing a file the caller did not mean to replace.

    A file of ``folder`` is replaced only when it has the same content (hf_defer's own code, or a second save of the
    same model: nothing is lost), when it is ``config.json``, ``adapter_config.json`` or a weight file with
    ``replace_standard=True`` (what `PreTrainedModel.save_pretrained` always replaces), or with ``overwrite=True``;
    weight files (``model-00001-of-00002.safetensors``, the index) that the new save lacks would be stale: they are
    deleted with ``overwrite=True`` only. Otherwise a `FileExistsError` lists the files and nothing moves. Returns the
    names of the files moved.
    """
    stage, folder = Path(stage), Path(folder)
    staged = sorted(path.name for path in stage.iterdir())
    standard = {name for name in staged if replace_standard and (name in STANDARD_CONFIGS or WEIGHTS_FILE.fullmatch(name))}
    clash = [name for name in staged if (folder / name).exists() and name not in standard
             and not ((folder / name).is_file() and filecmp.cmp(stage / name, folder / name, shallow=False))]
    stale = [name for name in sorted(os.listdir(folder)) if name not in staged and WEIGHTS_FILE.fullmatch(name)]
    if (clash or stale) and not overwrite:
        raise FileExistsError(
            f"{str(folder)!r} holds files that saving would overwrite ({clash}) or delete as stale weights ({stale}); "
            "pass overwrite=True to replace them, or save into another folder."
        )
    for name in stale:
        (folder / name).unlink()
    for name in staged:
        os.replace(stage / name, folder / name)
    return staged


@contextmanager
def _code_of_the_deferral_class(model: PreTrainedModel, stage: str, is_main_process: bool) -> Iterator[None]:
    """FSDP2 (`fully_shard`) swaps a model's class for a subclass it makes at run time (`FSDPEncoderForDeferral`, in
    a module of torch); `save_pretrained` would copy that module's files and name that class in `auto_map`. Within
    this context the folder gets the code of the deferral class the model was built as, and its `auto_map` entry."""
    wrapper = type(model)
    saved = next(cls for cls in wrapper.__mro__ if issubclass(cls, DeferralSavingMixin)
                 and getattr(sys.modules.get(cls.__module__), cls.__name__, None) is cls)
    if saved is wrapper or not model.is_remote_code():
        yield
        return
    if is_main_process:  # before transformers writes config.json, as it does itself
        custom_object_save(object.__new__(saved), stage, config=model.config)
    own = wrapper.__dict__.get("_auto_class", _MISSING)
    wrapper._auto_class = None  # transformers copies no code for this class
    try:
        yield
    finally:
        if own is _MISSING:
            del wrapper._auto_class
        else:
            wrapper._auto_class = own


_MISSING = object()


class DeferralSavingMixin:
    """The saving and loading of the deferral models ([`EncoderForDeferral`], [`EncoderForRouting`]), and
    `add_adapter` (what it saves: adapters only): the first base of [`DeferralPreTrainedModel`], before
    `PreTrainedModel`, so that ``super()`` here is `PreTrainedModel`'s."""

    def save_pretrained(self, save_directory: str | os.PathLike, *args: Any, overwrite: bool = False,
                        **kwargs: Any) -> None:
        """Writes everything a folder needs, for library mode and remote-code mode alike: the weights (safetensors),
        `config.json` with `auto_map` and `custom_pipelines`, and the code files `configuration_deferral.py`,
        `modeling_deferral.py`, `saving_deferral.py`, `surrogates.py`, `surrogate_base.py`, `surrogate_routing.py`,
        `side_features.py`, `pipeline_deferral.py`, `availability.py`, `cascade_folder.py`, `device.py`,
        `guarantee_record.py`, `guarantee_warnings.py`, `validators.py` and `library_mode.py`. The Trainer, the
        pipeline, `save_for_hub` and `push_to_hub` all save through it. The files go to a temporary folder first, then
        move in.

        A file of the folder is never lost silently: `config.json` and the weights are replaced (as transformers
        always does), a code file only when it is the same as hf_defer's; stale weight shards are deleted and other
        files overwritten only with `overwrite=True` (otherwise a `FileExistsError` lists them and nothing changes).

        Args:
            save_directory (`str` or `os.PathLike`): the folder; created if missing.
            overwrite (`bool`, *optional*, defaults to `False`): replace any file in the way.
            args, kwargs: as for [`PreTrainedModel.save_pretrained`]; with `push_to_hub=True`, the upload goes through
                [`EncoderForDeferral.push_to_hub`] (deferral card) and `repo_id` (defaults to the folder's name),
                `commit_message`, `create_pr`, `private` and `token` go to it.
        """
        push = kwargs.pop("push_to_hub", False)
        upload = {key: kwargs.pop(key) for key in ("repo_id", "commit_message", "create_pr", "private") if key in kwargs}
        folder = Path(save_directory)
        if folder.is_file():
            raise ValueError(f"save_directory must be a directory, got the file {str(folder)!r}.")
        folder.mkdir(parents=True, exist_ok=True)
        is_main_process = args[0] if args else kwargs.get("is_main_process", True)
        config = self.config
        previous = config.__dict__.get("custom_pipelines")
        others = {task: spec for task, spec in (previous or {}).items()  # an older entry of ours goes
                  if spec.get("impl") != CUSTOM_PIPELINES[REMOTE_TASK]["impl"]}
        config.custom_pipelines = {**others, **CUSTOM_PIPELINES}
        try:
            with tempfile.TemporaryDirectory(prefix=".hf_defer_save_", dir=folder) as stage, \
                    _code_of_the_deferral_class(self, stage, is_main_process):
                super().save_pretrained(stage, *args, **kwargs)
                if is_main_process:
                    move_saved_files(stage, folder, overwrite, replace_standard=True)
        finally:
            if previous is None:
                del config.custom_pipelines
            else:
                config.custom_pipelines = previous
        if push and is_main_process:
            repo_id = upload.pop("repo_id", folder.resolve().name)
            self.push_to_hub(repo_id, token=kwargs.get("token"), **upload)

    def push_to_hub(self, repo_id: str, **kwargs: Any) -> Any:
        """Uploads the model with the deferral model card and the code for `trust_remote_code` loading, instead of
        `transformers`' generic card: [`hf_defer.push_to_hub`]`(self, repo_id, **kwargs)`, whose keyword arguments
        (`processing_class`, `card_data`, `commit_message`, `commit_description`, `private`, `token`, `revision`,
        `create_pr`) it takes. Needs hf_defer installed.

        Example:

        ```python
        >>> import hf_defer
        >>> model = hf_defer.EncoderForDeferral(hf_defer.DeferralConfig(feature_size=4, num_labels=2))
        >>> model.push_to_hub("me/tiny-defer")  # doctest: +SKIP
        ```
        """
        push_to_hub = library_function("hub.sharing", "push_to_hub")  # a saved folder's copy: None
        if push_to_hub is None:  # loaded with trust_remote_code: the deferral card needs hf_defer's own classes
            raise ImportError(
                "push_to_hub of a deferral model needs hf_defer (pip install hf-defer) to write the deferral card "
                "and the code for remote loading: `import hf_defer` and load the folder with "
                "hf_defer.AutoModelForDeferral.from_pretrained(...) instead of trust_remote_code=True."
            )
        unsupported = sorted(set(kwargs) - set(inspect.signature(push_to_hub).parameters))
        if unsupported:
            raise TypeError(f"push_to_hub() of a deferral model got unsupported arguments {unsupported}.")
        return push_to_hub(self, repo_id, **kwargs)

    @classmethod
    def from_pretrained(cls, *args: Any, **kwargs: Any) -> PreTrainedModel | tuple[PreTrainedModel, dict]:
        """[`PreTrainedModel.from_pretrained`], then re-freezes the encoder when `config.freeze_encoder` is set
        (loading replaces the parameters built in `__init__`, and with them their `requires_grad`). A weights file
        that cannot be read (truncated, corrupt) raises an `OSError` naming it."""
        try:
            loaded = super().from_pretrained(*args, **kwargs)
        except Exception as err:  # safetensors' SafetensorError names no file
            if type(err).__name__ != "SafetensorError":
                raise
            source = str(args[0] if args else kwargs.get("pretrained_model_name_or_path"))
            files = sorted(str(path) for path in Path(source).glob("*.safetensors")) or [source]
            raise OSError(f"could not read the weights in {', '.join(files)}: {err}. The file is truncated or corrupt; "
                          "save or download it again.") from err
        model = loaded[0] if isinstance(loaded, tuple) else loaded
        if model.config.freeze_encoder:
            model.freeze_encoder()
        return loaded

    def add_adapter(self, adapter_config: Any, adapter_name: str | None = None) -> None:
        """transformers' `add_adapter` (a PEFT adapter injected into the model itself), refused up front when the
        installed peft is older than the one this transformers demands for it (transformers 5.24 asks for
        peft >= 0.22): the `ValueError` names both versions and `peft.get_peft_model`, which works with both."""
        from transformers.integrations import peft as transformers_peft
        from transformers.utils.import_utils import is_peft_available, is_peft_greater_or_equal

        needed = getattr(transformers_peft, "MIN_PEFT_VERSION", None)
        if needed is not None and is_peft_available() and not is_peft_greater_or_equal(needed):
            import importlib.metadata

            import transformers

            raise ValueError(
                f"model.add_adapter needs peft >= {needed} with transformers {transformers.__version__}, but peft "
                f"{importlib.metadata.version('peft')} is installed. Use peft.get_peft_model(model, config) instead "
                "(the same LoraConfig, with modules_to_save=['head']): it works with both versions. Or install "
                f"peft >= {needed}."
            )
        return super().add_adapter(adapter_config, adapter_name)


__all__ = ["DeferralSavingMixin", "move_saved_files"]
