"""ImageNet-16H (Steyvers, Tejeda, Kerrigan and Smyth, PNAS 2022): real people classifying noisy images, read from a
folder the user downloaded.

[`load_imagenet16h`] turns the study's files into a `datasets.DatasetDict` for learning to defer: the features are the
log-probabilities of the five CNNs the study fine-tuned at each noise level, the target is the true class, and the
expert is one participant per image, as in `human_ai_deferral` (Mozannar et al., 2023) and Cao et al. (2023, Table 2).
The data are not shipped with hf_defer (their license was not verified); see the docstring for where to get them.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import datasets
import numpy as np
import pandas as pd

from ..experts.simulated import annotator_expert
from .annotations import annotations_to_columns
from ..modeling.validators import check_seed, split_sizes

__all__ = ["IMAGENET16H_CITATION", "IMAGENET16H_LABELS", "IMAGENET16H_MODELS", "IMAGENET16H_NOISE_LEVELS",
           "load_imagenet16h"]

IMAGENET16H_LABELS = ("knife", "keyboard", "elephant", "bicycle", "airplane", "clock", "oven", "chair", "bear", "boat",
                      "cat", "bottle", "truck", "car", "bird", "dog")
"""The 16 classes in the column order of the study's model files; the class ids of [`load_imagenet16h`]."""

IMAGENET16H_NOISE_LEVELS = (80, 95, 110, 125)
"""The phase-noise levels of the study ("080", "095", "110", "125"); Cao et al. report 95 (Table 2) and 80."""

IMAGENET16H_MODELS = ("alexnet", "densenet161", "googlenet", "resnet152", "vgg19")
"""The five CNNs whose class probabilities (fine-tuned 10 epochs at each noise level) are the features."""

IMAGENET16H_CITATION = """@article{steyvers2022bayesian,
  title   = {Bayesian modeling of human--{AI} complementarity},
  author  = {Steyvers, Mark and Tejeda, Heliodoro and Kerrigan, Gavin and Smyth, Padhraic},
  journal = {Proceedings of the National Academy of Sciences},
  volume  = {119},
  number  = {11},
  pages   = {e2111547119},
  year    = {2022},
  doi     = {10.1073/pnas.2111547119}
}"""
"""BibTeX of ImageNet-16H (data: OSF project 2ntrf, https://osf.io/2ntrf/)."""

_CATEGORIES = "imagenet16H.csv"
# The files of a noise level, first as this layout names them, then as the upstream repository
# (nooranisima/Human-AI-Collaborative-UQ, folder data/) does.
_ANSWER_FILES = ("human_predictions/noise{noise}.csv", "users/noise{noise}/predictions.csv")
_MODEL_FILES = ("model_probs_epoch10/noise{noise}/{model}.csv", "models/noise{noise}/{model}.csv")
_PROBABILITY_FLOOR = 1e-30  # log(0) would be -inf; no published probability is below 1e-19
_SUM_TOLERANCE = 1e-3
_PREFIX = "participant_"


def _find(folder: Path, patterns: Sequence[str], what: str, **names: object) -> Path:
    candidates = [folder / pattern.format(**names) for pattern in patterns]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"`path` {str(folder)!r} has no {what}: looked for {[str(c.relative_to(folder)) for c in candidates]}. "
        "Expected the ImageNet-16H layout described in `load_imagenet16h`'s docstring."
    )


def _read(file: Path, columns: Sequence[str], one_row_per_image: bool = True) -> pd.DataFrame:
    frame = pd.read_csv(file, dtype={"image_name": str}, keep_default_na=False)
    missing = [name for name in columns if name not in frame.columns]
    if missing:
        raise ValueError(f"{file} must have the columns {list(columns)}; missing {missing}, found "
                         f"{list(frame.columns)}.")
    repeated = frame["image_name"][frame["image_name"].duplicated()]
    if one_row_per_image and len(repeated):
        raise ValueError(f"{file} lists an image more than once: {repeated.head(5).tolist()}.")
    return frame


