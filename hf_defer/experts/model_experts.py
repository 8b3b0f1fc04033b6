"""Experts that are models: run any predictor on a batch and read its answers as class ids.

A predictor is a transformers `Pipeline` (its outputs' `"label"`), a model with its tokenizer (the argmax of its
logits, named through `model.config.id2label`), or a plain callable that takes a list of inputs and returns one
answer per input. Answers are class names or class ids; [`answers_to_ids`] maps them through a `label2id`.

Used by [`hf_defer.experts.model_expert`] (expert labels for a dataset) and by the deferral pipeline
(`pipeline("deferral", model=..., experts={name: predictor})`, see [`answer_with_model_experts`]).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import datasets
import numpy as np

from ..modeling.pipeline_deferral import CLASSIFIER_ANSWER
from ..modeling.surrogate_routing import is_route_only
from ..modeling.validators import check_positive_int, is_int
from .simulated import check_column_name, check_dataset, require_columns

__all__ = ["answer_with_model_experts", "answers_to_ids", "as_batch_predictor", "model_expert", "predict_ids",
           "predictor_identity"]

logger = logging.getLogger(__name__)

BatchPredictor = Callable[[list[Any]], Sequence[Any]]
_DEFAULT_NAME = re.compile(r"^LABEL_(\d+)$")  # transformers' name of an unnamed class


def as_batch_predictor(predictor: Any, tokenizer: Any = None, max_length: int | None = None) -> BatchPredictor:
    """A function `list of inputs -> list of answers` for a pipeline, a model with its tokenizer, or a callable.

    Args:
        predictor: a `transformers.Pipeline`, a `PreTrainedModel` (with `tokenizer`), or a callable on a list.
        tokenizer (*optional*): the model's tokenizer; inputs are strings or `{"text": ..., "text_pair": ...}`.
        max_length (`int`, *optional*): truncation length for the tokenizer.

    Returns:
        `Callable[[list], list]`.

    Example:

    ```python
    >>> from hf_defer.experts.model_experts import as_batch_predictor, predict_ids
    >>> run = as_batch_predictor(lambda texts: ["pos" if "good" in text else "neg" for text in texts])
    >>> predict_ids(run, ["good", "bad"], {"neg": 0, "pos": 1}, expert="keyword").tolist()
    [1, 0]

    ```
    """
    from transformers import Pipeline, PreTrainedModel

    if isinstance(predictor, Pipeline):
        def run_pipeline(batch: list[Any]) -> list[Any]:
            outputs = predictor(batch, batch_size=len(batch))
            return [(out[0] if isinstance(out, list) else out)["label"] for out in outputs]

        return run_pipeline
    if isinstance(predictor, PreTrainedModel):
        if tokenizer is None:
            raise ValueError(f"a model expert ({type(predictor).__name__}) needs its tokenizer: pass `tokenizer=`.")
        import torch

        id2label = predictor.config.id2label

        def run_model(batch: list[Any]) -> list[Any]:
            pairs = all(isinstance(item, dict) for item in batch)
            texts = [item["text"] for item in batch] if pairs else batch
            extra = {"text_pair": [item.get("text_pair") for item in batch]} if pairs else {}
            encoded = tokenizer(texts, **extra, padding=True, truncation=True, max_length=max_length,
                                return_tensors="pt").to(predictor.device)
            with torch.inference_mode():
                ids = predictor(**encoded).logits.argmax(-1).tolist()
            return [id2label.get(i, i) for i in ids]

        return run_model
    if callable(predictor):
        return predictor
    raise TypeError(
        "a predictor must be a transformers Pipeline, a PreTrainedModel with its tokenizer, or a callable on a list "
        f"of inputs, got {type(predictor).__name__}."
    )


def predictor_identity(predictor: Any, tokenizer: Any = None, max_length: int | None = None) -> str | None:
    """A content hash of a predictor: the config and weights of a model or of a pipeline's model, else the code and
    state of a callable (`datasets`' hasher); None (with a warning) when it cannot be hashed."""
    # a pipeline holds its model in `.model`; a model is hashed whole (Llama-style classifiers keep their backbone,
    # not their head, in `.model`)
    model = predictor if hasattr(predictor, "state_dict") else getattr(predictor, "model", predictor)
    tokenizer_name = getattr(tokenizer, "name_or_path", None)
    digest = hashlib.sha256(f"{type(predictor).__qualname__}:{tokenizer_name}:{max_length}".encode())
    if hasattr(model, "state_dict") and hasattr(model, "config"):
        import torch

        digest.update(model.config.to_json_string().encode())
        for name, tensor in sorted(model.state_dict().items()):
            data = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
            digest.update(name.encode() + data.tobytes())
        return digest.hexdigest()
    try:
        from datasets.fingerprint import Hasher

        digest.update(Hasher.hash(predictor).encode())
    except Exception as err:  # e.g. a closure over an unpicklable object
        logger.warning("Cannot hash the predictor (%s); pass `predictor_id` to cache its answers.", err)
        return None
    return digest.hexdigest()


def answers_to_ids(
    answers: Sequence[Any], label2id: Mapping[str, int], expert: str, rows: Sequence[int] | None = None,
    label_map: Mapping[Any, Any] | None = None,
) -> np.ndarray:
    """Class ids of answers: `label_map` first, then a class name of `label2id`, a class id, or `"LABEL_<id>"`.

    Raises:
        ValueError: an answer that is none of these, naming the expert, its row (`rows[position]`, or the position)
            and the label set.
    """
    num_labels = len(label2id)
    ids = np.empty(len(answers), dtype=np.int64)
    for position, answer in enumerate(answers):
        value = label_map.get(answer, answer) if label_map else answer
        if isinstance(value, str) and value in label2id:
            ids[position] = label2id[value]
            continue
        if isinstance(value, str) and (match := _DEFAULT_NAME.match(value)):
            value = int(match.group(1))
        if is_int(value) and 0 <= value < num_labels:
            ids[position] = int(value)
            continue
        raise ValueError(
            f"expert {expert!r} answered {answer!r} for row {position if rows is None else rows[position]}, which is "
            "not a label: expected "
            f"one of {sorted(label2id, key=label2id.get)} or a class id 0..{num_labels - 1} (map other answers with "
            "`label_map`)."
        )
    return ids


def predict_ids(
    predictor: BatchPredictor, inputs: Sequence[Any], label2id: Mapping[str, int], expert: str,
    rows: Sequence[int] | None = None, label_map: Mapping[Any, Any] | None = None,
) -> np.ndarray:
    """Run `predictor` on one batch and return class ids, with an error naming the expert and the first bad row
    (`rows` are the batch's row numbers) when it raises, returns the wrong number of answers or answers outside the
    label set."""
    return answers_to_ids(_answers(predictor, inputs, expert, rows), label2id, expert, rows, label_map)


def _answers(predictor: BatchPredictor, inputs: Sequence[Any], expert: str, rows: Sequence[int] | None) -> list[Any]:
    """`predictor` on one batch: one answer per input, or an error naming the expert and the batch's first row."""
    batch = list(inputs)
    rows = list(range(len(batch))) if rows is None else list(rows)
    try:
        answers = predictor(batch)
    except Exception as err:
        raise RuntimeError(
            f"expert {expert!r} failed on the batch starting at row {rows[0] if rows else None}: "
            f"{type(err).__name__}: {err}"
        ) from err
    return one_answer_per_input(answers, len(batch), expert, rows)


def one_answer_per_input(answers: Any, count: int, expert: str, rows: Sequence[int]) -> list[Any]:
    """An expert's answers as a list, or an error naming the expert, the batch's first row and both counts: one
    answer for several inputs is refused, never broadcast."""
    if hasattr(answers, "tolist"):
        answers = answers.tolist()
    if isinstance(answers, (str, bytes)) or not hasattr(answers, "__len__") or len(answers) != count:
        got = len(answers) if hasattr(answers, "__len__") and not isinstance(answers, str) else type(answers).__name__
        raise ValueError(
            f"expert {expert!r} must return one answer per input: the batch starting at row "
            f"{rows[0] if rows else None} has "
            f"{count} inputs, the expert returned {got}."
        )
    return list(answers)


def answer_with_model_experts(
    outputs: list[dict[str, Any]], inputs: list[Any], experts: Mapping[str, Any], config: Any,
    expert_costs: Sequence[float], batch_size: int = 32,
) -> list[dict[str, Any]]:
    """Let model experts answer the inputs the deferral pipeline routed to them (in place, and returned).

    Each output gains `answered_by` (`"classifier"`, the model expert's name, or `None` while a person has not
    answered) and `cost` (0 when the classifier answers, else the cost of the chosen expert). `experts` maps names
    to predictors ([`as_batch_predictor`]; a `(model, tokenizer)` tuple for a model). An input routed to
    a model expert gets that expert's answer as `label`; each predictor is called once per `batch_size` of the
    inputs routed to it, and never when none is.
    """
    experts = {name: as_batch_predictor(*p) if isinstance(p, tuple) else as_batch_predictor(p)
               for name, p in experts.items()}
    costs = dict(zip(config.expert_names, expert_costs))
    route_only = is_route_only(config)  # every input goes to an expert, the default included
    for out in outputs:
        out["answered_by"] = None if out["defer"] or route_only else CLASSIFIER_ANSWER
        out["cost"] = costs[out["expert"]] if out["defer"] or route_only else 0.0
    for name, predictor in experts.items():
        rows = [i for i, out in enumerate(outputs) if (out["defer"] or route_only) and out["expert"] == name]
        for start in range(0, len(rows), batch_size):
            chunk = rows[start : start + batch_size]
            if route_only:  # no classes to map to: the expert's own answer, as it gives it
                for i, answer in zip(chunk, _answers(predictor, [inputs[i] for i in chunk], name, chunk)):
                    outputs[i]["answer"], outputs[i]["answered_by"] = answer, name
                continue
            ids = predict_ids(predictor, [inputs[i] for i in chunk], config.label2id, name, rows=chunk)
            for i, class_id in zip(chunk, ids):
                outputs[i]["label"] = config.id2label[int(class_id)]
                outputs[i]["answered_by"] = name
    return outputs


def model_expert(
    dataset: datasets.Dataset,
    predictor: Any,
    tokenizer: Any = None,
    input_column: str = "text",
    column: str = "expert_labels",
    label_column: str = "labels",
    label_map: Mapping[Any, Any] | None = None,
    batch_size: int = 32,
    max_length: int | None = None,
    name: str | None = None,
    predictor_id: str | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> datasets.Dataset:
    """Add the answers of a model as an expert column: a transformers pipeline, a model with its tokenizer, or a
    callable that takes a list of inputs and returns one answer per input.

    **Out-of-sample answers on training rows.** A deferral model learns from the training rows where the expert is
    right. If the expert is a model that was trained on those rows, it is right there far more often than on new
    inputs, and the deferral model learns to trust an expert that memorised its training data. Use a model trained
    on other rows, or cross-fit (train K models, each answering the fold it did not see; see
    `research.hatespeech_cascade.costly_predictions`).

    Answers (class names or ids) are mapped through the label set of `dataset[label_column]` (a `ClassLabel`):
    `label_map` first, then a class name, a class id, or transformers' `"LABEL_<id>"`. The predictor runs on batches
    of `input_column` with a progress bar, and the answers are cached: a second call with the same data (its
    `datasets` fingerprint) and the same predictor (`predictor_id`, else a hash of its weights or code) reads them
    from `cache_dir` instead of calling the predictor.

    Args:
        dataset (`datasets.Dataset`): the examples, with `input_column` and a `ClassLabel` column `label_column`.
        predictor: a `transformers.Pipeline`, a `PreTrainedModel` (with `tokenizer`), or a callable on a list.
        tokenizer (*optional*): the model's tokenizer.
        input_column (`str`, *optional*, defaults to `"text"`): what the predictor reads.
        column (`str`, *optional*, defaults to `"expert_labels"`): the int64 column added (replaced if present).
        label_column (`str`, *optional*, defaults to `"labels"`): the `ClassLabel` column that names the classes.
        label_map (`Mapping`, *optional*): the predictor's answers to the dataset's class names or ids.
        batch_size (`int`, *optional*, defaults to 32): inputs per predictor call.
        max_length (`int`, *optional*): tokenizer truncation for a model.
        name (`str`, *optional*): the expert's name in messages; defaults to `column`.
        predictor_id (`str`, *optional*): an identity of the predictor for the cache key (e.g. a model id and
            revision); by default a hash of its weights (model, pipeline) or of its code (callable).
        cache_dir (`str` or `os.PathLike`, *optional*): where answers are cached; defaults to
            `$HF_DEFER_CACHE/expert_labels` or `~/.cache/hf_defer/expert_labels`.

    Returns:
        `datasets.Dataset`: `dataset` with `column` holding the expert's class ids.

    Raises:
        ValueError: no `ClassLabel` column, a missing input column, answers outside the label set or a wrong number
            of answers (naming the expert and the first bad row).
        RuntimeError: the predictor raised (naming the expert and the first row of the batch).

    Example:

    ```python
    >>> import datasets, tempfile
    >>> from hf_defer.experts import model_expert
    >>> ds = datasets.Dataset.from_dict({"text": ["great", "awful"], "labels": [1, 0]},
    ...     features=datasets.Features({"text": datasets.Value("string"),
    ...                                 "labels": datasets.ClassLabel(names=["neg", "pos"])}))
    >>> keyword = lambda texts: ["pos" if "great" in text else "neg" for text in texts]
    >>> model_expert(ds, keyword, cache_dir=tempfile.mkdtemp())["expert_labels"][:]
    [1, 0]

    ```
    """
    from .embeddings import default_embedding_cache_dir

    dataset = check_dataset(dataset)
    column, name = check_column_name(column, "column"), name or column
    require_columns(dataset, [check_column_name(input_column, "input_column")], "input_column")
    classes = dataset.features.get(label_column)
    if not isinstance(classes, datasets.ClassLabel):
        raise ValueError(
            f"`label_column` {label_column!r} must be a ClassLabel column naming the classes, got "
            f"{type(classes).__name__ if classes is not None else 'no such column'}; cast it with "
            "dataset.cast_column(label_column, datasets.ClassLabel(names=[...]))."
        )
    check_positive_int(batch_size, "batch_size")
    run = as_batch_predictor(predictor, tokenizer, max_length)
    label2id = {label: index for index, label in enumerate(classes.names)}
    identity = predictor_id if predictor_id is not None else predictor_identity(predictor, tokenizer, max_length)
    cache_file = None
    fingerprint = None
    if identity is not None:
        mapping = sorted(map(repr, (label_map or {}).items()))
        key = f"{dataset._fingerprint}:{identity}:{input_column}:{column}:{classes.names}:{mapping}"
        fingerprint = hashlib.sha256(key.encode()).hexdigest()[:32]
        root = Path(cache_dir).expanduser() if cache_dir else default_embedding_cache_dir().parent / "expert_labels"
        root.mkdir(parents=True, exist_ok=True)
        cache_file = str(root / f"{fingerprint}.arrow")
    features = dataset.features.copy()
    features[column] = datasets.Value("int64")

    def answer(batch: dict[str, list], rows: list[int]) -> dict[str, Any]:
        return {column: predict_ids(run, batch[input_column], label2id, name, rows, label_map)}

    return dataset.map(answer, batched=True, batch_size=batch_size, with_indices=True, features=features,
                       new_fingerprint=fingerprint, cache_file_name=cache_file, load_from_cache_file=True,
                       desc=f"expert {name!r}")
