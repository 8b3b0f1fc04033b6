"""The data sets of `results/guarantees.md` as [`Pool`]s: per input the deferral margin and the 0/1 losses of the
classifier and of the chosen expert, from models that never saw the input (see `research.guarantees_draws`)."""

from __future__ import annotations

import tempfile
from typing import Any

import numpy as np

from hf_defer.modeling.surrogate_base import IGNORE_INDEX
from .guarantees_draws import Pool

def fit_head(features: np.ndarray, labels: np.ndarray, expert_correct: np.ndarray, num_labels: int, seed: int,
             protocol: Any, score_features: np.ndarray, **overrides: Any) -> np.ndarray:
    """Train a linear A-SM head (`EncoderForDeferral` on features, [`DeferralTrainer`], `protocol` as in
    `research.table2_hatespeech`; `expert_correct` `[N, M]`, -100 where an expert did not answer) and return
    its logits on `score_features`."""
    import datasets
    import torch
    import transformers
    from transformers import PrinterCallback

    from hf_defer.modeling.configuration_deferral import DeferralConfig
    from hf_defer.modeling.modeling_deferral import EncoderForDeferral
    from hf_defer.training.trainer import DeferralTrainer
    from .table2_hatespeech import training_arguments

    train = datasets.Dataset.from_dict({"features": features.astype(np.float32), "labels": labels.astype(np.int64),
                                        "expert_correct": expert_correct.astype(np.float32)}).with_format("numpy")
    transformers.set_seed(seed)
    config = DeferralConfig(feature_size=features.shape[1], num_labels=num_labels,
                            num_experts=expert_correct.shape[1], surrogate="asm")
    model, threads = EncoderForDeferral(config), torch.get_num_threads()
    with tempfile.TemporaryDirectory() as workdir:
        torch.set_num_threads(protocol.threads or threads)
        trainer = DeferralTrainer(model=model, args=training_arguments(workdir, seed, protocol, **overrides),
                                  train_dataset=train)
        trainer.remove_callback(PrinterCallback)
        trainer.train()
        torch.set_num_threads(threads)
    model.eval()
    with torch.no_grad():
        return model(features=torch.as_tensor(score_features, dtype=torch.float32)).logits.double().numpy()


def margins_and_losses(logits: np.ndarray, labels: np.ndarray, expert_correct: np.ndarray, num_labels: int,
                       seed: int = 0) -> tuple[np.ndarray, ...]:
    """A-SM margins (`deferral_margin`, over the experts who answered; -inf where nobody did), the classifier's 0/1
    loss and the chosen expert's (a correctness of 1/2, where the others tie, is drawn once as a fair coin), and the
    model's predictions of both losses (1 - its probability of its answer; 1 - the chosen expert's estimated
    accuracy), which the prediction-powered rule spends on unlabelled inputs."""
    import torch

    from hf_defer.modeling.surrogates import get_surrogate

    available = expert_correct != IGNORE_INDEX
    scorer = get_surrogate("asm", num_labels, expert_correct.shape[1])
    margin, expert = scorer.deferral_margin(torch.as_tensor(logits), available=None if available.all() else available)
    margin, expert = margin.numpy(), expert.numpy()
    loss_kept = (logits[:, :num_labels].argmax(axis=1) != labels).astype(np.float64)
    chosen = expert_correct[np.arange(len(labels)), expert].astype(np.float64)
    coin = np.random.default_rng([seed, 30]).random(len(labels)) < 0.5
    chosen = np.where(chosen == 0.5, coin.astype(np.float64), chosen)
    loss_deferred = np.where(np.isneginf(margin) | (chosen == IGNORE_INDEX), loss_kept, 1.0 - chosen)
    class_probs, accuracy = (t.double().numpy() for t in scorer.probabilities(torch.as_tensor(logits)))
    predicted_kept = 1.0 - class_probs.max(axis=1)
    predicted_deferred = np.where(np.isneginf(margin), predicted_kept,
                                  1.0 - accuracy[np.arange(len(labels)), expert])
    return margin, loss_kept, loss_deferred, predicted_kept, predicted_deferred