def _check_classes(values: pd.Series, file: Path, column: str) -> np.ndarray:
    ids = values.map({name: index for index, name in enumerate(IMAGENET16H_LABELS)})
    bad = ids.isna().to_numpy()
    if bad.any():
        rows = np.flatnonzero(bad)[:5].tolist()
        raise ValueError(f"{file}, column {column!r}: rows {rows} hold {values.iloc[rows].tolist()}, which are not "
                         f"ImageNet-16H classes {list(IMAGENET16H_LABELS)}.")
    return ids.to_numpy(dtype=np.int64)


def _log_probabilities(file: Path, images: pd.Index) -> np.ndarray:
    """The `[N, 16]` log-probabilities of one model, rows in the order of `images`, checked."""
    frame = _read(file, ["image_name", *IMAGENET16H_LABELS]).set_index("image_name")
    absent, extra = images.difference(frame.index), frame.index.difference(images)
    if len(absent) or len(extra):
        raise ValueError(f"{file} must hold the images of {_CATEGORIES}: {len(absent)} missing (e.g. "
                         f"{absent[:3].tolist()}), {len(extra)} unknown (e.g. {extra[:3].tolist()}).")
    probabilities = frame.loc[images, list(IMAGENET16H_LABELS)].apply(pd.to_numeric, errors="coerce").to_numpy(
        dtype=np.float64)
    bad = ~np.isfinite(probabilities).all(axis=1) | (probabilities < 0).any(axis=1) | (
        np.abs(probabilities.sum(axis=1) - 1.0) > _SUM_TOLERANCE)
    if bad.any():
        raise ValueError(f"{file}: every row must hold 16 probabilities in [0, 1] that sum to 1 (within "
                         f"{_SUM_TOLERANCE}); images {images[bad][:5].tolist()} do not.")
    return np.log(np.maximum(probabilities, _PROBABILITY_FLOOR))


def _answers(file: Path, images: pd.Index) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Per-class answer counts `[N, 16]` (every row, repeats included) and each participant's answer (-1: none)."""
    frame = _read(file, ["image_name", "participant_id", "participant_classification"], one_row_per_image=False)
    unknown = ~frame["image_name"].isin(images)
    if unknown.any():
        raise ValueError(f"{file}: rows {np.flatnonzero(unknown)[:5].tolist()} name images that {_CATEGORIES} does not "
                         f"list ({frame['image_name'][unknown].head(3).tolist()}).")
    answer = _check_classes(frame["participant_classification"], file, "participant_classification")
    row = images.get_indexer(frame["image_name"])
    counts = np.zeros((len(images), len(IMAGENET16H_LABELS)), dtype=np.int64)
    np.add.at(counts, (row, answer), 1)
    unanswered = counts.sum(axis=1) == 0
    if unanswered.any():
        raise ValueError(f"{file}: no participant classified {int(unanswered.sum())} image(s), e.g. "
                         f"{images[unanswered][:3].tolist()}; every image needs an answer to draw its expert.")
    # One column per participant; a repeated answer counts once, two different ones leave the cell missing.
    wide = annotations_to_columns(frame, "image_name", "participant_id", "participant_classification",
                                  duplicates="majority", label_names=IMAGENET16H_LABELS, column_prefix=_PREFIX)
    wide = wide.set_index("image_name").reindex(images)
    label2id = {name: index for index, name in enumerate(IMAGENET16H_LABELS)}
    names = sorted(wide.columns, key=lambda name: (not name[len(_PREFIX):].isdigit(),
                                                   int(name[len(_PREFIX):]) if name[len(_PREFIX):].isdigit() else 0,
                                                   name))
    return counts, {name: wide[name].map(label2id).fillna(-1).to_numpy(dtype=np.int64) for name in names}


def _check_noise(noise: object) -> int:
    text = str(noise).strip() if isinstance(noise, (str, int)) and not isinstance(noise, bool) else ""
    if not text.isdigit() or int(text) not in IMAGENET16H_NOISE_LEVELS:
        raise ValueError(f"`noise` must be one of the phase-noise levels {list(IMAGENET16H_NOISE_LEVELS)} (or "
                         f"'080', '095', ...), got {noise!r}.")
    return int(text)


