#!/usr/bin/env python
"""Reproduce the HateSpeech rows of Table 2 of Cao et al. (NeurIPS 2023) with hf_defer, and go a little further.

Protocol of the paper (and of human_ai_deferral, which it follows): the expert is one random annotator per tweet;
each run re-splits the data 70/10/20 at random; tweets are embedded once into 384-d sentence embeddings; a linear
head with K + 1 = 4 outputs is trained for 50 epochs with SGD (momentum 0.9, learning rate 0.1, cosine annealing,
batch 128, no weight decay) for each surrogate (A-SM, S-SM, S-OvA, A-OvA) and evaluated on the test split. Here the
seed of a run drives the split, the expert draw and the initialisation, and the embeddings come from
all-MiniLM-L6-v2 (the paper used paraphrase-multilingual-MiniLM-L12-v2, which is not available offline).
The experiments themselves live in `research` (protocol, runs, statistics, reports); this script parses
the options and runs them.

Outputs (in --output-dir, default results/):

* hatespeech.md: the table in the paper's format (mean (standard error) in percent over seeds, best and
  statistically comparable methods in bold), the paper's numbers beside it, and the discussion of differences;
* hatespeech_runs.json: every run's metrics;
* hatespeech_expert_accuracy.png, hatespeech_reliability.png: Figure 3-style histograms of the estimated against the
  true expert accuracy, and reliability diagrams of the expert-accuracy estimates;
* with --multi-expert: hatespeech_multi_expert.md/.json (three experts, one of them biased against African-American
  English as flagged by TwitterAAE);
* with --finetune: hatespeech_finetune.md/.json (end-to-end fine-tuning of the encoder against the frozen protocol);
* with --imagenet16h FOLDER: imagenet16h.md and imagenet16h_runs.json, the ImageNet-16H half of Table 2 (4 surrogates
  x 5 seeds at each noise level; the data are not shipped, see `hf_defer.data.load_imagenet16h`).

Example:

```
HF_HUB_OFFLINE=1 python scripts/reproduce_hatespeech.py --multi-expert   # ~25 min on 2 idle CPU cores, + embeddings once
HF_HUB_OFFLINE=1 python scripts/reproduce_hatespeech.py --quick --output-dir /tmp/q   # smoke run
HF_HUB_OFFLINE=1 python scripts/reproduce_hatespeech.py --render-only --overwrite     # re-write the markdown
python scripts/reproduce_hatespeech.py --skip-main --imagenet16h path/to/imagenet16h   # ImageNet-16H only
```
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import datasets
import transformers

from research.table2_imagenet16h import render_imagenet16h, run_imagenet16h
from research.reporting import render_reports
from research.runs import (ReproductionArguments, confirm_overwrite, parse_experiment_arguments,
                                       run_finetune, run_multi_expert, run_table2)

RESULTS = Path(__file__).resolve().parents[1] / "results"


def parse_args(argv: Sequence[str] | None = None) -> ReproductionArguments:
    """Command-line options (see `--help`); invalid combinations end the program with the parser's message."""
    return parse_experiment_arguments(ReproductionArguments, __doc__.split("\n\n")[0], RESULTS, argv)


def main(argv: Sequence[str] | None = None) -> int:
    arguments = parse_args(argv)
    output = Path(arguments.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    confirm_overwrite(output, arguments.planned_outputs(), arguments.overwrite)
    if arguments.verbose:
        transformers.logging.set_verbosity_warning()
    else:
        transformers.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    if arguments.render_only:
        render_reports(output)
        if (output / "imagenet16h_runs.json").exists():
            render_imagenet16h(output)
        print(f"Rewrote the markdown and the reliability diagrams in {output} from the saved runs.")
        return 0
    start = time.perf_counter()
    experiments = [(arguments.multi_expert, run_multi_expert, "hatespeech_multi_expert.md"),
                   (arguments.finetune, run_finetune, "hatespeech_finetune.md"),
                   (not arguments.skip_main, run_table2, "hatespeech.md"),
                   (arguments.imagenet16h is not None, run_imagenet16h, "imagenet16h.md")]
    for wanted, run, report in experiments:
        if wanted:
            run(arguments, output)
            print((output / report).read_text())
    print(f"Done in {time.perf_counter() - start:.0f} s; results in {output}/")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
