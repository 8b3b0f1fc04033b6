"""Side features: what a router knows beside the text (the subject or task, the prompt's length, the user's tier),
embedded and joined to the text representation inside the model.

`DeferralConfig(side_features=[...])` lists them, one dict each, saved in `config.json`:

- `{"name": "subject", "kind": "categorical", "categories": ["algebra", ...], "dim": 8}`: an `nn.Embedding` of
  `len(categories) + 1` rows (row 0: a category not seen in training) and width `dim`;
- `{"name": "length", "kind": "numeric", "mean": 412.0, "std": 230.5}`: the value standardised, `(x - mean) / std`.

The model's head reads `[pooled text representation, embeddings..., standardised numbers...]`. [`side_feature_specs`]
builds the list from training columns; [`side_feature_tensors`] turns rows of values into the two inputs of the
model's forward, `side_categorical` (`[B, n_categorical]` category ids) and `side_numeric` (`[B, n_numeric]`).

This module only imports ``torch`` and ``.validators``: it is copied next to the model code for remote-code loading.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from .validators import is_number

__all__ = ["SideFeatureEncoder", "check_side_features", "is_missing_side_value", "side_feature_specs",
           "side_feature_tensors", "side_feature_value"]

RESERVED = ("text", "text_pair", "features", "image")


def is_missing_side_value(value: Any) -> bool:
    """Whether a side-feature value is missing: `None`, NaN (Python's, numpy's of any width), pandas' `NA` / `NaT`,
    or a blank string. The one rule of missing side features: the dataset checks, `hf-defer predict`'s streamed rows,
    the pipeline and `serve`'s metadata all use it (-1 or 0 are numbers like any other here).

    Example:

    ```python
    >>> import numpy as np
    >>> from hf_defer.modeling.side_features import is_missing_side_value
    >>> [is_missing_side_value(v) for v in (None, float("nan"), np.float32("nan"), " ", "", 0, -1, "law")]
    [True, True, True, True, True, False, False, False]

    ```
    """
    if value is None or type(value).__name__ in ("NAType", "NaTType"):
        return True
    if is_number(value):
        return math.isnan(float(value))
    return isinstance(value, str) and not value.strip()


def side_feature_value(spec: Mapping[str, Any], value: Any) -> str | float:
    """A side-feature value as the model reads it; the one owner of parsing, checking and encoding values.

    - A numeric feature takes a finite number, or a string holding one (CSV cells and OpenAI's metadata values are
      text): `"412"` is 412.0.
    - A categorical feature takes a category by what it means, not by how a file stored it: a string stripped of
      surrounding white space, a whole number written without decimals (`1`, `1.0` from a Parquet float column and
      numpy's `np.float64(1.0)` are all `"1"`), another finite number as its shortest form (`0.5`), a boolean as
      `"True"` / `"False"`. A string is never read as a number (`"007"` stays `"007"`).
    - A missing value ([`is_missing_side_value`]), a list, dict or any other value that is not one number, string or
      boolean is a `ValueError` (its message is the reason; the caller names the feature and the row).

    Example:

    ```python
    >>> import numpy as np
    >>> from hf_defer.modeling.side_features import side_feature_value
    >>> tier = {"name": "tier", "kind": "categorical"}
    >>> side_feature_value(tier, 1), side_feature_value(tier, np.float64(1.0)), side_feature_value(tier, " pro ")
    ('1', '1', 'pro')
    >>> side_feature_value({"name": "length", "kind": "numeric"}, "412")
    412.0
    >>> side_feature_value(tier, ["pro"])
    Traceback (most recent call last):
    ...
    ValueError: expected one value (a number, or a category such as a subject), got a list: ['pro']

    ```
    """
    if is_missing_side_value(value):
        raise ValueError("the value is missing (None, NaN or blank)")
    if not isinstance(value, str) and not is_number(value) and not _is_bool(value):
        raise ValueError(f"expected one value (a number, or a category such as a subject), got a "
                         f"{type(value).__name__}: {value!r:.60}")
    if spec.get("kind") == "numeric":
        number = None
        if is_number(value):
            number = float(value)
        elif isinstance(value, str):
            try:
                number = float(value.strip())
            except ValueError:
                number = None
        if number is None or not math.isfinite(number):
            raise ValueError(f"the model reads {spec.get('name')!r} as a number, got {value!r:.40}")
        return number
    if isinstance(value, str):
        return value.strip()
    if _is_bool(value):
        return str(bool(value))
    if not math.isfinite(float(value)):
        raise ValueError(f"{value!r} is not a finite number")
    return str(int(value)) if float(value).is_integer() else str(value)


def _is_bool(value: Any) -> bool:
    """Python's or numpy's boolean (`np.bool_`, named `bool` in numpy 2)."""
    return isinstance(value, bool) or (type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_"))


def _category_ids(spec: Mapping[str, Any]) -> dict[str, int]:
    """Category -> id (1 + its index; 0 is "unseen") of a categorical spec, each category also under its canonical
    form (stripped; `str()` of a whole float such as `"1.0"`, as models saved before values were canonicalised
    learnt a float column, also as `"1"`), the first category winning a tie."""
    ids: dict[str, int] = {}
    for index, category in enumerate(spec["categories"]):
        forms = [category, category.strip()]
        whole, dot, zero = category.strip().partition(".")
        if dot and zero == "0" and whole.lstrip("-").isdigit():  # str() of a whole float: "1.0", "-2.0"
            forms.append(str(int(whole)))
        for form in forms:
            ids.setdefault(form, index + 1)
    return ids


def check_side_features(specs: Any) -> list[dict[str, Any]]:
    """`specs` checked (a `ValueError` names the entry and what is wrong), as a list of plain dicts."""
    if not isinstance(specs, (list, tuple)) or not specs:
        raise ValueError(f"side_features must be a non-empty list of dicts, got {specs!r:.80}.")
    out, names = [], set()
    for index, spec in enumerate(specs):
        where = f"side_features[{index}]"
        if not isinstance(spec, Mapping) or not isinstance(spec.get("name"), str) or not spec["name"]:
            raise ValueError(f"{where} must be a dict with a non-empty 'name', got {spec!r:.80}.")
        name, kind = spec["name"], spec.get("kind")
        if name in names or name in RESERVED:
            raise ValueError(f"{where}: the name {name!r} is {'given twice' if name in names else 'reserved'}.")
        names.add(name)
        if kind == "categorical":
            categories, dim = spec.get("categories"), spec.get("dim", 8)
            if not isinstance(categories, (list, tuple)) or not categories or \
                    not all(isinstance(c, str) for c in categories) or len(set(categories)) != len(categories):
                raise ValueError(f"{where} ({name!r}): 'categories' must be a non-empty list of distinct strings.")
            if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
                raise ValueError(f"{where} ({name!r}): 'dim' must be a positive integer, got {dim!r}.")
            out.append({"name": name, "kind": kind, "categories": list(categories), "dim": dim})
        elif kind == "numeric":
            mean, std = spec.get("mean", 0.0), spec.get("std", 1.0)
            if not (is_number(mean) and math.isfinite(mean) and is_number(std) and math.isfinite(std) and std > 0):
                raise ValueError(f"{where} ({name!r}): 'mean' must be finite and 'std' positive, got {mean!r}, {std!r}.")
            out.append({"name": name, "kind": kind, "mean": float(mean), "std": float(std)})
        else:
            raise ValueError(f"{where} ({name!r}): 'kind' must be 'categorical' or 'numeric', got {kind!r}.")
    return out


def side_feature_specs(columns: Mapping[str, Sequence[Any]], dim: int = 8,
                       categorical: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """The `side_features` of a config from training columns (name -> values), in the order given: a column of
    numbers only is numeric (its mean and standard deviation), any other categorical (its distinct values, as
    canonical strings of [`side_feature_value`], sorted); `categorical` names numeric-looking columns to treat as
    categories (a tier 1/2/3). A missing value ([`is_missing_side_value`]) or a list or dict is an error naming the
    column.

    Example:

    ```python
    >>> from hf_defer.modeling.side_features import side_feature_specs
    >>> specs = side_feature_specs({"subject": ["law", "math", "law"], "length": [10, 20, 30]}, dim=4)
    >>> specs[0]["categories"], specs[1]["mean"], round(specs[1]["std"], 3)
    (['law', 'math'], 20.0, 8.165)

    ```
    """
    specs = []
    for name, values in columns.items():
        values = list(values)
        if any(is_missing_side_value(value) for value in values):
            raise ValueError(f"side feature column {name!r} has missing values; fill them (e.g. 'unknown' or 0).")
        if all(is_number(value) for value in values) and name not in (categorical or ()):
            mean = sum(float(v) for v in values) / len(values)
            std = math.sqrt(sum((float(v) - mean) ** 2 for v in values) / len(values))
            specs.append({"name": name, "kind": "numeric", "mean": mean, "std": std if std > 0 else 1.0})
        else:
            kind = {"name": name, "kind": "categorical"}
            found = set()
            for row, value in enumerate(values):
                try:
                    found.add(side_feature_value(kind, value))
                except ValueError as error:
                    raise ValueError(f"side feature column {name!r}, row {row}: {error}.") from None
            specs.append({**kind, "categories": sorted(found), "dim": dim})
    return check_side_features(specs)


def side_feature_tensors(specs: Sequence[Mapping[str, Any]],
                         rows: Sequence[Mapping[str, Any]]) -> tuple[torch.Tensor, torch.Tensor]:
    """`(side_categorical [B, n_categorical] long, side_numeric [B, n_numeric] float32)` for `rows` (dicts holding
    every side feature by name), each value read by [`side_feature_value`] (categories matched by what they mean: `1`,
    `1.0` and `"1"` are the same category). A category not in the spec gets id 0 (unseen); a missing feature, a
    numeric one that is no finite number, or a list, dict or other non-scalar value is a `ValueError` naming it.

    Example:

    ```python
    >>> from hf_defer.modeling.side_features import side_feature_specs, side_feature_tensors
    >>> specs = side_feature_specs({"subject": ["law", "math"], "length": [10, 30]})
    >>> ids, numbers = side_feature_tensors(specs, [{"subject": "math", "length": 20}, {"subject": "art", "length": 5}])
    >>> ids.tolist(), numbers.tolist()
    ([[2], [0]], [[20.0], [5.0]])

    ```
    """
    categorical, numeric = [], []
    lookups = [_category_ids(spec) if spec["kind"] == "categorical" else None for spec in specs]
    for row_index, row in enumerate(rows):
        ids, numbers = [], []
        for spec, lookup in zip(specs, lookups):
            name = spec["name"]
            if not isinstance(row, Mapping) or name not in row or is_missing_side_value(row[name]):
                raise ValueError(f"side feature {name!r} is missing from input {row_index} (this model takes "
                                 f"{[s['name'] for s in specs]}).")
            try:
                value = side_feature_value(spec, row[name])
            except ValueError as error:
                raise ValueError(f"side feature {name!r} of input {row_index}: {error}.") from None
            if lookup is not None:
                ids.append(lookup.get(value, 0))
            else:
                numbers.append(value)
        categorical.append(ids)
        numeric.append(numbers)
    n_cat = sum(spec["kind"] == "categorical" for spec in specs)
    return (torch.tensor(categorical, dtype=torch.long).reshape(len(rows), n_cat),
            torch.tensor(numeric, dtype=torch.float32).reshape(len(rows), len(specs) - n_cat))


class SideFeatureEncoder(nn.Module):
    """Embeds the categorical side features and standardises the numeric ones; `output_dim` wide."""

    def __init__(self, specs: Sequence[Mapping[str, Any]]) -> None:
        super().__init__()
        self.specs = check_side_features(list(specs))
        categorical = [s for s in self.specs if s["kind"] == "categorical"]
        numeric = [s for s in self.specs if s["kind"] == "numeric"]
        self.embeddings = nn.ModuleList(nn.Embedding(len(s["categories"]) + 1, s["dim"]) for s in categorical)
        # plain lists, not buffers: from_pretrained builds the model on the meta device, and a buffer left out of the
        # weights file would come back uninitialised
        self.mean, self.std = [s["mean"] for s in numeric], [s["std"] for s in numeric]
        self.output_dim = sum(s["dim"] for s in categorical) + len(numeric)

    def forward(self, side_categorical: torch.Tensor | None, side_numeric: torch.Tensor | None) -> torch.Tensor:
        n_cat, n_num = len(self.embeddings), len(self.mean)
        for name, value, width in (("side_categorical", side_categorical, n_cat), ("side_numeric", side_numeric, n_num)):
            if width and (value is None or value.dim() != 2 or value.shape[1] != width):
                got = "None" if value is None else f"shape {tuple(value.shape)}"
                names = [s["name"] for s in self.specs]
                raise ValueError(f"{name} must have shape [batch, {width}] for this model's side features {names} "
                                 f"(see hf_defer.modeling.side_features.side_feature_tensors), got {got}.")
        parts = []
        if n_cat:
            if ((side_categorical < 0) | (side_categorical > torch.tensor(
                    [e.num_embeddings - 1 for e in self.embeddings], device=side_categorical.device))).any():
                raise ValueError("side_categorical holds a category id outside [0, number of categories].")
            parts += [embedding(side_categorical[:, j].long()) for j, embedding in enumerate(self.embeddings)]
        if n_num:
            mean, std = (torch.tensor(v, device=side_numeric.device) for v in (self.mean, self.std))
            parts.append((side_numeric.float() - mean) / std)
        return torch.cat(parts, dim=1)
