"""The HateSpeech protocol of Cao et al. (NeurIPS 2023, Table 2), as `DeferralTrainer` runs.

The expert is one random annotator per tweet; each run re-splits the data 70/10/20 at random; tweets are embedded
once into 384-d sentence embeddings; a linear head with K + 1 = 4 outputs is trained for 50 epochs with SGD
(momentum 0.9, learning rate 0.1, cosine annealing, batch 128, no weight decay) and evaluated on the test split. The
seed of a run drives the split, the expert draw and the initialisation.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import datasets
import numpy as np
import torch
import transformers
from transformers import PrinterCallback, TrainingArguments

from hf_defer.modeling.configuration_deferral import DeferralConfig
from hf_defer.data.hatespeech import HATESPEECH_LABELS, load_hatespeech
from hf_defer.experts.embeddings import DEFAULT_SENTENCE_ENCODER, add_embeddings
from hf_defer.experts.simulated import class_subset_expert, dialect_biased_expert, stack_experts
from hf_defer.evaluation.metrics import deferral_metrics
from hf_defer.modeling.modeling_deferral import EncoderForDeferral
from hf_defer.modeling.surrogates import get_surrogate
from hf_defer.training.trainer import DeferralTrainer

TABLE2_SURROGATES: tuple[str, ...] = ("ssm", "sova", "aova", "asm")
"""The surrogates in the row order of the paper's Table 2."""
EXPERT_COLUMNS: tuple[str, ...] = ("annotator", "dialect_biased", "hate_specialist")
"""The experts of the three-expert experiment, in expert order."""
DEFAULT_ENCODER = DEFAULT_SENTENCE_ENCODER


@dataclass
class Protocol:
    """Hyper-parameters of the linear-head protocol (the paper's appendix, "Details of Model and Optimizer")."""

    epochs: float = 50
    batch_size: int = 128
    learning_rate: float = 0.1
    momentum: float = 0.9
    max_train: int | None = None  # subsample the training split (for --quick)
    verbose: bool = False
    threads: int | None = 1  # torch threads while training a head: its ops are tiny, more threads only add waiting


@dataclass
class RunResult:
    """Outcome of one training run evaluated on a test split."""

    metrics: dict[str, Any]
    expert_accuracy: np.ndarray  # [N, M] estimated
    experts_right: np.ndarray  # [N, M] bool
    defer: np.ndarray  # [N] bool
    expert: np.ndarray  # [N] chosen expert
    system_right: np.ndarray  # [N] bool: the deferral system's answer (classifier or chosen expert) is right
    train_seconds: float
    extra: dict[str, Any] = field(default_factory=dict)


def training_arguments(output_dir: str, seed: int, protocol: Protocol, **overrides: Any) -> TrainingArguments:
    """TrainingArguments of the paper's protocol, tuned for speed on CPU.

    SGD with momentum (`optim="sgd"`, `optim_args="momentum=0.9"`), cosine annealing to zero over all steps without
    warm-up, no weight decay; no evaluation, checkpoint or logging during training; single-process data loading.

    Args:
        output_dir (`str`): Trainer output folder (nothing is saved there with these settings).
        seed (`int`): seed of the data order.
        protocol (`Protocol`): epochs, batch size, learning rate, momentum, verbosity.
        overrides: any other `TrainingArguments` field.

    Returns:
        `TrainingArguments`.

    Example:

    ```python
    >>> args = training_arguments("/tmp/out", 0, Protocol(epochs=1))
    >>> args.optim.value, args.lr_scheduler_type.value, args.per_device_train_batch_size
    ('sgd', 'cosine', 128)

    ```
    """
    settings: dict[str, Any] = dict(
        output_dir=output_dir,
        seed=seed,
        num_train_epochs=protocol.epochs,
        per_device_train_batch_size=protocol.batch_size,
        per_device_eval_batch_size=1024,
        learning_rate=protocol.learning_rate,
        optim="sgd",
        optim_args=f"momentum={protocol.momentum}",
        lr_scheduler_type="cosine",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=0.0,  # the paper's plain SGD loop does not clip gradients
        eval_strategy="no",
        save_strategy="no",
        logging_strategy="no" if not protocol.verbose else "epoch",
        report_to="none",
        use_cpu=True,
        disable_tqdm=not protocol.verbose,
        dataloader_num_workers=0,
        dataloader_pin_memory=False,
    )
    settings.update(overrides)
    return TrainingArguments(**settings)


def load_splits(
    seed: int,
    data: str | None = None,
    encoder: str = DEFAULT_ENCODER,
    cache_dir: str | None = None,
    show_progress: bool = True,
) -> datasets.DatasetDict:
    """HateSpeech split by `seed`, with the random-annotator expert and a `features` column of sentence embeddings.

    Args:
        seed (`int`): seed of the 70/10/20 split and of the expert draw.
        data (`str`, *optional*): the Davidson CSV or a folder holding it; defaults to the copy shipped in hf_defer.
        encoder (`str`, *optional*): sentence encoder (name or folder).
        cache_dir (`str`, *optional*): embedding cache folder (default: `~/.cache/hf_defer/experts/embeddings`).
        show_progress (`bool`, *optional*, defaults to True): progress bar while embedding (first run only).

    Returns:
        `datasets.DatasetDict` with `train`, `validation`, `test`.
    """
    splits = load_hatespeech(data, seed=seed)
    return add_embeddings(splits, encoder, cache_dir=cache_dir, show_progress_bar=show_progress)


