#!/usr/bin/env python
"""ConvAbuse: learning whom to defer to among 8 expert annotators who each labelled a part of the data.

**Content warning:** the data contain abusive, sexist and sexually explicit text.

Linear heads over frozen MiniLM embeddings of the user turn and its context, on the authors' splits of ConvAbuse
(`hf_defer.data.load_convabuse`, shipped): A-SM, S-SM and A-OvA with the 8 annotators as experts whose missing answers
are masked, against (a) dropping incomplete rows, (b) one pooled expert "whoever answered", (c) the best single
annotator and (d) the classifier alone. Each deferral to annotator j is scored against the majority of the other
annotators of that item; the report also scores everything against the full majority and Dawid–Skene. The experiment
lives in `research.convabuse_annotators` (and its report in `convabuse_annotators_report`); this script parses the
options and runs it.

Outputs (in --output-dir, default results/): convabuse.md (the report) and convabuse.json (every run's metrics).

Example:

```
HF_HUB_OFFLINE=1 python scripts/convabuse.py               # ~5 min on 2 CPU cores, + ~4 min of embeddings once
HF_HUB_OFFLINE=1 python scripts/convabuse.py --quick --output-dir /tmp/q   # smoke run
HF_HUB_OFFLINE=1 python scripts/convabuse.py --render-only --overwrite     # rewrite convabuse.md from the JSON
```
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

import datasets
import transformers

from research.convabuse_annotators import ConvAbuseArguments, run_convabuse
from research.convabuse_annotators_report import convabuse_markdown
from research.runs import confirm_overwrite, parse_experiment_arguments

RESULTS = Path(__file__).resolve().parents[1] / "results"


def parse_args(argv: Sequence[str] | None = None) -> ConvAbuseArguments:
    """Command-line options (see `--help`); invalid values end the program with the parser's message."""
    return parse_experiment_arguments(ConvAbuseArguments, __doc__.split("\n\n")[0], RESULTS, argv)


def main(argv: Sequence[str] | None = None) -> int:
    arguments = parse_args(argv)
    output = Path(arguments.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    if arguments.render_only:
        confirm_overwrite(output, ["convabuse.md"], arguments.overwrite)
        record = json.loads((output / "convabuse.json").read_text())
        (output / "convabuse.md").write_text(convabuse_markdown(record))
        print(f"Rewrote {output / 'convabuse.md'} from {output / 'convabuse.json'}.")
        return 0
    confirm_overwrite(output, ["convabuse.md", "convabuse.json"], arguments.overwrite)
    transformers.logging.set_verbosity_warning() if arguments.verbose else transformers.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    start = time.perf_counter()
    record = run_convabuse(arguments, output)
    text = convabuse_markdown(record)
    (output / "convabuse.md").write_text(text)
    print(text)
    print(f"Done in {time.perf_counter() - start:.0f} s; results in {output}/")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