def _cross_fit(features: np.ndarray, labels: np.ndarray, correct: np.ndarray, num_labels: int, seed: int,
               protocol: Any, folds: int, **overrides: Any) -> np.ndarray:
    """Out-of-fold logits: each of `folds` random folds scored by a head trained on the others."""
    fold = np.random.default_rng(seed).permutation(len(labels)) % folds
    logits = None
    for k in range(folds):
        out = fit_head(features[fold != k], labels[fold != k], correct[fold != k], num_labels, seed + k, protocol,
                       features[fold == k], **overrides)
        logits = np.zeros((len(labels), out.shape[1])) if logits is None else logits
        logits[fold == k] = out
    return logits


def pool_hatespeech(seed: int = 0, train_size: int = 6000, epochs: float = 50, cache_dir: str | None = None,
                    max_rows: int | None = None) -> Pool:
    """HateSpeech: an A-SM head on MiniLM embeddings trained on `train_size` random tweets (the random-annotator
    expert, the protocol of Cao et al.); the pool is every other tweet."""
    import datasets

    from .table2_hatespeech import Protocol, load_splits

    full = datasets.concatenate_datasets(list(load_splits(seed, cache_dir=cache_dir, show_progress=False).values()))
    table = full.with_format("numpy", columns=["features", "labels", "expert_labels"])[:]
    order = np.random.default_rng(seed).permutation(len(full))[:max_rows]
    train, pool = order[:train_size], order[train_size:]
    labels = table["labels"]
    correct = (np.asarray(table["expert_labels"]).reshape(len(labels), -1) == labels[:, None]).astype(np.float32)
    logits = fit_head(table["features"][train], labels[train], correct[train], 3, seed, Protocol(epochs=epochs),
                      table["features"][pool])
    *arrays, predicted_kept, predicted_deferred = margins_and_losses(logits, labels[pool], correct[pool], 3, seed)
    return Pool("HateSpeech", *arrays, f"A-SM head on MiniLM embeddings, trained on {len(train):,} tweets; the pool is "
                f"the other {len(pool):,}; expert: one random annotator", {"train": len(train)}, predicted_kept,
                predicted_deferred)


def pool_convabuse(seed: int = 0, folds: int = 5, epochs: float = 50, cache_dir: str | None = None,
                   max_rows: int | None = None) -> Pool:
    """ConvAbuse: A-SM heads with the 8 annotators as masked experts (scored against the others' majority, as in
    `research.convabuse_annotators`) on MiniLM embeddings of the turn and its context, cross-fitted over all
    labelled items of the three splits (the data set is too small to set a separate training part aside)."""
    from .convabuse_annotators import load_data
    from .table2_hatespeech import Protocol

    data = load_data(cache_dir=cache_dir, show_progress=False, max_rows=max_rows)
    names = list(data.features)
    features = np.concatenate([data.features[name] for name in names])
    labels = np.concatenate([data.targets["leave_one_out"][name][0] for name in names])
    correct = np.concatenate([data.targets["leave_one_out"][name][1] for name in names])
    keep = labels != IGNORE_INDEX
    features, labels, correct = features[keep], labels[keep], correct[keep]
    logits = _cross_fit(features, labels, correct, 2, seed, Protocol(epochs=epochs), folds)
    *arrays, predicted_kept, predicted_deferred = margins_and_losses(logits, labels, correct, 2, seed)
    nobody = float(np.isneginf(arrays[0]).mean())
    return Pool("ConvAbuse", *arrays, f"A-SM heads, 8 annotators as masked experts, {folds}-fold cross-fitted over "
                f"{len(labels):,} labelled items ({100 * nobody:.1f} % with no annotator to ask: never deferred)",
                {"folds": folds, "nobody_available": nobody}, predicted_kept, predicted_deferred)


