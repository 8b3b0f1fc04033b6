"""The flags of `scripts/run_deferral.py` and `hf-defer train`, as transformers' example scripts name them.

[`parse_run_arguments`] reads them with `HfArgumentParser` over [`ModelArguments`], [`DataTrainingArguments`] and
`transformers.TrainingArguments`, from command-line flags or from one JSON file.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

from transformers import HfArgumentParser, TrainingArguments

__all__ = ["DataTrainingArguments", "ModelArguments", "parse_run_arguments"]

_DATA_EXTENSIONS = ("csv", "json", "jsonl", "parquet")


def _names(value: str | None) -> list[str]:
    return [name.strip() for name in value.split(",") if name.strip()] if value else []


@dataclass
class ModelArguments:
    """Which encoder to start from and how the deferral model is built on it."""

    model_name_or_path: str = field(
        metadata={"help": "Encoder checkpoint: a Hub id or a local folder (text or vision)."}
    )
    surrogate: str = field(default="asm", metadata={"help": "Training loss: asm (default), ssm, sova or aova."})
    pooling: str | None = field(
        default=None,
        metadata={"help": "Pooling of the encoder's last hidden state: cls, mean, max or last (the last real token). "
                          "Default: last for decoder-only models (Llama, Qwen2, ...), cls for encoders; with "
                          "--freeze_encoder on text, the sentence encoder's own pooling."},
    )
    normalize_pooled: bool = field(default=False, metadata={"help": "L2-normalize the pooled vector."})
    freeze_encoder: bool = field(
        default=False,
        metadata={"help": "Train the head only. Text: on cached sentence embeddings (the paper's protocol), then "
                          "the head is put on the encoder. Images: the encoder runs frozen."},
    )
    embedding_cache_dir: str | None = field(
        default=None, metadata={"help": "Cache of the sentence embeddings (--freeze_encoder on text)."}
    )
    use_lora: bool = field(
        default=False,
        metadata={"help": "Fine-tune LoRA adapters (peft) instead of every encoder weight; the deferral head trains "
                          "in full. The saved folder holds the merged model, which loads like any other."},
    )
    lora_r: int = field(default=16, metadata={"help": "LoRA rank (--use_lora)."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA scaling alpha (--use_lora)."})
    lora_dropout: float = field(default=0.0, metadata={"help": "Dropout on the LoRA path (--use_lora)."})
    lora_target_modules: str | None = field(
        default=None,
        metadata={"help": "Comma-separated names of the modules that get adapters, e.g. q_proj,v_proj (--use_lora). "
                          "Default: every linear layer of the encoder."},
    )

    @property
    def lora_targets(self) -> list[str] | str:
        """`lora_target_modules` as peft's `target_modules`: the listed names, else every linear layer."""
        return _names(self.lora_target_modules) if self.lora_target_modules else "all-linear"


