"""The three HateSpeech experiments of `scripts/reproduce_hatespeech.py`, each writing its JSON record and report.

* [`run_table2`]: every surrogate x every seed (the paper's Table 2), with the figures;
* [`run_multi_expert`]: A-SM with three experts (one biased against African-American English) against each alone;
* [`run_finetune`]: end-to-end fine-tuning of the encoder against the frozen linear-head protocol.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import torch
import transformers
from tqdm.auto import tqdm

from hf_defer.data.hatespeech import HATESPEECH_LABELS, default_hatespeech_source
from hf_defer.data.imagenet16h import IMAGENET16H_NOISE_LEVELS
from hf_defer.experts.embeddings import resolve_sentence_encoder
from hf_defer.experts.simulated import annotator_accuracy
from hf_defer.evaluation.plotting import plot_estimate_histograms
from hf_defer.modeling.surrogates import SURROGATES
from .table2_hatespeech import (DEFAULT_ENCODER, EXPERT_COLUMNS, TABLE2_SURROGATES, Protocol, RunResult, add_three_experts,
                         estimate_errors, finetune_encoder, load_splits, train_head)
from .reporting import display_name, finetune_markdown, multi_expert_markdown, plot_table2_reliability, table2_markdown

_QUICK_SEEDS = [0, 1]


@dataclass
class ReproductionArguments:
    """Options of `scripts/reproduce_hatespeech.py` (parsed with `transformers.HfArgumentParser`).

    `quick=True` shrinks the settings for a smoke run (2 seeds unless given, 1 epoch, tiny fine-tuning).

    Example:

    ```python
    >>> ReproductionArguments(quick=True).seeds, ReproductionArguments(quick=True).epochs
    ([0, 1], 1.0)

    ```
    """

    seeds: list[int] = field(default_factory=lambda: [0, 1, 2, 3, 4], metadata={"help": "one run per seed"})
    epochs: float = field(default=50.0, metadata={"help": "training epochs of the linear head"})
    surrogates: list[str] = field(default_factory=lambda: list(TABLE2_SURROGATES),
                                  metadata={"choices": list(SURROGATES), "help": "surrogates of the Table 2 runs"})
    output_dir: str = field(default="results", metadata={"help": "where results are written"})
    data: str | None = field(default=None, metadata={"help": "labeled_data.csv or its folder (default: shipped)"})
    encoder: str = field(default=DEFAULT_ENCODER, metadata={"help": "sentence encoder"})
    cache_dir: str | None = field(default=None, metadata={"help": "embedding cache (default ~/.cache/hf_defer)"})
    quick: bool = field(default=False, metadata={"help": "tiny settings for a smoke run"})
    skip_main: bool = field(default=False, metadata={"help": "skip the Table 2 runs"})
    multi_expert: bool = field(default=False, metadata={"help": "also run the three-expert experiment"})
    twitteraae: str | None = field(default=None,
                                   metadata={"help": "TwitterAAE model folder (default: research/data/twitteraae)"})
    p_aae: float = field(default=0.6, metadata={"help": "dialect-biased expert: accuracy parameter on AAE"})
    p_other: float = field(default=0.9, metadata={"help": "dialect-biased expert: elsewhere"})
    specialist_p: float = field(default=0.9, metadata={"help": "hate-speech specialist: on class 0"})
    finetune: bool = field(default=False, metadata={"help": "also fine-tune the encoder end to end (slow)"})
    finetune_encoder: str | None = field(default=None, metadata={"help": "encoder folder (default: --encoder)"})
    finetune_train_size: int = 8000
    finetune_test_size: int | None = None
    finetune_max_length: int = 64
    finetune_epochs: float = 1.0
    finetune_lr: float = 1e-4
    finetune_batch_size: int = 32
    overwrite: bool = field(default=False, metadata={"help": "replace existing result files without asking"})
    render_only: bool = field(default=False, metadata={"help": "only rewrite the reports from the saved JSON"})
    imagenet16h: str | None = field(default=None, metadata={
        "help": "ImageNet-16H folder (see hf_defer.data.load_imagenet16h): also run its half of Table 2"})
    imagenet16h_noise: list[int] = field(default_factory=lambda: list(IMAGENET16H_NOISE_LEVELS),
                                         metadata={"help": "ImageNet-16H noise levels to run"})
    imagenet16h_epochs: float = field(default=100.0, metadata={"help": "training epochs of the ImageNet-16H heads"})
    threads: int = field(default=1, metadata={"help": "torch threads while training a linear head"})
    verbose: bool = field(default=False, metadata={"help": "Trainer progress bars and logs"})

    def __post_init__(self) -> None:
        if self.quick:
            self.seeds = self.seeds if self.seeds != [0, 1, 2, 3, 4] else list(_QUICK_SEEDS)
            self.epochs = min(self.epochs, 1.0)
            self.finetune_train_size = min(self.finetune_train_size, 64)
            self.finetune_test_size = self.finetune_test_size or 128
            self.finetune_max_length = min(self.finetune_max_length, 32)
        if not self.seeds or len(set(self.seeds)) != len(self.seeds) or min(self.seeds) < 0:
            raise ValueError(f"seeds must be distinct non-negative integers, got {self.seeds}.")
        if self.epochs <= 0:
            raise ValueError(f"epochs must be positive, got {self.epochs}.")
        for name in ("p_aae", "p_other", "specialist_p"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be a probability in [0, 1], got {getattr(self, name)}.")
        if self.skip_main and not (self.multi_expert or self.finetune or self.imagenet16h):
            raise ValueError("skip_main leaves nothing to run; add multi_expert, finetune or imagenet16h.")
        bad = [n for n in self.imagenet16h_noise if n not in IMAGENET16H_NOISE_LEVELS]
        if bad or not self.imagenet16h_noise or len(set(self.imagenet16h_noise)) != len(self.imagenet16h_noise):
            raise ValueError(f"imagenet16h_noise must be distinct levels among {list(IMAGENET16H_NOISE_LEVELS)}, got "
                             f"{self.imagenet16h_noise}.")
        if self.imagenet16h_epochs <= 0:
            raise ValueError(f"imagenet16h_epochs must be positive, got {self.imagenet16h_epochs}.")

    def protocol(self) -> Protocol:
        """The linear-head protocol these options ask for."""
        return Protocol(epochs=self.epochs, max_train=2000 if self.quick else None, verbose=self.verbose,
                        threads=self.threads)

    def planned_outputs(self) -> list[str]:
        """The files of the output folder that a run with these options writes."""
        if self.render_only:
            return ["hatespeech.md", "hatespeech_reliability.png", "hatespeech_multi_expert.md", "hatespeech_finetune.md",
                    "imagenet16h.md"]
        names = []
        if not self.skip_main:
            names += ["hatespeech.md", "hatespeech_runs.json", "hatespeech_expert_accuracy.png",
                      "hatespeech_reliability.png"]
        if self.multi_expert:
            names += ["hatespeech_multi_expert.md", "hatespeech_multi_expert.json"]
        if self.finetune:
            names += ["hatespeech_finetune.md", "hatespeech_finetune.json"]
        if self.imagenet16h:
            names += ["imagenet16h.md", "imagenet16h_runs.json"]
        return names


def parse_experiment_arguments(dataclass_type: type, description: str, output_dir: Path,
                               argv: Sequence[str] | None = None) -> Any:
    """An experiment script's options: `dataclass_type` parsed by `HfArgumentParser` from `argv`, `--output_dir`
    defaulting to `output_dir`; invalid values end the program with the parser's message (exit status 2)."""
    parser = transformers.HfArgumentParser(dataclass_type, description=description)
    parser.set_defaults(output_dir=str(output_dir))
    try:
        (arguments,) = parser.parse_args_into_dataclasses(args=argv)
    except ValueError as error:
        parser.error(str(error))
    return arguments


