#!/usr/bin/env python
"""Learning to defer on your own data, in the shape of transformers' `run_classification.py`.

Fine-tune any encoder (text or vision) into a deferral model that answers or hands the input to the expert more
likely to be right; the experts' answers are columns of the data (`--expert_column_names alice,bob`) or a simulated
expert (`--simulated_expert class_subset`). Flags are transformers' own (`--model_name_or_path`, `--train_file`,
`--do_train`, every `TrainingArguments` flag) plus the deferral ones; `python scripts/run_deferral.py --help` lists
them all. A single `.json` argument holds the flags instead (see `scripts/run_deferral_config.json`).

    python scripts/run_deferral.py --model_name_or_path sentence-transformers/all-MiniLM-L6-v2 \\
        --train_file train.csv --validation_file dev.csv --test_file test.csv \\
        --text_column_name text --label_column_name label --expert_column_names alice,bob --missing_expert drop \\
        --do_train --do_eval --do_predict --max_deferral_rate 0.2 --output_dir my-deferral-model

`accelerate launch scripts/run_deferral.py ...` and `torchrun --nproc_per_node N scripts/run_deferral.py ...` run it
on several processes. `hf-defer train ...` is the same command, installed with the package.
"""

from __future__ import annotations

import logging
import sys

from hf_defer.commands.arguments import parse_run_arguments
from hf_defer.commands.run import run_deferral


def main(argv: list[str] | None = None) -> dict[str, float]:
    # HfArgumentParser over (ModelArguments, DataTrainingArguments, TrainingArguments): flags, or one JSON file.
    model_args, data_args, training_args = parse_run_arguments(argv)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        level=training_args.get_process_log_level())
    return run_deferral(model_args, data_args, training_args)


if __name__ == "__main__":
    main(sys.argv[1:])
