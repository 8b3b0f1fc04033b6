"""The experiments of hf_defer, as importable code: the scripts in `scripts/` and the benchmarks only parse options
and call these.

May import every layer below (modeling, evaluation, data, experts, training, hub); nothing in the library imports
from here.

- [`hatespeech`]: the protocol of Cao et al. (2023, Table 2): splits with embeddings, `TrainingArguments`, training
  and evaluating a linear head, fine-tuning the encoder, the three-expert setup.
- [`runs`]: the three experiments (Table 2, three experts, fine-tuning), each writing its JSON and report.
- [`imagenet16h`]: the ImageNet-16H half of Table 2 at the four noise levels (data not shipped: the user's folder).
- [`convabuse`] and [`convabuse_report`]: eight sparse, identified annotators on ConvAbuse, masked, against dropping
  rows, a pooled expert, the best annotator and the classifier alone.
- [`cascade`]: a cheap model, a costly model and a person on HateSpeech: cascades, routers and deferral models in the
  error-cost plane.
- [`mmlu_routing`]: routing between two LLMs on RouteLLM's MMLU correctness (APGR, CPT).
- [`guarantees`], [`guarantees_data`] and [`guarantees_report`]: deferral budgets and error targets with a stated
  confidence, the empirical rule against the guaranteed one over many calibration draws (results/guarantees.md).
- [`statistics`]: mean and standard error over seeds, the paired t-test behind the bold cells.
- [`reporting`]: the markdown reports, rendered from the saved JSON through the templates in `hf_defer/templates/`.
- [`overhead`]: the data and the report of `benchmarks/bench_finetune_overhead.py`.
"""