def pool_imagenet16h(path: str, noise: int, seed: int = 0, folds: int = 5, epochs: float = 100) -> Pool:
    """ImageNet-16H at one noise level: A-SM heads on the five CNNs' log-probabilities (the protocol of
    `research.table2_imagenet16h`), one participant per image as the expert, cross-fitted over the 1,200 images."""
    import datasets

    from hf_defer.data.imagenet16h import IMAGENET16H_LABELS, load_imagenet16h
    from .table2_imagenet16h import imagenet16h_protocol

    full = datasets.concatenate_datasets(list(load_imagenet16h(path, noise=noise, seed=seed).values()))
    table = full.with_format("numpy", columns=["features", "labels", "expert_labels"])[:]
    labels, k = table["labels"], len(IMAGENET16H_LABELS)
    correct = (np.asarray(table["expert_labels"]).reshape(-1, 1) == labels[:, None]).astype(np.float32)
    logits = _cross_fit(table["features"], labels, correct, k, seed, imagenet16h_protocol(epochs), folds,
                        optim="adamw_torch", optim_args=None)
    *arrays, predicted_kept, predicted_deferred = margins_and_losses(logits, labels, correct, k, seed)
    return Pool(f"ImageNet-16H, noise {noise}", *arrays,
                f"A-SM heads on the CNNs' log-probabilities, {folds}-fold cross-fitted over {len(labels):,} images; "
                "expert: one participant per image", {"folds": folds, "noise": noise}, predicted_kept,
                predicted_deferred)


def tfidf_features(texts: list[str], train: np.ndarray, dimensions: int = 256, seed: int = 0) -> np.ndarray:
    """Dense features of `texts` without a neural encoder: TF-IDF of words and word pairs, reduced to `dimensions` by
    a truncated SVD, both fitted on the rows `train` only, each row scaled to unit length (scikit-learn)."""
    from sklearn.decomposition import TruncatedSVD
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.preprocessing import normalize

    vectorizer = TfidfVectorizer(ngram_range=(1, 2), min_df=2, sublinear_tf=True)
    svd = TruncatedSVD(dimensions, random_state=seed)
    svd.fit(vectorizer.fit_transform([texts[i] for i in train]))
    return normalize(svd.transform(vectorizer.transform(texts))).astype(np.float32)


def pool_mmlu(seed: int = 0, train_size: int = 4000, encoder: str = "tfidf", cache_dir: str | None = None,
              max_rows: int | None = None) -> Pool:
    """MMLU routing (RouteLLM's data): Mixtral answers unless the route-only deferral model
    (`research.mmlu_routing.fit_route_only_deferral`, trained on `train_size` random questions) sends the
    question to GPT-4; the margin is a_GPT-4 - a_Mixtral, so a budget caps GPT-4 calls. The questions' features are
    [`tfidf_features`] (`encoder="tfidf"`), or the embeddings of a sentence encoder (its name; cached on disk)."""
    from hf_defer.data.routellm_mmlu import load_routellm_mmlu
    from .mmlu_routing import fit_route_only_deferral, mmlu_routing_data

    data = load_routellm_mmlu()
    if max_rows is not None and max_rows < data.num_rows:
        data = data.select(np.sort(np.random.default_rng(seed).choice(data.num_rows, max_rows, replace=False)))
    correct = np.stack([np.asarray(data["mixtral-8x7b-instruct"]), np.asarray(data["gpt-4-1106-preview"])],
                       axis=1).astype(np.float32)
    order = np.random.default_rng(seed).permutation(len(correct))
    train, pool = order[:train_size], order[train_size:]
    if encoder == "tfidf":
        features = tfidf_features(list(data["prompt"]), train, seed=seed)
    else:
        features = mmlu_routing_data(max_rows, seed, encoder, cache_dir=cache_dir)[1]
    estimate = fit_route_only_deferral(features[train], correct[train], seed)(features[pool])
    what = "TF-IDF + SVD (256 dimensions)" if encoder == "tfidf" else f"{encoder} embeddings"
    return Pool("MMLU routing", estimate[:, 1] - estimate[:, 0], 1.0 - correct[pool, 0], 1.0 - correct[pool, 1],
                f"route-only deferral model on {what} of the question, trained on {len(train):,} questions; the pool "
                f"is the other {len(pool):,}; keep = Mixtral answers, defer = a GPT-4 call",
                {"train": len(train), "encoder": encoder}, np.clip(1.0 - estimate[:, 0], 0, 1),
                np.clip(1.0 - estimate[:, 1], 0, 1))