def _check_models(models: object) -> list[str]:
    if isinstance(models, str) or not isinstance(models, Sequence) or not models or not all(
            isinstance(name, str) and name for name in models) or len(set(models)) != len(models):
        raise ValueError(f"`models` must be a non-empty list of distinct model names such as "
                         f"{list(IMAGENET16H_MODELS)}, got {models!r}.")
    return list(models)


def load_imagenet16h(
    path: str | os.PathLike,
    noise: int | str = 95,
    seed: int = 0,
    split: Sequence[float] = (0.7, 0.1, 0.2),
    expert_seed: int | None = None,
    models: Sequence[str] = IMAGENET16H_MODELS,
) -> datasets.DatasetDict:
    """Load ImageNet-16H at one noise level with its real-human expert, split into train/validation/test.

    1,200 ImageNet images of 16 classes (75 each) were shown with phase noise to 145 participants, about 6 per image
    and noise level (Steyvers et al., PNAS 2022). As in `human_ai_deferral` and Cao et al. (2023, Table 2), the expert
    is one participant per image, `expert_labels ~ Uniform(the image's answers)` (every recorded answer counts, a
    repeated one too), drawn once per image before splitting. The features are the CNNs' log-probabilities, not
    image embeddings: the study's five CNNs were fine-tuned for 10 epochs at each noise level.

    **Where the data come from.** The study's files are on OSF (project 2ntrf, https://osf.io/2ntrf/). The layout read
    here is that of the `data/` folder of the GitHub repository `nooranisima/Human-AI-Collaborative-UQ` (column
    subsets of the OSF files), or the same files renamed:

    ```text
    path/imagenet16H.csv                                    image_name, category
    path/human_predictions/noise{N}.csv                     image_name, participant_id, participant_classification
        (or path/users/noise{N}/predictions.csv)
    path/model_probs_epoch10/noise{N}/{model}.csv           image_name, knife, keyboard, ..., dog (16 probabilities)
        (or path/models/noise{N}/{model}.csv)
    ```

    with N in 80, 95, 110, 125 and a model in `alexnet`, `densenet161`, `googlenet`, `resnet152`, `vgg19`. The
    license of these files was not verified (the images derive from ImageNet, for non-commercial research): hf_defer
    does not ship them. Cite Steyvers et al. (2022), [`IMAGENET16H_CITATION`].

    Args:
        path (`str` or `os.PathLike`): the folder described above.
        noise (`int` or `str`, *optional*, defaults to 95): the phase-noise level, 80, 95, 110 or 125 (`"095"` too).
        seed (`int`, *optional*, defaults to 0): seed of the split (and of the expert draws unless `expert_seed`).
        split (`Sequence[float]`, *optional*, defaults to `(0.7, 0.1, 0.2)`): train, validation and test fractions;
            each in (0, 1), summing to 1. Sizes are rounded, train takes the remainder (840/120/240 images).
        expert_seed (`int`, *optional*): seed of the expert draws; defaults to `seed`.
        models (`Sequence[str]`, *optional*): the CNNs whose log-probabilities form `features`, in that order
            (defaults to all five, [`IMAGENET16H_MODELS`]).

    Returns:
        `datasets.DatasetDict` with splits `train`, `validation`, `test`, each with the columns
        `image_name`; `features` (16 log-probabilities per model, `float32`; probabilities below 1e-30 count as
        1e-30); `labels` (`ClassLabel` of [`IMAGENET16H_LABELS`]); `expert_labels` (int, the drawn participant's
        answer); `answer_counts` (how many answers each class got, so `answer_counts[labels] / sum(answer_counts)`
        is the expert's true accuracy, see `hf_defer.experts.annotator_accuracy`); and one `ClassLabel` column
        `participant_<id>` per participant, holding that participant's answer and -1 where they did not see the
        image, for training with missing answers masked (`prepare_deferral_dataset(..., missing_expert="mask")`).
        A participant who answered an image twice keeps that answer if both agree and is missing there if not
        ([`annotations_to_columns`] with `duplicates="majority"`); the expert draw counts every answer.

    Raises:
        FileNotFoundError: `path` is not a folder or lacks a file of the layout.
        ValueError: a bad `noise`, `models`, `seed`, `expert_seed` or `split`; missing columns, unknown classes or
            images, repeated images, probabilities that are not a distribution, an image nobody classified.

    Example:

    ```python
    >>> from hf_defer.data import IMAGENET16H_LABELS, load_imagenet16h
    >>> IMAGENET16H_LABELS[:4]
    ('knife', 'keyboard', 'elephant', 'bicycle')
    >>> ds = load_imagenet16h("path/to/imagenet16h", noise=95, seed=0)  # doctest: +SKIP
    >>> ds["train"].num_rows, ds["validation"].num_rows, ds["test"].num_rows  # doctest: +SKIP
    (840, 120, 240)
    >>> len(ds["test"][0]["features"]), ds["test"].features["labels"].num_classes  # doctest: +SKIP
    (80, 16)

    ```
    """
    folder = _check_folder(path)
    noise = _check_noise(noise)
    seed = check_seed(seed, "seed")
    expert_seed = seed if expert_seed is None else check_seed(expert_seed, "expert_seed")
    models = _check_models(models)
    split_sizes(10**6, split)
    images, labels = _images_and_classes(folder)
    features = _model_features(folder, noise, models, images)
    counts, participants = _answers(_find(folder, _ANSWER_FILES, f"participant answers at noise {noise}",
                                          noise=noise), images)
    full = _study_table(images, features, labels, counts, participants)
    full = annotator_expert(full, "answer_counts", seed=expert_seed, column="expert_labels")
    return _split_study(full, split, seed)


