"""The flags of `scripts/run_deferral.py` and `hf-defer train`, as transformers' example scripts name them.

[`parse_run_arguments`] reads them with `HfArgumentParser` over [`ModelArguments`], [`DataTrainingArguments`] and
`transformers.TrainingArguments`, from command-line flags or from one JSON file. `--help` lists the flags a first
run needs ([`ESSENTIAL_FLAGS`]); `--help-all` every flag, in groups: essential, model, data, deferral (every other
flag about experts, the surrogate and the deferral budget) and training.

The flags of transformers' `run_classification.py` carry over under their names, except those left out on purpose
(the README lists them): `--do_regression`, `--metric_name` (the deferral metrics are fixed), `--pad_to_max_length`
(batches are padded as they are built), `--remove_splits` / `--remove_columns` (only the named columns are read),
`--use_fast_tokenizer` (transformers 5 loads the fast one) and `--ignore_mismatched_sizes` (the deferral head is new).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, fields

import json
from typing import Any

from transformers import HfArgumentParser, TrainingArguments

from ..modeling.validators import MISSING_EXPERT_MODES  # standard library only
from .flags import (ESSENTIAL_FLAGS, HelpAllAction, PlainDefaultsHelpFormatter, closest_flag, short_help,
                    unknown_flags, unknown_flags_message)
from .progress import progress_bars_disabled
from .promise_flags import PROMISE_FLAGS, parse_rates

__all__ = ["DataTrainingArguments", "ModelArguments", "build_run_parser", "parse_run_arguments"]

_DATA_EXTENSIONS = ("csv", "json", "jsonl", "parquet")


HEAD_ONLY_LEARNING_RATE = 1e-2
"""The learning rate of a head-only run (`--freeze_encoder`) unless `--learning_rate` is given. Measured on a 260-row
three-class CSV over MiniLM embeddings (3 annotators, test split of 80 rows, majority-class error 0.65): 1e-3 for 3
epochs left the classifier at 0.6875 (one class for every row); 1e-2 for 10 epochs reached 0.1625."""
HEAD_ONLY_EPOCHS = 10.0
"""The epochs of a head-only run (`--freeze_encoder`) unless `--num_train_epochs` or `--max_steps` is given: a head
over cached embeddings costs little per step, and 3 epochs of a quick-start file are a hundred steps."""


def _names(value: str | None) -> list[str]:
    return [name.strip() for name in value.split(",") if name.strip()] if value else []


@dataclass
class ModelArguments:
    """Which encoder to start from and how the deferral model is built on it."""

    model_name_or_path: str = field(
        metadata={"help": "Encoder checkpoint: a Hub id or a local folder (text or vision)."}
    )
    config_name: str | None = field(
        default=None, metadata={"help": "Encoder config (Hub id or folder) if not the one of --model_name_or_path."}
    )
    tokenizer_name: str | None = field(
        default=None,
        metadata={"help": "Tokenizer or image processor (Hub id or folder) if not the one of --model_name_or_path."},
    )
    cache_dir: str | None = field(
        default=None, metadata={"help": "Where models and datasets downloaded from the Hub are stored."}
    )
    model_revision: str = field(
        default="main", metadata={"help": "Model version to use: a branch name, tag name or commit id."}
    )
    token: str | None = field(
        default=None, metadata={"help": "Hub token for private models and datasets (default: the one `hf auth "
                                        "login` stored)."}
    )
    trust_remote_code: bool = field(
        default=False,
        metadata={"help": "Allow the encoder and dataset repositories to run their own code. Only for repositories "
                          "you trust and whose code you have read."},
    )
    license: str | None = field(
        default=None, metadata={"help": "License of the saved model, for its card (e.g. apache-2.0, mit)."}
    )
    language: str | None = field(
        default=None, metadata={"help": "Comma-separated language codes of the data, for the card (e.g. en)."}
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
                          "the head is put on the encoder. Images: the encoder runs frozen. The learning rate defaults "
                          f"to {HEAD_ONLY_LEARNING_RATE:g} here (a linear head barely moves at the fine-tuning default "
                          f"5e-5) and the epochs to {HEAD_ONLY_EPOCHS:g}; --learning_rate / --num_train_epochs set "
                          "others."},
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
    text_column_names: str | None = field(
        default=None,
        metadata={"aliases": ["--text_column_name"],
                  "help": "Text column; several, comma-separated, are joined with --text_column_delimiter. Default: "
                          "'text' when the data has it and no image column."},
    )
    text_column_delimiter: str = field(default=" ", metadata={"help": "Joins several text columns."})
    text_pair_column_name: str | None = field(default=None, metadata={"help": "Second text of a text pair."})
    image_column_name: str | None = field(
        default=None, metadata={"help": "Image column, for vision encoders. Default: the first column of images."}
    )
    label_column_name: str | None = field(
        default=None, metadata={"help": "Column of the true class: names, a ClassLabel or class ids. Default: 'label' "
                                        "(none with --route_only)."}
    )
    train_split_name: str = field(default="train", metadata={"help": "The training split of --dataset_name."})
    validation_split_name: str = field(
        default="validation", metadata={"help": "The validation split of --dataset_name."}
    )
    test_split_name: str = field(default="test", metadata={"help": "The test split of --dataset_name."})
    id_column_name: str | None = field(
        default=None,
        metadata={"help": "Column of the test data's own ids, copied into predictions.csv. Default: 'id' when the test "
                          "data has it, else the row number as 'row'."},
    )
    copy_columns: str | None = field(
        default=None, metadata={"help": "Comma-separated test columns copied into predictions.csv next to the "
                                        "decisions."}
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata={"help": "Replace and delete files in --output_dir that no hf_defer run or save wrote. Without it "
                          "such files stop the run before anything is written (a folder a run or save wrote is run "
                          "into again)."},
    )
    class_names: str | None = field(
        default=None, metadata={"help": "Comma-separated class names in class-id order (default: from the data)."}
    )
    expert_column_names: str | None = field(
        default=None, metadata={"help": "Comma-separated columns holding the experts' answers, one per expert."}
    )
    expert_correct_columns: str | None = field(
        default=None,
        metadata={"help": "Comma-separated columns of experts given by their correctness (true/false, 1/0) or a score "
                          "in [0, 1] (a judge's grade, a pass rate), one per expert, after --expert_column_names'."},
    )
    route_only: bool = field(
        default=False,
        metadata={"help": "Train a route-only model: no class head, no label column; it learns each expert's accuracy "
                          "from --expert_correct_columns (two or more) and sends each input to the expert with the "
                          "best estimated accuracy minus cost."},
    )
    default_expert: str | None = field(
        default=None,
        metadata={"help": "--route_only: the expert that answers unless routing elsewhere pays (the cheap model); "
                          "any other counts as a deferral for --max_deferral_rate. Default: the first expert."},
    )
    side_feature_columns: str | None = field(
        default=None,
        metadata={"help": "Comma-separated columns the model reads beside the text, as a router knows the subject, the "
                          "prompt's length or the user's tier: a column of numbers is standardised, any other embedded "
                          "by category, inside the model. Saved in its config: hf-defer predict, the pipeline and "
                          "hf-defer serve --router then need the same columns (or request metadata)."},
    )
    categorical_side_feature_columns: str | None = field(
        default=None,
        metadata={"help": "Of --side_feature_columns, the columns of numbers to embed as categories (a tier 1/2/3) "
                          "rather than standardise."},
    )
    side_feature_dim: int = field(
        default=8, metadata={"help": "Width of each categorical side feature's embedding (--side_feature_columns)."}
    )
    missing_expert: str = field(
        default="error",
        metadata={"help": "Missing annotation (empty, -1, NaN): 'error', 'drop' the row, or 'mask' (keep the row; "
                          "that expert's loss terms leave it; in evaluation the decisions are the model's all the same, and a "
                          "deferral to that expert there is counted as unscored_deferrals)."},
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
    preprocessing_num_workers: int | None = field(
        default=None, metadata={"help": "Processes that tokenize the data."}
    )
    overwrite_cache: bool = field(default=False, metadata={"help": "Tokenize again instead of reading the cache."})
    shuffle_train_dataset: bool = field(default=False, metadata={"help": "Shuffle the training rows once, seeded."})
    shuffle_seed: int = field(default=42, metadata={"help": "Seed of --shuffle_train_dataset."})
    validation_split_percentage: int = field(
        default=10, metadata={"help": "Share of train held out for validation when the data has no validation split "
                                      "and something uses it (--do_eval, --max_deferral_rate); else train keeps every "
                                      "row."}
    )
    # the promises of the calibration: declared once, in promise_flags (a per-expert budget read by parse_rates)
    max_deferral_rate: str | None = PROMISE_FLAGS["max_deferral_rate"].field()
    confidence: float | None = PROMISE_FLAGS["confidence"].field()
    max_error: float | None = PROMISE_FLAGS["max_error"].field()
    selective: bool = PROMISE_FLAGS["selective"].field()
    max_mean_cost: float | None = PROMISE_FLAGS["max_mean_cost"].field()
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
        if self.missing_expert not in MISSING_EXPERT_MODES:
            modes = ", ".join(repr(mode) for mode in MISSING_EXPERT_MODES[:-1]) + f" or {MISSING_EXPERT_MODES[-1]!r}"
            raise ValueError(f"--missing_expert must be {modes}, got {self.missing_expert!r}.")
        if self.simulated_expert not in (None, "class_subset", "annotator"):
            raise ValueError(
                f"--simulated_expert must be 'class_subset' or 'annotator', got {self.simulated_expert!r}."
            )
        if bool(self.expert_column_names or self.expert_correct_columns) == bool(self.simulated_expert):
            raise ValueError("give --expert_column_names (your experts' answers) and/or --expert_correct_columns (their "
                             f"correctness or scores), or --simulated_expert; got {self.expert_column_names!r}, "
                             f"{self.expert_correct_columns!r} and {self.simulated_expert!r}.")
        if self.route_only:
            if self.label_column_name is not None or self.expert_column_names or self.simulated_expert \
                    or self.class_names or len(self.correct_columns) < 2:
                raise ValueError(
                    "--route_only trains on each expert's correctness alone: give two or more --expert_correct_columns "
                    "and no --label_column_name, --expert_column_names, --simulated_expert or --class_names (a "
                    f"route-only model has no class); got --label_column_name {self.label_column_name!r}, "
                    f"--expert_column_names {self.expert_column_names!r}, --expert_correct_columns "
                    f"{self.expert_correct_columns!r}, --simulated_expert {self.simulated_expert!r}, --class_names "
                    f"{self.class_names!r}.")
            if self.default_expert is not None and self.default_expert not in self.correct_columns:
                raise ValueError(f"--default_expert must be one of --expert_correct_columns {self.correct_columns}, "
                                 f"got {self.default_expert!r}.")
        else:
            if self.default_expert is not None:
                raise ValueError(f"--default_expert is for route-only models (--route_only), got "
                                 f"{self.default_expert!r}.")
            if self.label_column_name is None:
                self.label_column_name = "label"
        if self.simulated_expert == "annotator" and not self.annotator_count_columns:
            raise ValueError("--simulated_expert annotator needs --annotator_count_columns.")
        self.max_deferral_rate = parse_rates(self.max_deferral_rate)  # a share, or {expert: share}
        if self.max_seq_length < 1:
            raise ValueError(f"--max_seq_length must be a positive number of tokens, got {self.max_seq_length!r}.")
        side, categorical = _names(self.side_feature_columns), _names(self.categorical_side_feature_columns)
        if len(set(side)) != len(side):
            raise ValueError(f"--side_feature_columns names a column twice: {self.side_feature_columns!r}.")
        if [name for name in categorical if name not in side]:
            raise ValueError(f"--categorical_side_feature_columns {[n for n in categorical if n not in side]} must be "
                             f"among --side_feature_columns {side}.")
        taken = [name for name in side if name in [self.label_column_name, *self.expert_columns,
                                                   *self.correct_columns, *self.text_columns,
                                                   self.text_pair_column_name, self.image_column_name]]
        if taken:
            raise ValueError(f"--side_feature_columns {taken} are also the label, an expert or the input column: a side "
                             "feature is a column of its own.")
        if self.side_feature_dim < 1:
            raise ValueError(f"--side_feature_dim must be a positive integer, got {self.side_feature_dim!r}.")
        if side and self.image_column_name is not None:
            raise ValueError("--side_feature_columns is for text (and feature) models; the pipeline takes no side "
                             "features beside an image.")
        if self.text_column_names is not None and not _names(self.text_column_names):
            raise ValueError(f"--text_column_names must name a column, got {self.text_column_names!r}.")

    @property
    def text_columns(self) -> list[str]:
        """The text columns of `--text_column_names` (empty: not given)."""
        return _names(self.text_column_names)

    @property
    def copied_columns(self) -> list[str]:
        return _names(self.copy_columns)

    @property
    def expert_columns(self) -> list[str]:
        return _names(self.expert_column_names)

    @property
    def correct_columns(self) -> list[str]:
        return _names(self.expert_correct_columns)

    @property
    def side_features(self) -> list[str]:
        """The columns of `--side_feature_columns` (empty: none)."""
        return _names(self.side_feature_columns)

    @property
    def categorical_side_features(self) -> list[str]:
        return _names(self.categorical_side_feature_columns)

    @property
    def classes(self) -> list[str] | None:
        return _names(self.class_names) or None

    @property
    def count_columns(self) -> list[str]:
        return _names(self.annotator_count_columns)


_DEFERRAL_WORDS = ("expert", "deferral", "surrogate", "annotator", "route")
_RENAMED = {"text_column_name": "text_column_names"}
"""Keys of older JSON files and their flag now (the flag keeps the old name as an alias)."""


def _given_flags(argv: Sequence[str]) -> set[str]:
    """The names of the flags written in ``argv`` (``--name value`` or ``--name=value``)."""
    return {arg[2:].split("=", 1)[0] for arg in argv if arg.startswith("--")}


def help_group(dataclass_type: type, name: str) -> str:
    """The `--help` group of a flag: `essential` for [`ESSENTIAL_FLAGS`], `deferral` for every other flag about
    experts, the surrogate or the deferral budget, else `model`, `data` or `training` after its dataclass."""
    if name in ESSENTIAL_FLAGS:
        return "essential"
    if dataclass_type in (ModelArguments, DataTrainingArguments) and any(w in name for w in _DEFERRAL_WORDS):
        return "deferral"
    return {ModelArguments: "model", DataTrainingArguments: "data"}.get(dataclass_type, "training")


class RunArgumentParser(HfArgumentParser):
    """`HfArgumentParser` over the three dataclasses whose `--help` shows the essential flags ([`ESSENTIAL_FLAGS`])
    and `--help-all` every flag in groups (essential, model, data, deferral, training), as `git` and `pip` keep their
    first help short; its usage errors are one line naming the flag."""

    _GROUPS = {"essential": "what a first run needs", "model": "the encoder and the saved model",
               "data": "the data files or Hub dataset, and predictions",
               "deferral": "experts, surrogate loss and deferral budget",
               "training": "transformers.TrainingArguments (see its documentation)"}
    _SHORT = ("essential", "command")
    """The groups `--help` shows (`command`: the flags `hf-defer train` adds)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", PlainDefaultsHelpFormatter)  # the defaults, without docstring markup
        super().__init__(*args, **kwargs)
        self.add_argument("--help-all", action=HelpAllAction, help="show every flag, in groups, and exit")

    def print_help(self, file: Any = None, full: bool = False) -> None:  # type: ignore[override]
        self._print_message(self.format_help(full), file or sys.stdout)

    def format_help(self, full: bool = False) -> str:  # type: ignore[override]
        """The help: every group with `full`, else usage, the short groups and how many flags `--help-all` adds."""
        return super().format_help() if full else short_help(self, self._SHORT)

    def _add_dataclass_arguments(self, dtype: Any) -> None:
        groups = getattr(self, "_run_groups", None)
        if groups is None:
            groups = self._run_groups = {name: self.add_argument_group(name, help_text)
                                         for name, help_text in self._GROUPS.items()}
        from typing import get_type_hints

        hints = get_type_hints(dtype)
        for item in fields(dtype):
            if item.init:
                item.type = hints[item.name]
                self._parse_dataclass_field(groups[help_group(dtype, item.name)], item)

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def build_run_parser(prog: str | None = None) -> RunArgumentParser:
    """The parser of `scripts/run_deferral.py` and `hf-defer train` (see [`RunArgumentParser`])."""
    name = prog or os.path.basename(sys.argv[0] or "run_deferral.py")
    usage = (f"{name} --model_name_or_path MODEL (--train_file FILE | --dataset_name NAME) --output_dir DIR "
             f"[FLAG ...]\n       {name} FLAGS.json")
    return RunArgumentParser((ModelArguments, DataTrainingArguments, TrainingArguments), prog=name, usage=usage)


