"""Tests of hf_defer.data.imagenet16h on small synthetic folders in the study's layout, written by the tests (the real
data are not shipped and never read here). Expected values are worked out from what the test writes."""

from __future__ import annotations

import doctest
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import hf_defer.data.imagenet16h as imagenet16h_module
from hf_defer.data import IMAGENET16H_LABELS, IMAGENET16H_MODELS, load_imagenet16h

LABELS = list(IMAGENET16H_LABELS)
NUM_PARTICIPANTS = 6


def model_probability(model_index: int) -> float:
    """The probability model `model_index` puts on the true class in `write_imagenet16h_folder` (the rest is even)."""
    return 0.5 + 0.1 * model_index


def write_imagenet16h_folder(root: Path, num_images: int = 40, noise_levels: tuple[int, ...] = (95,),
                             upstream: bool = False, right: int = 2, wrong: int = 1,
                             true_probability: float | None = None) -> dict:
    """A folder in the ImageNet-16H layout; returns what was written.

    Image `i` (named `img_<i>`) has class `i % 16`. Participants `(i + j) % 6 + 1` for `j < right` answer it right,
    the next `wrong` ones answer class `(label + 1) % 16`, so a random participant is right with probability
    `right / (right + wrong)`. Model `m` puts `model_probability(m)` (or `true_probability`) on the true class and
    spreads the rest evenly. `upstream=True` uses the GitHub repository's file names.
    """
    root.mkdir(parents=True, exist_ok=True)
    names = [f"img_{i}" for i in range(num_images)]
    labels = [i % 16 for i in range(num_images)]
    pd.DataFrame({"image_name": names, "category": [LABELS[y] for y in labels]}).to_csv(root / "imagenet16H.csv",
                                                                                         index=False)
    answers = []
    for i, (name, label) in enumerate(zip(names, labels)):
        for j in range(right + wrong):
            answer = label if j < right else (label + 1) % 16
            answers.append((name, (i + j) % NUM_PARTICIPANTS + 1, LABELS[answer]))
    answer_frame = pd.DataFrame(answers, columns=["image_name", "participant_id", "participant_classification"])
    probabilities = {}
    for noise in noise_levels:
        answer_file = root / (f"users/noise{noise}/predictions.csv" if upstream else f"human_predictions/noise{noise}.csv")
        answer_file.parent.mkdir(parents=True, exist_ok=True)
        answer_frame.to_csv(answer_file, index=False)
        for m, model in enumerate(IMAGENET16H_MODELS):
            p = model_probability(m) if true_probability is None else true_probability
            table = np.full((num_images, 16), (1 - p) / 15)
            table[np.arange(num_images), labels] = p
            probabilities[noise, model] = table
            folder = root / (f"models/noise{noise}" if upstream else f"model_probs_epoch10/noise{noise}")
            folder.mkdir(parents=True, exist_ok=True)
            frame = pd.DataFrame(table, columns=LABELS)
            frame.insert(0, "image_name", names)
            frame["correct"] = 1
            frame.to_csv(folder / f"{model}.csv", index=False)
    return {"names": names, "labels": labels, "answers": answers, "probabilities": probabilities, "root": root}


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> dict:
    return write_imagenet16h_folder(tmp_path_factory.mktemp("imagenet16h"), num_images=40)


def _all_rows(ds) -> pd.DataFrame:
    return pd.concat([split.to_pandas() for split in ds.values()], ignore_index=True).set_index("image_name")


def test_splits_labels_and_features_are_what_was_written(folder):
    ds = load_imagenet16h(folder["root"], noise=95, seed=3)
    # 40 images: validation round(0.1 * 40) = 4, test round(0.2 * 40) = 8, train the remaining 28.
    assert (ds["train"].num_rows, ds["validation"].num_rows, ds["test"].num_rows) == (28, 4, 8)
    assert ds["train"].features["labels"].names == LABELS
    rows = _all_rows(ds)
    assert sorted(rows.index) == sorted(folder["names"])
    for name, label in zip(folder["names"], folder["labels"]):
        assert rows.loc[name, "labels"] == label
        features = np.asarray(rows.loc[name, "features"], dtype=np.float64)
        assert features.shape == (80,)
        for m in range(5):  # log(p) on the true class, log((1 - p) / 15) elsewhere, model after model
            expected = np.full(16, math.log((1 - model_probability(m)) / 15))
            expected[label] = math.log(model_probability(m))
            np.testing.assert_allclose(features[16 * m:16 * (m + 1)], expected, rtol=1e-6)


