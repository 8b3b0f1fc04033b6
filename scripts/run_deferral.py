#!/usr/bin/env python
"""Learning to defer on your own data, in the shape of transformers' `run_classification.py`.

Fine-tune any encoder (text or vision) into a deferral model that answers or hands the input to the expert more
likely to be right; the experts' answers are columns of the data (`--expert_column_names alice,bob`) or a simulated
expert (`--simulated_expert class_subset`). Flags are transformers' own (`--model_name_or_path`, `--train_file`,
`--text_column_names`, `--do_train`, every `TrainingArguments` flag) plus the deferral ones;
`python scripts/run_deferral.py --help` lists them in groups. A single `.json` argument holds the flags instead (see
`scripts/run_deferral_config.json`).

    python scripts/run_deferral.py --model_name_or_path sentence-transformers/all-MiniLM-L6-v2 \\
        --train_file train.csv --validation_file dev.csv --test_file test.csv \\
        --text_column_names text --label_column_name label --expert_column_names alice,bob --missing_expert drop \\
        --do_train --do_eval --do_predict --max_deferral_rate 0.2 --output_dir my-deferral-model

It writes, as `run_classification.py` does, `train_results.json`, `eval_results.json`, `test_results.json`,
`all_results.json` and `trainer_state.json` into `--output_dir`, plus `calibrated_eval_results.json` (the validation
metrics after calibrating the deferral budget), the Hub-ready model folder, `predictions.csv` and `hf_defer_run.json`
(the run's summary). `accelerate launch scripts/run_deferral.py ...` and `torchrun --nproc_per_node N
scripts/run_deferral.py ...` run it on several processes. `hf-defer train ...` is the same command, installed with
the package.
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Parses the flags and runs them; returns the metrics of every stage (for use from Python)."""
    from hf_defer.commands.arguments import parse_run_arguments
    from hf_defer.commands.run import run_deferral

    # HfArgumentParser over (ModelArguments, DataTrainingArguments, TrainingArguments): flags, or one JSON file.
    model_args, data_args, training_args = parse_run_arguments(argv)
    return run_deferral(model_args, data_args, training_args)  # sets the log levels from training_args first


if __name__ == "__main__":
    # As `hf-defer train`: mistakes (unknown flags, missing files, a folder of your own as --output_dir) are answered
    # in one line with exit status 2 (before torch is imported once a first run saved the flags); a bare --debug shows
    # the traceback instead.
    from hf_defer.commands.cli import run_script

    status = run_script(sys.argv[1:], prog=os.path.basename(sys.argv[0]))
    if status:
        raise SystemExit(status)