def evaluate_logits(logits: np.ndarray, test: datasets.Dataset, surrogate: str, num_experts: int = 1) -> RunResult:
    """Metrics, reliability data and per-example decisions from test logits (`train_seconds` is left at 0)."""
    table = test.with_format("numpy", columns=["labels", "expert_labels"])[:]
    labels, expert_labels = table["labels"], np.asarray(table["expert_labels"])
    metrics = deferral_metrics(logits, labels, expert_labels, surrogate, num_experts, return_reliability=True)
    scorer = get_surrogate(surrogate, logits.shape[1] - num_experts, num_experts)
    logits_t = torch.as_tensor(logits, dtype=torch.float32)
    _, accuracy = scorer.probabilities(logits_t)
    defer, prediction, expert = (t.numpy() for t in scorer.decide(logits_t))
    right = expert_labels.reshape(len(labels), num_experts) == labels[:, None]
    system_right = np.where(defer, right[np.arange(len(labels)), expert], prediction == labels)
    return RunResult(metrics, accuracy.numpy(), right, defer, expert, system_right, 0.0)


def _fit_and_predict(trainer: DeferralTrainer, test: datasets.Dataset) -> tuple[np.ndarray, float]:
    """Trains, then returns the test logits and the training seconds."""
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    logits = trainer.predict(test).predictions
    logits = logits[0] if isinstance(logits, (tuple, list)) else logits
    return np.asarray(logits), seconds


def train_head(
    splits: datasets.DatasetDict,
    surrogate: str,
    seed: int,
    protocol: Protocol,
    num_experts: int = 1,
    expert_names: list[str] | None = None,
) -> RunResult:
    """Train a linear deferral head on `features` with [`DeferralTrainer`] and evaluate it on `splits["test"]`.

    Args:
        splits (`datasets.DatasetDict`): `train` and `test` with `features`, `labels`, `expert_labels`.
        surrogate (`str`): `"asm"`, `"ssm"`, `"sova"` or `"aova"`.
        seed (`int`): seed of the initialisation and the data order.
        protocol (`Protocol`): hyper-parameters.
        num_experts (`int`, *optional*, defaults to 1): number of experts M.
        expert_names (`list[str]`, *optional*): names of the experts.

    Returns:
        `RunResult`.
    """
    columns = ["features", "labels", "expert_labels"]
    train = splits["train"]
    if protocol.max_train is not None and len(train) > protocol.max_train:
        train = train.shuffle(seed=seed).select(range(protocol.max_train))
    train, test = train.select_columns(columns), splits["test"].select_columns(columns)
    transformers.set_seed(seed)
    config = DeferralConfig(feature_size=len(train[0]["features"]), num_labels=len(HATESPEECH_LABELS),
                            num_experts=num_experts, surrogate=surrogate,
                            id2label=dict(enumerate(HATESPEECH_LABELS)), expert_names=expert_names)
    model = EncoderForDeferral(config)
    threads = torch.get_num_threads()
    with tempfile.TemporaryDirectory() as workdir:
        torch.set_num_threads(protocol.threads or threads)
        trainer = DeferralTrainer(model=model, args=training_arguments(workdir, seed, protocol),
                                  train_dataset=train.with_format("numpy"))  # a head-only dataset: the fast path
        if not protocol.verbose:
            trainer.remove_callback(PrinterCallback)  # it prints the final training summary even with logging off
        logits, seconds = _fit_and_predict(trainer, test)
        torch.set_num_threads(threads)
    result = evaluate_logits(logits, test, surrogate, num_experts)
    result.train_seconds = seconds
    return result