def _check_folder(path: object) -> Path:
    """`path` as the folder it names; anything else, or a folder that does not exist, is an error."""
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise ValueError(f"`path` must be the ImageNet-16H folder (a path), got {path!r}.")
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise FileNotFoundError(f"`path` {str(folder)!r} is not a folder; expected the ImageNet-16H folder (see the "
                                "docstring of load_imagenet16h for its layout and where to download it).")
    return folder


def _images_and_classes(folder: Path) -> tuple[pd.Index, np.ndarray]:
    """The study's images (in the order of its list of images) and their class ids."""
    categories_file = _find(folder, [_CATEGORIES], "list of images and classes")
    categories = _read(categories_file, ["image_name", "category"])
    labels = _check_classes(categories["category"], categories_file, "category")
    return pd.Index(categories["image_name"]), labels


def _model_features(folder: Path, noise: int, models: Sequence[str], images: pd.Index) -> np.ndarray:
    """The features: each model's 16 log-probabilities per image at `noise`, side by side in the order of `models`."""
    return np.concatenate(
        [_log_probabilities(_find(folder, _MODEL_FILES, f"probabilities of model {model!r} at noise {noise}",
                                  noise=noise, model=model), images) for model in models], axis=1)


def _study_table(images: pd.Index, features: np.ndarray, labels: np.ndarray, counts: np.ndarray,
                 participants: dict[str, np.ndarray]) -> datasets.Dataset:
    """One row per image: its name, the CNNs' log-probabilities, the class, the answer counts and each participant's
    answer, typed (`ClassLabel` for the classes)."""
    classes = datasets.ClassLabel(names=list(IMAGENET16H_LABELS))
    return datasets.Dataset.from_dict(
        {"image_name": images.tolist(), "features": features.astype(np.float32), "labels": labels,
         "answer_counts": counts, **participants},
        features=datasets.Features({
            "image_name": datasets.Value("string"),
            "features": datasets.List(datasets.Value("float32"), length=features.shape[1]),
            "labels": classes,
            "answer_counts": datasets.List(datasets.Value("int64"), length=len(IMAGENET16H_LABELS)),
            **{name: classes for name in participants}}))


def _split_study(full: datasets.Dataset, split: Sequence[float], seed: int) -> datasets.DatasetDict:
    """`full` split into train, validation and test by the `split` fractions (test first, then validation)."""
    _, num_validation, num_test = split_sizes(full.num_rows, split)
    first = full.train_test_split(test_size=num_test, seed=seed)
    second = first["train"].train_test_split(test_size=num_validation, seed=seed)
    return datasets.DatasetDict({"train": second["train"], "validation": second["test"], "test": first["test"]})
