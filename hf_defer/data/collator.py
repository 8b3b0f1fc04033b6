"""The batch collator for learning to defer: [`DataCollatorForDeferral`] pads tokenized text (or stacks precomputed
feature vectors / pixel values) and keeps `labels` and `expert_labels` as integer tensors (or `expert_correct` as a
float tensor), ready for `EncoderForDeferral` and `DeferralTrainer`. Also importable from `hf_defer.data`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from transformers import DataCollatorWithPadding, PreTrainedTokenizerBase
from transformers.utils import PaddingStrategy

__all__ = ["DataCollatorForDeferral"]

_PASSTHROUGH_FLOAT_KEYS = ("features", "pixel_values", "side_numeric")
_LABEL_ALIASES = ("label", "label_ids")


def _is_string_value(value: Any) -> bool:
    if isinstance(value, str):
        return True
    if isinstance(value, (list, tuple)) and value and all(isinstance(item, str) for item in value):
        return True
    return False


@dataclass
class DataCollatorForDeferral:
    """Collate examples for a deferral model: pad the text inputs and keep the class and expert labels.

    The text inputs are padded by `transformers.DataCollatorWithPadding`, which alone would fail on a string column
    and on head-only rows; around it, three differences: `expert_labels` is collated next to
    `labels` (a long tensor `[B]` for one expert, `[B, M]` for M experts; -100 where an expert did not answer), or
    `expert_correct` (float32 `[B]` / `[B, M]`: whether each expert was right, or its score; -100 where there is
    none) in its place; without a tokenizer it stacks the
    precomputed `features` vectors (float `[B, D]`) for head-only models; and string columns such as `text` are
    dropped instead of breaking the tensor conversion. `pixel_values` are stacked as float tensors, and a model's side
    features (`hf_defer.prepare_deferral_dataset(..., side_feature_columns=...)`) as `side_numeric` (float32
    `[B, n]`) and `side_categorical` (category ids, long `[B, n]`). Any other
    column is passed to `tokenizer.pad` (or, without a tokenizer, stacked as is). A `label` or `label_ids` key is
    renamed to `labels`.

    Args:
        tokenizer (`PreTrainedTokenizerBase`, *optional*):
            Tokenizer used to pad `input_ids`, `attention_mask`, `token_type_ids`. Leave None for feature vectors
            or images.
        padding (`bool`, `str` or `PaddingStrategy`, *optional*, defaults to True):
            Padding strategy passed to `tokenizer.pad` (`True`/`"longest"`, `"max_length"`, `False`).
        max_length (`int`, *optional*):
            Maximum length for `tokenizer.pad`.
        pad_to_multiple_of (`int`, *optional*):
            Pad the sequence length to a multiple of this value.
        return_tensors (`str`, *optional*, defaults to `"pt"`):
            `"pt"` for torch tensors or `"np"` for numpy arrays.

    Example:

    ```python
    >>> from hf_defer import DataCollatorForDeferral
    >>> collator = DataCollatorForDeferral()  # head-only model over precomputed features
    >>> batch = collator([
    ...     {"features": [0.1, 0.2], "labels": 1, "expert_labels": [1, 0], "text": "a"},
    ...     {"features": [0.3, 0.4], "labels": 0, "expert_labels": [0, 0], "text": "b"},
    ... ])
    >>> sorted(batch), tuple(batch["features"].shape), batch["expert_labels"].tolist()
    (['expert_labels', 'features', 'labels'], (2, 2), [[1, 0], [0, 0]])

    ```
    """

    tokenizer: PreTrainedTokenizerBase | None = None
    padding: bool | str | PaddingStrategy = True
    max_length: int | None = None
    pad_to_multiple_of: int | None = None
    return_tensors: str = "pt"

    def __post_init__(self) -> None:
        if self.return_tensors not in ("pt", "np"):
            raise ValueError(f"`return_tensors` must be 'pt' or 'np', got {self.return_tensors!r}.")
        if self.tokenizer is not None and not hasattr(self.tokenizer, "pad"):
            raise ValueError(
                f"`tokenizer` must be a transformers tokenizer (with a `pad` method) or None, "
                f"got {type(self.tokenizer).__name__}."
            )
        self._padder = None if self.tokenizer is None else DataCollatorWithPadding(
            self.tokenizer, self.padding, self.max_length, self.pad_to_multiple_of, self.return_tensors)

    def _to_output(self, array: np.ndarray) -> Any:
        if self.return_tensors == "np":
            return array
        import torch

        return torch.from_numpy(np.ascontiguousarray(array))

    @staticmethod
    def _integer_labels(values: list[Any], key: str) -> np.ndarray:
        # Fast path: one conversion for the whole column; the per-row checks below only run when it does not give
        # integers of a valid shape, and then produce the precise error message.
        try:
            array = np.asarray(values)
        except (TypeError, ValueError):
            array = None
        valid_ndim = (1,) if key == "labels" else (1, 2)
        if array is not None and np.issubdtype(array.dtype, np.integer) and array.ndim in valid_ndim and (
            array.ndim == 1 or array.shape[1] > 0
        ):
            return array.astype(np.int64, copy=False)
        out = []
        widths = set()
        for row, value in enumerate(values):
            if value is None:
                raise ValueError(f"`features` row {row} has {key}=None; expected an int label.")
            try:
                array = np.asarray(value.tolist() if hasattr(value, "tolist") else value)
            except (TypeError, ValueError):  # a ragged nested list
                array = np.empty((0, 0))
            if array.ndim > 1 or (array.size and not np.issubdtype(array.dtype, np.integer)):
                raise ValueError(
                    f"`features` row {row}: {key} must be an int"
                    f"{' or a list of ints' if key == 'expert_labels' else ''}, got {value!r}."
                )
            widths.add(None if array.ndim == 0 else array.shape[0])
            out.append(array.astype(np.int64))
        if key == "labels" and widths != {None}:
            raise ValueError(f"`features`: labels must be one int per row, got lists of lengths {sorted(w for w in widths if w is not None)}.")
        if len(widths) > 1:
            described = sorted("scalar" if width is None else f"{width} experts" for width in widths)
            raise ValueError(
                f"`features`: {key} must have the same width in every row (an int for one expert, or a list of M "
                f"ints for M experts); got {described}."
            )
        if widths == {0}:
            raise ValueError(f"`features`: {key} lists are empty; expected at least one expert label per row.")
        return np.stack(out)

    @staticmethod
    def _scores(values: list[Any]) -> np.ndarray:
        """`expert_correct` as float32 `[B]` or `[B, M]`: bools, 0/1 or scores, -100 where there is none."""
        if any(value is None or (isinstance(value, (list, tuple)) and None in value) for value in values):
            raise ValueError("`features`: expert_correct holds None; write -100 where an expert did not answer.")
        try:
            array = np.asarray(values, dtype=np.float32)
        except (TypeError, ValueError):
            array = None
        if array is None or array.ndim not in (1, 2) or (array.ndim == 2 and array.shape[1] == 0):
            raise ValueError(f"`features`: expert_correct must be a number in [0, 1] (or -100) per expert, the same "
                             f"number of experts in every row; got rows such as {values[:2]!r:.120}.")
        return array

    @staticmethod
    def _category_ids(values: list[Any]) -> np.ndarray:
        """`side_categorical` as int64 `[B, n]`: the same number of category ids (integers >= 0) in every row."""
        try:
            array = np.asarray([value.tolist() if hasattr(value, "tolist") else value for value in values])
        except (TypeError, ValueError):  # ragged rows
            array = None
        if array is None or array.ndim != 2 or not (np.issubdtype(array.dtype, np.integer) or array.size == 0) \
                or (array < 0).any():
            raise ValueError("`features`: side_categorical must be a list of category ids (integers >= 0), the same "
                             f"number in every row; got rows such as {values[:2]!r:.120}.")
        return array.astype(np.int64, copy=False)

    @staticmethod
    def _float_arrays(values: list[Any], key: str) -> np.ndarray:
        if not hasattr(values[0], "detach"):  # fast path for lists and numpy arrays, as for the labels
            try:
                array = np.asarray(values, dtype=np.float32)
            except (TypeError, ValueError):
                array = None
            if array is not None and array.ndim >= 2:
                return array
        arrays = []
        for row, value in enumerate(values):
            if hasattr(value, "detach"):  # torch tensor, possibly half precision
                value = value.detach().float().cpu().numpy()
            try:
                arrays.append(np.asarray(value, dtype=np.float32))
            except (TypeError, ValueError) as err:
                raise ValueError(f"`features` row {row}: {key} must be numeric, got {type(value).__name__}.") from err
        shapes = sorted({array.shape for array in arrays})
        if len(shapes) > 1:
            raise ValueError(f"`features`: {key} must have the same shape in every row, got shapes {shapes}.")
        return np.stack(arrays)

    def __call__(self, features: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Collate a list of examples into a batch.

        Args:
            features (`Sequence[Mapping[str, Any]]`):
                Examples as produced by a `datasets.Dataset` (one dict per example).

        Returns:
            `dict[str, Any]`: the model inputs, `labels` (long `[B]`) and `expert_labels` (long `[B]` or `[B, M]`)
            when present, as torch tensors (or numpy arrays with `return_tensors="np"`).
        """
        if isinstance(features, Mapping) or not isinstance(features, Sequence) or len(features) == 0:
            raise ValueError(f"`features` must be a non-empty list of examples (dicts), got {type(features).__name__}.")
        rows: list[dict[str, Any]] = []
        for index, example in enumerate(features):
            if not isinstance(example, Mapping):
                raise ValueError(f"`features` row {index} must be a dict, got {type(example).__name__}.")
            row = dict(example)
            for alias in _LABEL_ALIASES:
                if alias in row:
                    if "labels" in row:
                        raise ValueError(f"`features` row {index} has both 'labels' and {alias!r}; keep one.")
                    row["labels"] = row.pop(alias)
            rows.append(row)
        keys = list(rows[0])
        for index, row in enumerate(rows[1:], start=1):
            if set(row) != set(keys):
                raise ValueError(
                    f"`features` rows must have the same keys; row 0 has {sorted(keys)}, row {index} has {sorted(row)}."
                )

        batch: dict[str, Any] = {}
        if "expert_labels" in keys and "expert_correct" in keys:
            raise ValueError("`features` have both 'expert_labels' and 'expert_correct'; keep one: the experts' answers, "
                             "or whether each was right (a score in [0, 1]).")
        if "labels" in keys:
            if "expert_labels" not in keys and "expert_correct" not in keys:
                raise ValueError(
                    "`features` have 'labels' but no 'expert_labels'; a deferral model needs the expert's answer for "
                    "every example (add it with hf_defer.experts.annotator_expert / class_subset_expert; -100 where one did "
                    "not answer), or 'expert_correct' (whether it was right)."
                )
            batch["labels"] = self._to_output(self._integer_labels([row["labels"] for row in rows], "labels"))
        if "expert_labels" in keys:
            batch["expert_labels"] = self._to_output(
                self._integer_labels([row["expert_labels"] for row in rows], "expert_labels")
            )
        if "expert_correct" in keys:
            batch["expert_correct"] = self._to_output(self._scores([row["expert_correct"] for row in rows]))
        for key in _PASSTHROUGH_FLOAT_KEYS:
            if key in keys:
                batch[key] = self._to_output(self._float_arrays([row[key] for row in rows], key))

        if "side_categorical" in keys:
            batch["side_categorical"] = self._to_output(self._category_ids([row["side_categorical"] for row in rows]))

        handled = {"labels", "expert_labels", "expert_correct", "side_categorical", *_PASSTHROUGH_FLOAT_KEYS}
        rest = [key for key in keys if key not in handled and not _is_string_value(rows[0][key])]
        if not rest:
            return batch
        if self.tokenizer is not None:  # the padding itself is DataCollatorWithPadding's, on the model inputs only
            batch.update(self._padder([{key: row[key] for key in rest} for row in rows]))
            return batch
        if "input_ids" in rest:
            raise ValueError(
                "`features` contain 'input_ids' but `tokenizer` is None; pass the tokenizer so the sequences can "
                "be padded (DataCollatorForDeferral(tokenizer=...))."
            )
        for key in rest:
            values = [row[key] for row in rows]
            try:
                array = np.stack([np.asarray(value) for value in values])
            except ValueError as err:
                raise ValueError(
                    f"`features`: column {key!r} has values of different shapes and there is no tokenizer to pad "
                    "them; remove the column or pass a tokenizer."
                ) from err
            if array.dtype == object or not (np.issubdtype(array.dtype, np.number) or array.dtype == bool):
                raise ValueError(f"`features`: column {key!r} is not numeric (dtype {array.dtype}); remove it.")
            batch[key] = self._to_output(array)
        return batch