def confirm_overwrite(output: Path, names: Sequence[str], overwrite: bool) -> None:
    """Ask before replacing result files (or refuse when there is no terminal); `overwrite=True` skips the question."""
    existing = [name for name in names if (output / name).exists()]
    if not existing or overwrite:
        return
    question = f"{output} already holds {', '.join(existing)}. Overwrite? [y/N] "
    if sys.stdin is not None and sys.stdin.isatty():
        if input(question).strip().lower() in ("y", "yes"):
            return
        raise SystemExit("Nothing was run; pass --overwrite or another --output-dir.")
    raise SystemExit(f"{output} already holds {', '.join(existing)}; pass --overwrite to replace them or choose "
                     "another --output-dir.")


def settings(arguments: ReproductionArguments, protocol: Protocol) -> dict[str, Any]:
    """What a JSON record says about how it was made."""
    return {
        "seeds": list(arguments.seeds), "surrogates": list(arguments.surrogates), "encoder": arguments.encoder,
        "data": arguments.data or default_hatespeech_source() or "the copy shipped in hf_defer",
        "epochs": protocol.epochs,
        "batch_size": protocol.batch_size, "learning_rate": protocol.learning_rate, "momentum": protocol.momentum,
        "optimizer": "SGD", "schedule": "cosine, no warm-up", "weight_decay": 0.0, "max_train": protocol.max_train,
        "quick": arguments.quick, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.platform()}, {os.cpu_count()} CPU cores, torch {torch.__version__} "
                   f"({torch.get_num_threads()} threads, {protocol.threads or torch.get_num_threads()} for the linear heads), "
                   f"transformers {transformers.__version__}",
    }


