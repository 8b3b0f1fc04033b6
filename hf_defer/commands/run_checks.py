"""What [`run_deferral`] settles before it works: which stages run (a run never evaluates, saves or describes an
untrained deferral head), and whether the Hub repository of `--push_to_hub` can be created."""

from __future__ import annotations

import logging
from typing import Any

from transformers import TrainingArguments

__all__ = ["check_stages", "default_stages", "first_line", "hub_repository_error"]

logger = logging.getLogger("hf_defer.commands.run")


def check_stages(training_args: TrainingArguments) -> None:
    """Refuses `--do_eval` or `--do_predict` without `--do_train`: the deferral head is new, so the run would evaluate,
    save and describe an untrained model. A saved deferral model is evaluated with `hf-defer evaluate` and used with
    `hf-defer predict`. (`--eval_strategy` alone sets `do_eval`: it asks for evaluations while training, and
    [`default_stages`] trains.)"""
    asked = [flag for flag in ("do_eval", "do_predict") if getattr(training_args, flag)]
    if asked and not training_args.do_train and not _no_stage_named(training_args):
        raise ValueError(f"{' and '.join('--' + flag for flag in asked)} without --do_train would evaluate and save an "
                         "untrained deferral head (the head on --model_name_or_path is new): add --do_train. To "
                         "evaluate or use a deferral model saved before, run `hf-defer evaluate` or `hf-defer "
                         "predict --model FOLDER`.")


def default_stages(training_args: TrainingArguments, splits: Any) -> list[str]:
    """Without `--do_train`, `--do_eval` and `--do_predict` (or with `--eval_strategy` alone), the run does what a
    newcomer who gave data files expects: it trains on the `train` split, evaluates on `validation` and predicts on
    `test`, those that `splits` has, and logs it. Returns the flags it turned on. Data without a `train` split then
    leaves nothing to run: a `ValueError` says so (a run never saves an untrained head)."""
    if not _no_stage_named(training_args):
        return []
    if "train" not in splits:
        raise ValueError(f"nothing to train: the data has the split(s) {', '.join(splits)} but no training split; give "
                         "--train_file (or a --dataset_name with a train split) and --do_train. To evaluate or use a "
                         "deferral model saved before, run `hf-defer evaluate` or `hf-defer predict --model FOLDER`.")
    chosen = [flag for flag, split in (("do_train", "train"), ("do_eval", "validation"), ("do_predict", "test"))
              if split in splits and not getattr(training_args, flag)]
    for flag in chosen:
        setattr(training_args, flag, True)
    logger.warning(f"no --do_train given: running {' '.join('--' + flag for flag in chosen)} on the split(s) the data "
                   "has; name the stages (--do_train, --do_eval, --do_predict) to choose others.")
    return chosen


def _no_stage_named(training_args: TrainingArguments) -> bool:
    """No `--do_train`, `--do_eval` or `--do_predict`, or only the `do_eval` that `--eval_strategy` sets."""
    strategy = str(getattr(training_args.eval_strategy, "value", training_args.eval_strategy))
    return not (training_args.do_train or training_args.do_predict or (training_args.do_eval and strategy == "no"))


def first_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def hub_repository_error(repo_id: str, training_args: TrainingArguments) -> str | None:
    """Creates the Hub repository `--push_to_hub` uploads to (as the Trainer does, `exist_ok`), once and quickly; the
    reason as one line when that fails (no network, `HF_HUB_OFFLINE=1`, no token), else None."""
    from huggingface_hub import HfApi

    try:
        HfApi(token=training_args.hub_token).create_repo(repo_id, private=training_args.hub_private_repo,
                                                          exist_ok=True)
    except Exception as error:
        return f"the Hub repository {repo_id!r} could not be created ({first_line(error)})"
    return None
