"""Entry points: `scripts/run_deferral.py` (`run`), the `hf-defer` console command (`cli`) and their arguments.

May import every layer below (modeling, evaluation, data, experts, training, hub); nothing imports from here but
`hf_defer.__main__`.
"""