def write_json(path: Path, record: dict[str, Any]) -> None:
    """Writes a record as indented JSON (numpy values as lists)."""
    path.write_text(json.dumps(record, indent=1, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)))


def _metrics(result: RunResult) -> dict[str, Any]:
    return {k: v for k, v in result.metrics.items() if k != "reliability"}


def run_table2(arguments: ReproductionArguments, output: Path) -> dict[str, Any]:
    """The Table 2 reproduction: every surrogate x every seed. Writes the markdown, the JSON and the figures.

    The JSON is rewritten after every run (with `"complete": false` until the end), so an interrupted reproduction
    keeps the runs it finished.
    """
    protocol = arguments.protocol()
    runs: list[dict[str, Any]] = []
    estimates: dict[str, list[np.ndarray]] = {s: [] for s in arguments.surrogates}
    true: list[np.ndarray] = []
    record = {"experiment": "hatespeech_table2", "settings": settings(arguments, protocol), "complete": False,
              "runs": runs}
    progress = tqdm(total=len(arguments.seeds) * len(arguments.surrogates), desc="HateSpeech runs", unit="run")
    for seed in arguments.seeds:
        splits = load_splits(seed, arguments.data, arguments.encoder, arguments.cache_dir, show_progress=True)
        true.append(annotator_accuracy(splits["test"], HATESPEECH_LABELS))
        for surrogate in arguments.surrogates:
            result = train_head(splits, surrogate, seed, protocol)
            metrics = _metrics(result) | {f"expert_accuracy_{k}": v
                                          for k, v in estimate_errors(result.expert_accuracy[:, 0], true[-1]).items()}
            runs.append({"surrogate": surrogate, "seed": seed, "metrics": metrics,
                         "reliability": result.metrics["reliability"], "train_seconds": result.train_seconds,
                         "num_train": min(len(splits["train"]), protocol.max_train or len(splits["train"])),
                         "num_test": len(splits["test"])})
            write_json(output / "hatespeech_runs.json", record)
            estimates[surrogate].append(result.expert_accuracy[:, 0])
            progress.update()
            progress.set_postfix(seed=seed, surrogate=surrogate, error=f"{metrics['system_error']:.4f}")
    progress.close()
    ordered = [s for s in TABLE2_SURROGATES if s in arguments.surrogates]
    plot_estimate_histograms({display_name(s): np.concatenate(estimates[s]) for s in ordered}, np.concatenate(true),
                             output / "hatespeech_expert_accuracy.png",
                             "HateSpeech test tweets: estimated vs. true accuracy of a random annotator")
    plot_table2_reliability(record, output / "hatespeech_reliability.png")
    record["complete"] = True
    write_json(output / "hatespeech_runs.json", record)
    (output / "hatespeech.md").write_text(table2_markdown(json.loads((output / "hatespeech_runs.json").read_text())))
    return record


def _aae_flags(splits: datasets.DatasetDict, aae_of: dict[str, bool], dialect: Any) -> None:
    """Adds the TwitterAAE flag of every tweet of `splits` not yet in `aae_of`."""
    texts = sorted({text for split in splits.values() for text in split["text"]} - aae_of.keys())
    for i in tqdm(range(0, len(texts), 1000), desc="TwitterAAE dialect (x1000 tweets)", disable=not texts):
        aae_of.update(zip(texts[i:i + 1000], dialect.is_aae(texts[i:i + 1000]).tolist()))


