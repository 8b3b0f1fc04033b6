"""Sharing deferral models on the Hugging Face Hub, for library mode and remote-code mode alike.

[`EncoderForDeferral.save_pretrained`] alone writes what a folder needs: ``model.safetensors`` (never a pickle),
``config.json`` with ``auto_map`` and ``custom_pipelines``, and the code that remote loading runs
(``configuration_deferral.py``, ``modeling_deferral.py``, ``saving_deferral.py``, ``surrogates.py``,
``surrogate_base.py``, ``surrogate_routing.py``, ``side_features.py``, ``pipeline_deferral.py``, ``availability.py``,
``cascade_folder.py``, ``device.py``, ``guarantee_record.py``, ``guarantee_warnings.py``, ``validators.py`` and
``library_mode.py``), so that ``pipeline(model=folder, trust_remote_code=True)`` and
``AutoModel.from_pretrained(folder, trust_remote_code=True)`` work without hf_defer; with hf_defer imported,
``pipeline("deferral", model=folder)`` uses the installed library. [`save_for_hub`] adds the tokenizer or image
processor and the deferral model card; [`push_to_hub`] uploads such a folder.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from ..inspection.adapters import check_adapter_loadable, has_adapters
from ..inspection.model_checks import check_deferral_model
from ..modeling.saving_deferral import move_saved_files


def save_for_hub(
    model: Any,
    save_directory: str | os.PathLike,
    processing_class: Any = None,
    card_data: Any = None,
    overwrite: bool = False,
) -> list[str]:
    """Saves a deferral model ready to upload: [`EncoderForDeferral.save_pretrained`], plus the tokenizer or image
    processor if given and the deferral model card: rendered from ``card_data``, or, without it, built from the
    model's config ([`DeferralModelCardData.from_model`]: classes, experts, threshold, costs, guarantee; no metrics),
    so that the card in the folder always describes the config next to it.

    Everything is written to a temporary folder first. Unless ``overwrite=True``, no file already in
    ``save_directory`` is replaced (files with the same content excepted) and no stale weight shard deleted: a
    `FileExistsError` lists them and nothing is written.
    A model with PEFT adapters ([`hf_defer.inspection.adapters`]) writes its adapter and head only, in peft's format.

    Args:
        model ([`EncoderForDeferral`]): the model.
        save_directory (`str` or `os.PathLike`): where to write; created if missing.
        processing_class (*optional*): tokenizer or image processor, saved next to the model.
        card_data ([`DeferralModelCardData`], *optional*): renders ``README.md`` and the reliability diagram;
            defaults to the card data of the model's config, named after the folder.
        overwrite (`bool`, *optional*, defaults to `False`): replace the files already in ``save_directory``.

    Returns:
        `list[str]`: the names of the files in ``save_directory``.

    Raises:
        `ValueError`: ``model`` is not a deferral model.
        `FileExistsError`: a file in ``save_directory`` would be replaced or deleted and ``overwrite`` is `False`.

    Example:

    ```python
    >>> import tempfile
    >>> import hf_defer
    >>> model = hf_defer.EncoderForDeferral(hf_defer.DeferralConfig(feature_size=4, num_labels=2))
    >>> files = hf_defer.save_for_hub(model, tempfile.mkdtemp())
    >>> sorted(f for f in files if f.endswith(".py"))
    ['availability.py', 'cascade_folder.py', 'configuration_deferral.py', 'device.py', 'guarantee_record.py', 'guarantee_warnings.py', 'library_mode.py', 'modeling_deferral.py', 'pipeline_deferral.py', 'saving_deferral.py', 'side_features.py', 'surrogate_base.py', 'surrogate_routing.py', 'surrogates.py', 'validators.py']

    ```
    """
    check_deferral_model(model)
    check_adapter_loadable(model)  # an adapter on a base built in memory would be saved, then fail to load
    if not isinstance(save_directory, (str, os.PathLike)):
        raise TypeError(f"save_directory must be a str or os.PathLike, got {type(save_directory).__name__}.")
    folder = Path(save_directory)
    if folder.is_file():
        raise ValueError(f"save_directory must be a directory, got the file {str(folder)!r}.")
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".hf_defer_save_", dir=folder) as stage:
        model.save_pretrained(stage)
        if has_adapters(model):  # peft's generic card: the deferral card (or the repository's own) is kept instead
            (Path(stage) / "README.md").unlink(missing_ok=True)
        if processing_class is not None:
            processing_class.save_pretrained(stage)
        from .model_card import DeferralModelCardData, render_model_card

        if card_data is None:  # the card of the config in this folder
            card_data = DeferralModelCardData.from_model(model, model_name=folder.resolve().name or "deferral-model")
        render_model_card(card_data, stage)
        move_saved_files(stage, folder, overwrite)
    return sorted(name for name in os.listdir(folder) if not name.startswith(".hf_defer_save_"))


def push_to_hub(
    model: Any,
    repo_id: str,
    processing_class: Any = None,
    card_data: Any = None,
    private: bool | None = None,
    token: str | None = None,
    commit_message: str | None = None,
    commit_description: str | None = None,
    revision: str | None = None,
    create_pr: bool = False,
) -> Any:
    """Uploads a deferral model with its code and deferral model card to the Hub (outside [`DeferralTrainer`]).

    Everything [`save_for_hub`] writes goes up in one commit (from a temporary folder, removed afterwards).
    `model.push_to_hub(...)` and `pipeline("deferral", ...).push_to_hub(...)` call this function. Without
    ``card_data`` a model card that is already in the repository is kept, as `transformers` does; a new repository
    gets the card built from the model's configuration ([`DeferralModelCardData.from_model`]). Pass card data with metrics for a full card.

    Args:
        model ([`EncoderForDeferral`]): the model.
        repo_id (`str`): the Hub repository, `"user/name"`; created if missing.
        processing_class (*optional*): tokenizer or image processor.
        card_data ([`DeferralModelCardData`], *optional*): the card's content; replaces the repository's card.
        private (`bool`, *optional*): visibility of a newly created repository.
        token (`str`, *optional*): a Hub token with write access.
        commit_message (`str`, *optional*, defaults to `"Upload deferral model"`): the commit message.
        commit_description (`str`, *optional*): the commit description.
        revision (`str`, *optional*): the branch to push to.
        create_pr (`bool`, *optional*, defaults to `False`): open a pull request instead of committing.

    Returns:
        The `huggingface_hub.CommitInfo` of the upload.

    Example:

    ```python
    >>> import hf_defer
    >>> model = hf_defer.EncoderForDeferral(hf_defer.DeferralConfig(feature_size=4, num_labels=2))
    >>> hf_defer.push_to_hub(model, "me/tiny-defer")  # doctest: +SKIP
    ```
    """
    from huggingface_hub import HfApi
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    from .model_card import DeferralModelCardData

    if not isinstance(repo_id, str) or not repo_id:
        raise TypeError(f"repo_id must be a non-empty str such as 'user/name', got {repo_id!r}.")
    try:
        validate_repo_id(repo_id)
    except HFValidationError as error:
        raise ValueError(f"repo_id must be a Hub repository id such as 'user/name', got {repo_id!r}: {error}") from None
    check_deferral_model(model)
    check_adapter_loadable(model)  # before the repository is created
    api = HfApi(token=token)
    repo_id = api.create_repo(repo_id, private=private, exist_ok=True).repo_id
    keep_card = card_data is None and api.file_exists(repo_id, "README.md", revision=revision)
    if card_data is None and not keep_card:
        card_data = DeferralModelCardData.from_model(model, model_name=repo_id.split("/")[-1], repo_id=repo_id)
    with tempfile.TemporaryDirectory() as folder:
        save_for_hub(model, folder, processing_class, card_data)
        if keep_card:  # the repository's own card stays
            (Path(folder) / "README.md").unlink(missing_ok=True)
        return api.upload_folder(repo_id=repo_id, folder_path=folder, commit_message=commit_message
                                 or "Upload deferral model", commit_description=commit_description,
                                 revision=revision, create_pr=create_pr)


__all__ = ["push_to_hub", "save_for_hub"]