def test_answer_counts_and_participant_columns(folder):
    rows = _all_rows(load_imagenet16h(folder["root"], seed=0))
    participant_columns = [f"participant_{k}" for k in range(1, NUM_PARTICIPANTS + 1)]
    assert [c for c in rows.columns if c.startswith("participant_")] == participant_columns
    answered = {(name, participant): LABELS.index(answer) for name, participant, answer in folder["answers"]}
    for name, label in zip(folder["names"], folder["labels"]):
        counts = np.zeros(16, dtype=int)
        counts[label], counts[(label + 1) % 16] = 2, 1  # two right answers, one wrong
        np.testing.assert_array_equal(rows.loc[name, "answer_counts"], counts)
        for k in range(1, NUM_PARTICIPANTS + 1):
            assert rows.loc[name, f"participant_{k}"] == answered.get((name, k), -1)
    # Participant k sees the images i with i % 6 in {k - 1, k - 2, k - 3} (mod 6); of 40 images, residues 0-3 occur
    # 7 times and 4-5 six times.
    expected = [sum(7 if r < 4 else 6 for r in {(k - 1 - j) % 6 for j in range(3)}) for k in range(1, 7)]
    assert expected == [19, 20, 21, 21, 20, 19]
    assert [(rows[c] >= 0).sum() for c in participant_columns] == expected


def test_the_expert_is_one_answer_of_the_image_drawn_by_the_seed(tmp_path):
    data = write_imagenet16h_folder(tmp_path / "many", num_images=160)
    right = []
    for seed in range(3):
        rows = _all_rows(load_imagenet16h(data["root"], seed=seed))
        expert, labels = rows["expert_labels"].to_numpy(), rows["labels"].to_numpy()
        assert np.all((expert == labels) | (expert == (labels + 1) % 16))  # one of the image's own answers
        right.append(expert == labels)
    # A random participant is right with probability 2/3; 480 draws: 3 standard errors are 0.065.
    assert abs(np.mean(right) - 2 / 3) < 3 * math.sqrt(2 / 9 / 480)
    # The same seed gives the same splits and experts; expert_seed keeps the experts while the split changes.
    first, again = load_imagenet16h(data["root"], seed=5), load_imagenet16h(data["root"], seed=5)
    assert first["test"]["image_name"][:] == again["test"]["image_name"][:]
    assert first["test"]["expert_labels"][:] == again["test"]["expert_labels"][:]
    moved = load_imagenet16h(data["root"], seed=6, expert_seed=5)
    assert moved["test"]["image_name"][:] != first["test"]["image_name"][:]
    pd.testing.assert_series_equal(_all_rows(moved)["expert_labels"].sort_index(),
                                   _all_rows(first)["expert_labels"].sort_index())


def test_unanimous_images_give_their_answer(tmp_path):
    data = write_imagenet16h_folder(tmp_path / "unanimous", num_images=32, right=3, wrong=0)
    rows = _all_rows(load_imagenet16h(data["root"], seed=1))
    np.testing.assert_array_equal(rows["expert_labels"].to_numpy(), rows["labels"].to_numpy())


def test_upstream_layout_string_noise_and_model_subset(folder, tmp_path):
    upstream = write_imagenet16h_folder(tmp_path / "upstream", num_images=40, noise_levels=(80,), upstream=True)
    ds = load_imagenet16h(upstream["root"], noise="080", seed=2, models=["vgg19", "alexnet"])
    rows = _all_rows(ds)
    name, label = upstream["names"][7], upstream["labels"][7]
    features = np.asarray(rows.loc[name, "features"])
    assert features.shape == (32,)  # vgg19 (model 4), then alexnet (model 0)
    assert features[label] == pytest.approx(math.log(model_probability(4)))
    assert features[16 + label] == pytest.approx(math.log(model_probability(0)))
    same = _all_rows(load_imagenet16h(folder["root"], noise=95, seed=2, models=["vgg19", "alexnet"]))
    pd.testing.assert_series_equal(rows["expert_labels"].sort_index(), same["expert_labels"].sort_index())


def test_repeated_answers_count_in_the_draw_and_resolve_in_the_columns(tmp_path):
    data = write_imagenet16h_folder(tmp_path / "repeats", num_images=16)
    file = data["root"] / "human_predictions" / "noise95.csv"
    frame = pd.read_csv(file)
    # Participant 1 answered img_0 (class 0, right); again the same, and img_5 (class 5) twice, differently.
    extra = pd.DataFrame([("img_0", 1, "knife"), ("img_5", 6, "dog")], columns=frame.columns)
    assert ((frame["image_name"] == "img_5") & (frame["participant_id"] == 6)).any()
    pd.concat([frame, extra]).to_csv(file, index=False)
    rows = _all_rows(load_imagenet16h(data["root"], seed=0))
    assert rows.loc["img_0", "participant_1"] == 0
    assert rows.loc["img_5", "participant_6"] == -1  # "clock" (right) and "dog": no answer is picked
    assert rows.loc["img_0", "answer_counts"][0] == 3 and rows.loc["img_5", "answer_counts"][15] == 1


