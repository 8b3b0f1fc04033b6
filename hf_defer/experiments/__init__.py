"""The HateSpeech experiments of hf_defer, as importable code: `scripts/reproduce_hatespeech.py`, `scripts/demo.py`
and the benchmarks share it.

- [`hatespeech`]: the protocol of Cao et al. (2023, Table 2): splits with embeddings, `TrainingArguments`, training
  and evaluating a linear head, fine-tuning the encoder, the three-expert setup.
- [`runs`]: the three experiments (Table 2, three experts, fine-tuning), each writing its JSON and report.
- [`statistics`]: mean and standard error over seeds, the paired t-test behind the bold cells.
- [`reporting`]: the markdown reports, rendered from the saved JSON through the templates in `hf_defer/templates/`.
- [`overhead`]: the data and the report of `benchmarks/bench_finetune_overhead.py`.
"""