def run_multi_expert(arguments: ReproductionArguments, output: Path) -> dict[str, Any]:
    """Three experts vs each expert alone, A-SM, every seed. Writes hatespeech_multi_expert.md/.json."""
    from .twitteraae import TwitterAAE

    protocol = arguments.protocol()
    twitteraae = arguments.twitteraae or os.environ.get("HF_DEFER_TWITTERAAE") or "the copy in research/data/twitteraae"
    dialect, aae_of, records = TwitterAAE(arguments.twitteraae), {}, []
    progress = tqdm(total=len(arguments.seeds) * (1 + len(EXPERT_COLUMNS)), desc="multi-expert runs", unit="run")
    for seed in arguments.seeds:
        splits = load_splits(seed, arguments.data, arguments.encoder, arguments.cache_dir)
        _aae_flags(splits, aae_of, dialect)
        splits = add_three_experts(splits, aae_of, seed, arguments.p_aae, arguments.p_other, arguments.specialist_p)
        multi = train_head(splits, "asm", seed, protocol, num_experts=3, expert_names=list(EXPERT_COLUMNS))
        test_aae = np.asarray(splits["test"].with_format("numpy", columns=["aae"])[:]["aae"])
        to_dialect = multi.defer & (multi.expert == 1)

        def by_dialect(result: RunResult) -> dict[str, float]:
            return {"system_error_aae": float(1 - result.system_right[test_aae].mean()),
                    "system_error_other": float(1 - result.system_right[~test_aae].mean())}

        record = {"seed": seed, "multi": _metrics(multi) | by_dialect(multi),
                  "dialect_routing_on_aae": float(to_dialect[test_aae].mean()),
                  "dialect_routing_on_other": float(to_dialect[~test_aae].mean()),
                  "test_aae_share": float(test_aae.mean()),
                  "expert_accuracy_on_test": {c: float(multi.experts_right[:, j].mean())
                                              for j, c in enumerate(EXPERT_COLUMNS)}, "single": {}}
        progress.update()
        for column in EXPERT_COLUMNS:
            single = datasets.DatasetDict({n: s.remove_columns("expert_labels").rename_column(column, "expert_labels")
                                           for n, s in splits.items()})
            result = train_head(single, "asm", seed, protocol)
            record["single"][column] = _metrics(result) | by_dialect(result)
            progress.update()
        records.append(record)
    progress.close()
    payload = {"experiment": "hatespeech_multi_expert", "settings": settings(arguments, protocol) | {
        "p_aae": arguments.p_aae, "p_other": arguments.p_other, "specialist_p": arguments.specialist_p,
        "aae_share_all_tweets": float(np.mean(list(aae_of.values()))), "twitteraae": twitteraae}, "runs": records}
    write_json(output / "hatespeech_multi_expert.json", payload)
    (output / "hatespeech_multi_expert.md").write_text(multi_expert_markdown(payload))
    return payload


def run_finetune(arguments: ReproductionArguments, output: Path) -> dict[str, Any]:
    """End-to-end fine-tuning of the encoder with A-SM against the frozen protocol on the same split."""
    protocol, seed = arguments.protocol(), arguments.seeds[0]
    splits = load_splits(seed, arguments.data, arguments.encoder, arguments.cache_dir)
    encoder_path = arguments.finetune_encoder or resolve_sentence_encoder(arguments.encoder)
    tuned = finetune_encoder(splits, encoder_path, seed, train_size=arguments.finetune_train_size,
                             max_length=arguments.finetune_max_length, epochs=arguments.finetune_epochs,
                             learning_rate=arguments.finetune_lr, batch_size=arguments.finetune_batch_size,
                             test_size=arguments.finetune_test_size, verbose=protocol.verbose)
    train, test = tuned.extra["train"], tuned.extra["test"]
    rows = {"A-SM, fine-tuned encoder": (tuned, len(train)),
            "A-SM, frozen encoder, same training subset": (
                train_head(datasets.DatasetDict({"train": train, "test": test}), "asm", seed, protocol), len(train)),
            "A-SM, frozen encoder, full training split": (
                train_head(datasets.DatasetDict({"train": splits["train"], "test": test}), "asm", seed, protocol),
                len(splits["train"]))}
    payload = {"experiment": "hatespeech_finetune", "settings": settings(arguments, protocol) | {
        "finetune_train_size": len(train), "finetune_test_size": len(test),
        "finetune_max_length": arguments.finetune_max_length, "finetune_epochs": arguments.finetune_epochs,
        "finetune_lr": arguments.finetune_lr, "finetune_batch_size": arguments.finetune_batch_size, "seed": seed,
        "finetune_encoder": str(encoder_path)},
        "runs": {name: {"metrics": _metrics(r), "train_seconds": r.train_seconds, "train_tweets": size}
                 for name, (r, size) in rows.items()}}
    write_json(output / "hatespeech_finetune.json", payload)
    (output / "hatespeech_finetune.md").write_text(finetune_markdown(payload))
    return payload