def test_a_zero_probability_gives_a_finite_feature(tmp_path):
    data = write_imagenet16h_folder(tmp_path / "zero", num_images=16, true_probability=1.0)
    features = np.stack(_all_rows(load_imagenet16h(data["root"]))["features"].to_numpy())
    assert np.isfinite(features).all()
    assert features.min() == pytest.approx(math.log(1e-30), rel=1e-6) and features.max() == 0.0


def _break(root: Path, what: str) -> None:
    models = root / "model_probs_epoch10" / "noise95"
    answers = root / "human_predictions" / "noise95.csv"
    if what == "missing model file":
        (models / "vgg19.csv").unlink()
    elif what == "not a distribution":
        frame = pd.read_csv(models / "alexnet.csv")
        frame.loc[3, "knife"] += 0.2
        frame.to_csv(models / "alexnet.csv", index=False)
    elif what == "image missing from a model":
        pd.read_csv(models / "googlenet.csv").iloc[1:].to_csv(models / "googlenet.csv", index=False)
    elif what == "unknown category":
        frame = pd.read_csv(root / "imagenet16H.csv")
        frame.loc[2, "category"] = "zebra"
        frame.to_csv(root / "imagenet16H.csv", index=False)
    elif what == "repeated image":
        frame = pd.read_csv(root / "imagenet16H.csv")
        pd.concat([frame, frame.iloc[:1]]).to_csv(root / "imagenet16H.csv", index=False)
    elif what == "unknown answer":
        frame = pd.read_csv(answers)
        frame.loc[0, "participant_classification"] = "horse"
        frame.to_csv(answers, index=False)
    elif what == "answer for an unknown image":
        frame = pd.read_csv(answers)
        frame.loc[0, "image_name"] = "img_999"
        frame.to_csv(answers, index=False)
    elif what == "image nobody classified":
        frame = pd.read_csv(answers)
        frame[frame["image_name"] != "img_4"].to_csv(answers, index=False)
    elif what == "missing column":
        pd.read_csv(answers).drop(columns="participant_id").to_csv(answers, index=False)


@pytest.mark.parametrize("what, error, message", [
    ("missing model file", FileNotFoundError, r"probabilities of model 'vgg19' at noise 95"),
    ("not a distribution", ValueError, r"alexnet.csv.*sum to 1.*img_3"),
    ("image missing from a model", ValueError, r"googlenet.csv.*1 missing.*img_0"),
    ("unknown category", ValueError, r"imagenet16H.csv, column 'category': rows \[2\] hold \['zebra'\]"),
    ("repeated image", ValueError, r"lists an image more than once: \['img_0'\]"),
    ("unknown answer", ValueError, r"participant_classification.*\['horse'\]"),
    ("answer for an unknown image", ValueError, r"rows \[0\] name images.*img_999"),
    ("image nobody classified", ValueError, r"no participant classified 1 image.*img_4"),
    ("missing column", ValueError, r"missing \['participant_id'\]"),
])
def test_bad_files_are_named_in_the_error(tmp_path, what, error, message):
    data = write_imagenet16h_folder(tmp_path / "bad", num_images=16)
    _break(data["root"], what)
    with pytest.raises(error, match=message):
        load_imagenet16h(data["root"])


@pytest.mark.parametrize("kwargs, message", [
    ({"noise": 90}, r"`noise` must be one of the phase-noise levels \[80, 95, 110, 125\].*got 90"),
    ({"noise": True}, r"`noise` must be"),
    ({"noise": 80}, r"participant answers at noise 80|probabilities of model 'alexnet' at noise 80"),
    ({"models": "vgg19"}, r"`models` must be a non-empty list"),
    ({"models": ["vgg19", "vgg19"]}, r"distinct"),
    ({"models": ["mobilenet"]}, r"probabilities of model 'mobilenet'"),
    ({"seed": -1}, r"`seed` must be a non-negative int"),
    ({"split": (0.5, 0.5, 0.5)}, r"`split` fractions must sum to 1"),
])
def test_bad_arguments_are_named_in_the_error(folder, kwargs, message):
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        load_imagenet16h(folder["root"], **kwargs)


def test_a_path_that_is_not_the_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        load_imagenet16h(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match=r"no list of images and classes.*imagenet16H.csv"):
        load_imagenet16h(tmp_path)
    with pytest.raises(ValueError, match="`path` must be the ImageNet-16H folder"):
        load_imagenet16h(None)


def test_docstring_examples_run():
    assert doctest.testmod(imagenet16h_module, optionflags=doctest.ELLIPSIS).failed == 0