def finetune_encoder(
    splits: datasets.DatasetDict,
    encoder_path: str,
    seed: int,
    train_size: int | None = 8000,
    max_length: int = 64,
    epochs: float = 1.0,
    learning_rate: float = 1e-4,
    batch_size: int = 32,
    test_size: int | None = None,
    verbose: bool = False,
) -> RunResult:
    """Fine-tune `encoder_path` end to end with A-SM on a subsample of `splits["train"]`; evaluate on the test split.

    Args:
        splits (`datasets.DatasetDict`): `train` and `test` with `text`, `labels`, `expert_labels`.
        encoder_path (`str`): a folder `AutoModel` and `AutoTokenizer` load.
        seed (`int`): seed of the subsample, the head initialisation and the data order.
        train_size (`int`, *optional*): training tweets to use (None: all).
        max_length (`int`, *optional*, defaults to 64): truncation length in tokens.
        epochs (`float`, *optional*, defaults to 1.0): training epochs.
        learning_rate (`float`, *optional*, defaults to 1e-4): AdamW learning rate.
        batch_size (`int`, *optional*, defaults to 32): training batch size.
        test_size (`int`, *optional*): test tweets to evaluate (None: all).
        verbose (`bool`, *optional*, defaults to False): Trainer progress bars and logs.

    Returns:
        `RunResult`, with the training and test subsets in `extra["train"]`, `extra["test"]`.
    """
    from transformers import AutoTokenizer

    train = splits["train"].shuffle(seed=seed)
    if train_size is not None:
        train = train.select(range(min(train_size, len(train))))
    test = splits["test"] if test_size is None else splits["test"].select(range(min(test_size, len(splits["test"]))))
    tokenizer = AutoTokenizer.from_pretrained(encoder_path)

    def tokenize(batch: dict[str, list]) -> dict[str, list]:
        return tokenizer(batch["text"], truncation=True, max_length=max_length)

    keep = ["input_ids", "attention_mask", "token_type_ids", "labels", "expert_labels"]
    train_tokens, test_tokens = (part.map(tokenize, batched=True) for part in (train, test))
    train_tokens, test_tokens = (part.select_columns([c for c in keep if c in part.column_names])
                                 for part in (train_tokens, test_tokens))
    transformers.set_seed(seed)
    model = EncoderForDeferral.from_encoder_pretrained(
        encoder_path, num_labels=len(HATESPEECH_LABELS), surrogate="asm", pooling="mean",
        id2label=dict(enumerate(HATESPEECH_LABELS)))
    with tempfile.TemporaryDirectory() as workdir:
        args = training_arguments(
            workdir, seed, Protocol(epochs=epochs, batch_size=batch_size, learning_rate=learning_rate, verbose=verbose),
            optim="adamw_torch", optim_args=None, lr_scheduler_type="linear", warmup_steps=0.1, weight_decay=0.01,
            max_grad_norm=1.0, per_device_eval_batch_size=64)
        trainer = DeferralTrainer(model=model, args=args, train_dataset=train_tokens, processing_class=tokenizer)
        logits, seconds = _fit_and_predict(trainer, test_tokens)
    result = evaluate_logits(logits, test, "asm")
    result.train_seconds = seconds
    result.extra = {"train": train, "test": test}
    return result


def estimate_errors(estimate: np.ndarray, true: np.ndarray) -> dict[str, float]:
    """How far estimated expert accuracies are from the true ones, per tweet and as distributions.

    Returns `mae`, the mean absolute error per tweet (the true accuracy of a random annotator is known on
    HateSpeech), and `wasserstein`, the 1-Wasserstein distance between the two distributions (what Figure 3 of the
    paper compares by eye). Estimates are clipped to [0, 1] first, as for the metrics.

    Example:

    ```python
    >>> estimate_errors(np.array([0.5, 1.0]), np.array([1.0, 0.5]))
    {'mae': 0.5, 'wasserstein': 0.0}

    ```
    """
    from scipy import stats

    estimate = np.clip(np.asarray(estimate, dtype=np.float64), 0.0, 1.0)
    true = np.asarray(true, dtype=np.float64)
    if estimate.shape != true.shape or estimate.ndim != 1 or estimate.size == 0:
        raise ValueError(f"estimate and true must be non-empty 1-d arrays of one shape, got {estimate.shape} and {true.shape}.")
    return {"mae": float(np.mean(np.abs(estimate - true))),
            "wasserstein": float(stats.wasserstein_distance(estimate, true))}


def add_three_experts(splits: datasets.DatasetDict, aae_of: dict[str, bool], seed: int, p_aae: float,
                      p_other: float, specialist_p: float) -> datasets.DatasetDict:
    """Give every split the three experts of the multi-expert experiment, as `expert_labels` of width 3.

    Expert 0 is the random annotator already in `expert_labels`; expert 1 is right with probability `p_aae` on
    tweets TwitterAAE flags as African-American English and `p_other` elsewhere (uniformly random otherwise);
    expert 2 knows only the hate-speech class (right with probability `specialist_p` on it, random elsewhere).
    The original columns stay: `annotator`, `dialect_biased`, `hate_specialist` and the flag `aae`.

    Args:
        splits (`datasets.DatasetDict`): HateSpeech splits with `text`, `labels`, `expert_labels`.
        aae_of (`dict[str, bool]`): AAE flag of every tweet text.
        seed (`int`): seed of the simulated experts.
        p_aae, p_other (`float`): accuracy parameters of the dialect-biased expert.
        specialist_p (`float`): accuracy parameter of the hate-speech specialist.

    Returns:
        `datasets.DatasetDict`.
    """
    rng = np.random.default_rng([seed, 2023])
    out = {}
    for name, split in splits.items():
        split = split.rename_column("expert_labels", "annotator")
        split = split.add_column("aae", [aae_of[text] for text in split["text"]])
        split = dialect_biased_expert(split, "aae", len(HATESPEECH_LABELS), p_aae, p_other, seed=rng,
                                      column="dialect_biased")
        split = class_subset_expert(split, len(HATESPEECH_LABELS), k=1, p=specialist_p, seed=rng,
                                    column="hate_specialist")
        out[name] = stack_experts(split, list(EXPERT_COLUMNS), remove_columns=False)
    return datasets.DatasetDict(out)