@dataclass
class DataTrainingArguments:
    """Which data to train, evaluate and predict on, and where the expert answers come from."""

    dataset_name: str | None = field(
        default=None, metadata={"help": "A dataset on the Hub (or a local dataset folder)."}
    )
    dataset_config_name: str | None = field(default=None, metadata={"help": "The dataset's configuration name."})
    train_file: str | None = field(default=None, metadata={"help": "Training data: csv, json, jsonl or parquet."})
    validation_file: str | None = field(default=None, metadata={"help": "Validation data (same format)."})
    test_file: str | None = field(default=None, metadata={"help": "Test data for --do_predict (same format)."})
    text_column_name: str | None = field(
        default=None, metadata={"help": "Text column. Default: 'text' when the data has it and no image column."}
    )
    text_pair_column_name: str | None = field(default=None, metadata={"help": "Second text of a text pair."})
    image_column_name: str | None = field(
        default=None, metadata={"help": "Image column, for vision encoders. Default: the first column of images."}
    )
    label_column_name: str = field(
        default="label", metadata={"help": "Column of the true class: names, a ClassLabel or class ids."}
    )
    class_names: str | None = field(
        default=None, metadata={"help": "Comma-separated class names in class-id order (default: from the data)."}
    )
    expert_column_names: str | None = field(
        default=None, metadata={"help": "Comma-separated columns holding the experts' answers, one per expert."}
    )
    missing_expert: str = field(
        default="error", metadata={"help": "Missing annotation (empty, -1, NaN): 'error' or 'drop' the row."}
    )
    simulated_expert: str | None = field(
        default=None,
        metadata={"help": "Without expert columns: 'class_subset' (right with probability --expert_p on the first "
                          "--expert_k classes, random elsewhere) or 'annotator' (a random annotator drawn from "
                          "--annotator_count_columns)."},
    )
    expert_k: int = field(default=20, metadata={"help": "class_subset: how many classes (the first ones) it knows."})
    expert_p: float = field(default=0.94, metadata={"help": "class_subset: probability of being right on them."})
    expert_seed: int = field(default=0, metadata={"help": "Seed of the simulated expert's draws."})
    annotator_count_columns: str | None = field(
        default=None, metadata={"help": "annotator: comma-separated per-class annotator count columns."}
    )
    max_seq_length: int = field(default=128, metadata={"help": "Longest tokenized input; longer ones are truncated."})
    validation_split_percentage: int = field(
        default=10, metadata={"help": "Share of train held out for validation when the data has no validation split."}
    )
    max_deferral_rate: float | None = field(
        default=None,
        metadata={"help": "Calibrate the deferral threshold on the validation split so that at most this share of "
                          "inputs is deferred; stored in the saved config."},
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep the first N training rows."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep the first N validation rows."})
    max_predict_samples: int | None = field(default=None, metadata={"help": "Keep the first N test rows."})

    def __post_init__(self) -> None:
        if self.dataset_name is None and self.train_file is None and self.validation_file is None \
                and self.test_file is None:
            raise ValueError("give --dataset_name, or data files (--train_file / --validation_file / --test_file).")
        for name in ("train_file", "validation_file", "test_file"):
            path = getattr(self, name)
            if path is not None and path.rsplit(".", 1)[-1].lower() not in _DATA_EXTENSIONS:
                raise ValueError(f"--{name} must be a {', '.join(_DATA_EXTENSIONS)} file, got {path!r}.")
        if self.missing_expert not in ("error", "drop"):
            raise ValueError(f"--missing_expert must be 'error' or 'drop', got {self.missing_expert!r}.")
        if self.simulated_expert not in (None, "class_subset", "annotator"):
            raise ValueError(
                f"--simulated_expert must be 'class_subset' or 'annotator', got {self.simulated_expert!r}."
            )
        if bool(self.expert_column_names) == bool(self.simulated_expert):
            raise ValueError("give exactly one of --expert_column_names (your experts' answers) and "
                             f"--simulated_expert; got {self.expert_column_names!r} and {self.simulated_expert!r}.")
        if self.simulated_expert == "annotator" and not self.annotator_count_columns:
            raise ValueError("--simulated_expert annotator needs --annotator_count_columns.")
        if self.max_deferral_rate is not None and not 0 < self.max_deferral_rate <= 1:
            raise ValueError(f"--max_deferral_rate must lie in (0, 1], got {self.max_deferral_rate!r}.")

    @property
    def expert_columns(self) -> list[str]:
        return _names(self.expert_column_names)

    @property
    def classes(self) -> list[str] | None:
        return _names(self.class_names) or None

    @property
    def count_columns(self) -> list[str]:
        return _names(self.annotator_count_columns)


def parse_run_arguments(
    argv: Sequence[str] | None = None,
) -> tuple[ModelArguments, DataTrainingArguments, TrainingArguments]:
    """Parses flags (or one `.json` file holding them) into the three argument dataclasses.

    Args:
        argv (`list[str]`, *optional*): the arguments; defaults to `sys.argv[1:]`.

    Returns:
        `tuple`: ([`ModelArguments`], [`DataTrainingArguments`], `TrainingArguments`).

    Example:

    ```python
    >>> from hf_defer.commands.arguments import parse_run_arguments
    >>> model_args, data_args, training_args = parse_run_arguments(
    ...     ["--model_name_or_path", "bert-base-uncased", "--train_file", "train.csv", "--expert_column_names",
    ...      "alice,bob", "--output_dir", "out"])
    >>> data_args.expert_columns, training_args.output_dir
    (['alice', 'bob'], 'out')

    ```
    """
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, TrainingArguments))
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) == 1 and argv[0].endswith(".json"):
        return parser.parse_json_file(json_file=os.path.abspath(argv[0]))
    return parser.parse_args_into_dataclasses(args=argv)