def _resume_value(value: Any) -> Any:
    """`--resume_from_checkpoint true` resumes from the newest complete checkpoint (`DeferralTrainer.train(True)`);
    `false` does not resume; anything else is a checkpoint folder."""
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return True if value.strip().lower() == "true" else None
    return value


def parse_run_arguments(
    argv: Sequence[str] | None = None, parser: HfArgumentParser | None = None,
) -> tuple[ModelArguments, DataTrainingArguments, TrainingArguments]:
    """Parses flags (or one `.json` file holding them) into the three argument dataclasses.

    `--text_column_name` (and the key `text_column_name` of a JSON file) is `--text_column_names`; `--freeze_encoder`
    without `--learning_rate` trains at `HEAD_ONLY_LEARNING_RATE` (1e-2), not the fine-tuning default 5e-5, and
    without `--num_train_epochs` / `--max_steps` for `HEAD_ONLY_EPOCHS` (10), not 3;
    `--resume_from_checkpoint true` resumes from the newest complete checkpoint of `--output_dir`.

    Args:
        argv (`list[str]`, *optional*): the arguments; defaults to `sys.argv[1:]`.
        parser (`HfArgumentParser`, *optional*): defaults to [`build_run_parser`]'s.

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
    parser = parser or build_run_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) == 1 and argv[0].endswith(".json"):
        path = os.path.abspath(argv[0])
        try:
            with open(path, encoding="utf-8") as handle:
                values = json.load(handle)
        except OSError as error:
            raise FileNotFoundError(f"the flags file {argv[0]!r} cannot be read: {error.strerror}.") from None
        except ValueError as error:
            raise ValueError(f"the flags file {argv[0]!r} is not valid JSON: {error}.") from None
        if not isinstance(values, dict):
            raise ValueError(f"the flags file {argv[0]!r} must hold one JSON object of flag names and values.")
        values = {_RENAMED.get(key, key): value for key, value in values.items()}
        fields = {action.dest for action in parser._actions}
        unknown = [key for key in values if key not in fields]
        if unknown:
            raise ValueError(f"the flags file {argv[0]!r} has unknown keys: " + ", ".join(
                f"{key!r}" + (f" (did you mean {hint[2:]!r}?)" if (hint := closest_flag(f"--{key}", [
                    f"--{field}" for field in fields])) else "") for key in unknown))
        model_args, data_args, training_args = parser.parse_dict(values)
        given = set(values)
    else:
        unknown = unknown_flags(argv, parser._option_string_actions)  # first: before any other complaint
        if unknown:
            raise ValueError(f"{unknown_flags_message(unknown, parser._option_string_actions)}; `{parser.prog} "
                             "--help` lists the flags.")
        model_args, data_args, training_args, unknown = parser.parse_args_into_dataclasses(
            args=argv, return_remaining_strings=True)
        if unknown:
            raise ValueError(f"unrecognized arguments: {' '.join(unknown)}; `{parser.prog} --help` lists the flags.")
        given = _given_flags(argv)
    if not any(name and "disable_tqdm".startswith(name) for name in given) and progress_bars_disabled():
        training_args.disable_tqdm = True  # stderr is a log file, not a terminal (hf_defer.commands.progress)
    # The head alone: the fine-tuning default 5e-5 trains nothing. (argparse also takes "--learning_r", a prefix.)
    if model_args.freeze_encoder and not any(name and "learning_rate".startswith(name) for name in given):
        training_args.learning_rate = HEAD_ONLY_LEARNING_RATE
    if model_args.freeze_encoder and not any(name and (flag.startswith(name)) for name in given
                                             for flag in ("num_train_epochs", "max_steps")):
        training_args.num_train_epochs = HEAD_ONLY_EPOCHS
    if data_args.route_only and model_args.surrogate != "asm":  # the default; other values would be ignored
        raise ValueError(f"--surrogate {model_args.surrogate!r} does not apply with --route_only: a route-only model "
                         "has no class head and trains each expert's estimate with the binary log loss; drop "
                         "--surrogate.")
    training_args.resume_from_checkpoint = _resume_value(training_args.resume_from_checkpoint)
    return model_args, data_args, training_args
