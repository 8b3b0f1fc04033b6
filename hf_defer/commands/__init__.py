"""Entry points: `scripts/run_deferral.py` (`run`), the `hf-defer` console command (`cli`) and their arguments.

May import every other subpackage (modeling, inspection, evaluation, data, experts, cascade, training, hub, review,
serving); nothing imports from here but `hf_defer.__main__`.
"""
