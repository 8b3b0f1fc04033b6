"""The populations of `results/monitoring.md`: per input, what a deployed deferral model decides and estimates (its
deferral margin, the classifier's top probability, the chosen expert's estimated accuracy) and what is true (the
classifier's and the chosen expert's 0/1 losses), for an in-distribution population and a shifted one, from a model
trained and calibrated on in-distribution inputs only. The heads are those of `research.guarantees_data`
(`fit_head`, `fit_route_only_deferral`): cheap linear heads on fixed features."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Population:
    """What the model decides and estimates on each input of a population, and its true losses."""

    name: str
    margin: np.ndarray  # [N]: defer iff margin > threshold
    class_score: np.ndarray  # [N]: the classifier's estimated probability of its answer
    expert_score: np.ndarray  # [N]: the chosen expert's estimated accuracy
    expert: np.ndarray  # [N] int: the chosen expert
    loss_kept: np.ndarray  # [N] 0/1
    loss_deferred: np.ndarray  # [N] 0/1

    def at(self, threshold: float) -> dict[str, np.ndarray]:
        """Per input at a threshold: deferred, the label-free estimated error and the true system loss."""
        deferred = self.margin > threshold
        return {"deferred": deferred, "estimated": np.where(deferred, 1 - self.expert_score, 1 - self.class_score),
                "loss": np.where(deferred, self.loss_deferred, self.loss_kept), "expert": self.expert}


@dataclass
class Setting:
    """A model, the calibration inputs it was certified on, and the populations of its streams."""

    name: str
    description: str
    expert_names: list[str]
    calibration: Population
    populations: dict[str, Population]
    details: dict[str, Any] = field(default_factory=dict)


def _population(name: str, logits: np.ndarray, labels: np.ndarray, correct: np.ndarray, k: int) -> Population:
    import torch

    from hf_defer.modeling.surrogates import get_surrogate

    scorer = get_surrogate("asm", k, correct.shape[1])
    t = torch.as_tensor(logits)
    probs, accuracy = (a.double().numpy() for a in scorer.probabilities(t))
    margin, expert = (a.numpy() for a in scorer.deferral_margin(t))
    rows = np.arange(len(labels))
    return Population(name, margin.astype(np.float64), probs.max(axis=1), accuracy[rows, expert], expert,
                      (probs.argmax(axis=1) != labels).astype(np.float64), 1.0 - correct[rows, expert])


def imagenet16h_setting(path: str, shifted: list[int], seed: int = 0, epochs: float = 100,
                        train_images: int = 600, calibration_images: int = 200, learning_rate: float = 1e-2) -> Setting:
    """ImageNet-16H: an A-SM head on the CNNs' log-probabilities trained on `train_images` images at noise 80 (one
    participant per image as the expert), calibrated on `calibration_images` others at noise 80; the populations are
    the remaining images at noise 80 and at each `shifted` level (the same images, noisier). The learning rate is ten
    times the paper's (1e-2): with 600 images and 1e-3 the head underfits and its estimates are far from calibrated
    (estimated error 0.22 where the true one is 0.08)."""
    import datasets

    from hf_defer.data.imagenet16h import IMAGENET16H_LABELS, load_imagenet16h
    from .guarantees_data import fit_head
    from .table2_imagenet16h import imagenet16h_protocol

    k = len(IMAGENET16H_LABELS)
    protocol = dataclasses.replace(imagenet16h_protocol(epochs), learning_rate=learning_rate)

    def level(noise: int) -> dict[str, np.ndarray]:
        full = datasets.concatenate_datasets(list(load_imagenet16h(path, noise=noise, seed=seed).values()))
        table = full.with_format("numpy", columns=["image_name", "features", "labels", "expert_labels"])[:]
        order = np.argsort(table["image_name"])
        return {key: np.asarray(value)[order] for key, value in table.items()}

    base = level(80)
    perm = np.random.default_rng(seed).permutation(len(base["labels"]))
    train, cal, rest = (perm[:train_images], perm[train_images:train_images + calibration_images],
                        perm[train_images + calibration_images:])

    def correct(table: dict[str, np.ndarray]) -> np.ndarray:
        return (table["expert_labels"].reshape(-1, 1) == table["labels"][:, None]).astype(np.float32)

    logits = fit_head(base["features"][train], base["labels"][train], correct(base)[train], k, seed,
                      protocol, np.concatenate([base["features"][cal], base["features"][rest]]),
                      optim="adamw_torch", optim_args=None)
    calibration = _population("calibration", logits[:len(cal)], base["labels"][cal], correct(base)[cal], k)
    populations = {"noise 80": _population("noise 80", logits[len(cal):], base["labels"][rest],
                                           correct(base)[rest], k)}
    for noise in shifted:
        table = level(noise)
        assert (table["image_name"] == base["image_name"]).all()
        scored = fit_head(base["features"][train], base["labels"][train], correct(base)[train], k, seed,
                          protocol, table["features"][rest], optim="adamw_torch", optim_args=None)
        populations[f"noise {noise}"] = _population(f"noise {noise}", scored, table["labels"][rest],
                                                    correct(table)[rest], k)
    return Setting("ImageNet-16H", f"A-SM head on the five CNNs' log-probabilities, trained on {train_images} images "
                   f"at noise 80, calibrated on {calibration_images} others; populations: the other {len(rest)} images "
                   "at each noise level; expert: one participant per image", ["participant"], calibration,
                   populations, {"train": train_images, "calibration": calibration_images, "pool": len(rest)})


def hatespeech_setting(seed: int = 0, epochs: float = 50, train_rows: int = 8000,
                       calibration_rows: int = 3000) -> Setting:
    """HateSpeech (shipped): an A-SM head on TF-IDF + SVD features of the tweets (no neural encoder: cheap), one
    random annotator as the expert; trained on `train_rows` tweets, calibrated on `calibration_rows` others, the
    population is the rest (no shift)."""
    import datasets

    from hf_defer.data.hatespeech import load_hatespeech
    from .guarantees_data import fit_head, tfidf_features
    from .table2_hatespeech import Protocol

    full = datasets.concatenate_datasets(list(load_hatespeech(seed=seed).values()))
    labels = np.asarray(full["labels"])
    expert = np.asarray(full["expert_labels"]).reshape(len(labels))
    perm = np.random.default_rng(seed).permutation(len(labels))
    train, cal, rest = perm[:train_rows], perm[train_rows:train_rows + calibration_rows], perm[train_rows +
                                                                                               calibration_rows:]
    features = tfidf_features(list(full["text"]), train, seed=seed)
    correct = (expert == labels).astype(np.float32)[:, None]
    logits = fit_head(features[train], labels[train], correct[train], 3, seed, Protocol(epochs=epochs),
                      features[np.concatenate([cal, rest])])
    return Setting("HateSpeech", f"A-SM head on TF-IDF + SVD features, trained on {train_rows} tweets, calibrated on "
                   f"{calibration_rows}, population: the other {len(rest)}; expert: one random annotator",
                   ["annotator"], _population("calibration", logits[:len(cal)], labels[cal], correct[cal], 3),
                   {"no shift": _population("no shift", logits[len(cal):], labels[rest], correct[rest], 3)},
                   {"train": train_rows, "calibration": calibration_rows, "pool": len(rest)})


STEM = ("abstract_algebra", "anatomy", "astronomy", "college_biology", "college_chemistry", "college_computer_science",
        "college_mathematics", "college_physics", "computer_security", "conceptual_physics", "electrical_engineering",
        "elementary_mathematics", "high_school_biology", "high_school_chemistry", "high_school_computer_science",
        "high_school_mathematics", "high_school_physics", "high_school_statistics", "machine_learning",
        "college_medicine", "clinical_knowledge", "medical_genetics", "professional_medicine", "virology",
        "nutrition", "human_aging")


def mmlu_setting(seed: int = 0, train_rows: int = 3000, calibration_rows: int = 1500) -> Setting:
    """MMLU routing (RouteLLM's data, shipped): Mixtral answers unless the route-only model sends the question to
    GPT-4. Trained and calibrated on the humanities and social-science subjects only; the populations are the rest
    of those, and the STEM and medical subjects (`STEM`)."""
    from hf_defer.data.routellm_mmlu import load_routellm_mmlu
    from .guarantees_data import tfidf_features
    from .mmlu_routing import fit_route_only_deferral

    data = load_routellm_mmlu()
    subject = np.asarray(data["subject"])
    stem = np.isin(np.char.lower(subject.astype(str)), STEM)
    correct = np.stack([np.asarray(data["mixtral-8x7b-instruct"]), np.asarray(data["gpt-4-1106-preview"])],
                       axis=1).astype(np.float64)
    other = np.random.default_rng(seed).permutation(np.flatnonzero(~stem))
    train, cal, rest = other[:train_rows], other[train_rows:train_rows + calibration_rows], other[train_rows +
                                                                                                   calibration_rows:]
    features = tfidf_features(list(data["prompt"]), train, seed=seed)
    estimate = fit_route_only_deferral(features[train], correct[train], seed)

    def population(name: str, rows: np.ndarray) -> Population:
        a = np.asarray(estimate(features[rows]), dtype=np.float64)
        margin = a[:, 1] - a[:, 0]
        # kept: Mixtral answers (its estimated accuracy is the "class score"); deferred: GPT-4
        return Population(name, margin, a[:, 0], a[:, 1], np.zeros(len(rows), dtype=np.int64),
                          1 - correct[rows, 0], 1 - correct[rows, 1])

    return Setting("MMLU routing", f"route-only model on TF-IDF + SVD features, trained on {train_rows} humanities / "
                   f"social-science questions, calibrated on {calibration_rows}; populations: the other "
                   f"{len(rest)} of those, and the {int(stem.sum())} STEM and medical questions; keep = Mixtral, "
                   "defer = GPT-4", ["gpt4"], population("calibration", cal),
                   {"humanities": population("humanities", rest), "STEM": population("STEM", np.flatnonzero(stem))},
                   {"train": train_rows, "calibration": calibration_rows})
