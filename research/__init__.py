"""The experiments behind `results/`, as importable code: the scripts in `scripts/` and the benchmarks only parse
options and call these. Not part of the installed package (`pip install hf-defer` does not ship it): it lives beside
`scripts/` and `benchmarks/`, which reach it through their `research` links, and `tests/research/` tests it.

May import every part of hf_defer; nothing in hf_defer imports from here.

- [`table2_hatespeech`]: the protocol of Cao et al. (2023, Table 2) on HateSpeech: splits with embeddings,
  `TrainingArguments`, training and evaluating a linear head, fine-tuning the encoder, the three-expert setup.
- [`runs`]: the three HateSpeech experiments (Table 2, three experts, fine-tuning), each writing its JSON and report;
  the options and the overwrite check shared by the scripts.
- [`table2_imagenet16h`]: the ImageNet-16H half of Table 2 at the four noise levels (data not shipped: the user's
  folder).
- [`twitteraae`]: the TwitterAAE dialect model (Blodgett et al., 2016) behind the dialect-biased expert; its tables in
  `research/data/twitteraae/`.
- [`convabuse_annotators`] and [`convabuse_annotators_report`]: eight sparse, identified annotators on ConvAbuse,
  masked, against dropping rows, a pooled expert, the best annotator and the classifier alone.
- [`hatespeech_cascade`]: a cheap model, a costly model and a person on HateSpeech: cascades, routers and deferral
  models in the error-cost plane, against the baselines of [`routing_baselines`] (confidence cascade, threshold
  router).
- [`mmlu_routing`] and [`mmlu_side_features`]: routing between two LLMs on RouteLLM's MMLU correctness (APGR, CPT).
- [`guarantees_draws`], [`guarantees_data`] and [`guarantees_report`]: deferral budgets and error targets with a
  stated confidence, the empirical rule against the guaranteed one over many calibration draws (results/guarantees.md).
- [`statistics`]: mean and standard error over seeds, the paired t-test behind the bold cells.
- [`reporting`]: the markdown reports, rendered from the saved JSON through the templates in `research/templates/`.
- [`finetune_overhead`]: the data and the report of `benchmarks/bench_finetune_overhead.py`.
"""
