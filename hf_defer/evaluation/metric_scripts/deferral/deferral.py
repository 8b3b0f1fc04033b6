"""Learning-to-defer metrics as an `evaluate` module: `evaluate.load(path)`, or `hf_defer.load_metric()`.

It computes `hf_defer.deferral_metrics` (system error, coverage, classifier error, ECE of the expert-accuracy
estimates, budgeted errors) and holds no copy of it: hf_defer must be installed (`requirements.txt`).
"""

import datasets
import evaluate
import numpy as np

_DESCRIPTION = """
Deferral metrics (Cao et al., NeurIPS 2023, appendix "Details of Evaluation Metrics") of a model that predicts one of
K classes or defers to one of M experts. `predictions` are the model's K + M logits per input (or, with
`inputs="probabilities"`, its K class probabilities followed by its M expert-accuracy estimates), `references` the
true classes and `expert_predictions` each expert's answer (an int for one expert, a list of M ints for M).
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list[list[float]]`): per input, K class logits then M expert logits (or probabilities, see `inputs`).
    references (`list[int]`): true classes; -100 ignores a row.
    expert_predictions (`list[int]` or `list[list[int]]`): each expert's answer per input.
    surrogate (`str`, *optional*, defaults to `"asm"`): the surrogate the model was trained with (its estimator).
    num_experts (`int`, *optional*): M; by default 1 for an int per input, the list length otherwise.
    n_bins (`int`, *optional*, defaults to 15): ECE bins.
    budgets (`list[float]`, *optional*, defaults to `[0.1, 0.2, 0.3]`): deferral budgets.
    inputs (`str`, *optional*, defaults to `"logits"`): `"logits"`, or `"probabilities"`: the estimates
        (p_1..p_K, a_1..a_M) of any model, each in [0, 1], turned into the A-SM logits whose estimates they are.
    expert_costs (`list[float]`, *optional*): the cost of each expert in the decision rule (default: zeros).
    defer_threshold (`float`, *optional*): the deferral margin, e.g. a calibrated one (default: 0).
    budget_ranking (`str`, *optional*, defaults to `"expert_accuracy"`): which deferred inputs a budget keeps: the
        paper's `"expert_accuracy"`, or `"margin"` (what a calibrated pipeline delivers, as `DeferralTrainer` reports).
    `hf_defer.load_metric(model)` sets surrogate, experts, costs and threshold from a model and ranks by margin.
Returns:
    `dict`: `system_error`, `coverage`, `classifier_error`, `majority_class_error`, `expert_ece`,
    `budgeted_error_{10,20,30}` (fractions); with M > 1 also `expert_ece_j` and `deferral_rate_j`; with missing
    answers `unscored_deferrals` and `scored_rows` (counts).
Examples:
    >>> import evaluate, hf_defer
    >>> metric = hf_defer.load_metric()
    >>> metric.compute(predictions=[[3.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.5, 4.0]], references=[0, 2],
    ...                expert_predictions=[1, 2])["system_error"]
    0.0
"""

_CITATION = """
@inproceedings{cao2023defense,
  title={In Defense of Softmax Parametrization for Calibrated and Consistent Learning to Defer},
  author={Cao, Yuzhou and Mozannar, Hussein and Feng, Lei and Wei, Hongxin and An, Bo},
  booktitle={Advances in Neural Information Processing Systems},
  year={2023}
}
"""


def _asm_logits(estimates, num_experts):
    """A-SM logits u with softmax(u_1..K) = p and psi_{K+j}(u) = a_j: u_y = log p_y and
    u_{K+j} = log a_j + log(1 - max p) - log(1 - a_j), clipped away from 0 and 1. Estimates outside [0, 1] (or NaN)
    are refused: they are no probabilities, and clipping them would hide the mistake."""
    eps = 1e-12
    estimates = np.asarray(estimates, dtype=np.float64)
    bad = ~((estimates >= 0) & (estimates <= 1))
    if bad.any():
        row, column = (int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"with inputs='probabilities', predictions must be probabilities in [0, 1]; row {row}, "
                         f"column {column} holds {estimates[row, column]!r} ({int(bad.sum())} such value(s)). Pass "
                         "the logits with inputs='logits', or the estimates themselves.")
    estimates = np.clip(estimates, eps, 1 - eps)
    probs, accuracy = estimates[:, :-num_experts], estimates[:, -num_experts:]
    rest = np.log1p(-probs.max(axis=1, keepdims=True))
    return np.concatenate([np.log(probs), np.log(accuracy) + rest - np.log1p(-accuracy)], axis=1)


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Deferral(evaluate.Metric):
    def _info(self):
        common = {"predictions": datasets.Sequence(datasets.Value("float32")), "references": datasets.Value("int64")}
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=[
                datasets.Features({**common, "expert_predictions": datasets.Value("int64")}),
                datasets.Features({**common, "expert_predictions": datasets.Sequence(datasets.Value("int64"))}),
            ],
            homepage="https://arxiv.org/abs/2311.01106",
            license="Apache-2.0",
            codebase_urls=["https://pypi.org/project/hf-defer/"],
            reference_urls=["https://arxiv.org/abs/2311.01106"],
        )

    defaults = {}
    """Decision settings that `compute` uses unless given: `hf_defer.load_metric(model)` fills them from a model."""

    def _compute(self, predictions, references, expert_predictions, surrogate=None, num_experts=None, n_bins=15,
                 budgets=(0.1, 0.2, 0.3), inputs="logits", expert_costs=None, defer_threshold=None,
                 budget_ranking=None):
        from hf_defer import deferral_metrics

        given = {"surrogate": surrogate, "num_experts": num_experts, "expert_costs": expert_costs,
                 "defer_threshold": defer_threshold, "budget_ranking": budget_ranking}
        settings = {"surrogate": "asm", "budget_ranking": "expert_accuracy", **self.defaults,
                    **{key: value for key, value in given.items() if value is not None}}
        experts = np.asarray(expert_predictions, dtype=np.int64)
        surrogate = settings["surrogate"]  # a name, or a deferral model's config (its surrogate, experts, names)
        num_experts = settings.get("num_experts") or getattr(surrogate, "num_experts", None) \
            or (1 if experts.ndim == 1 else experts.shape[1])
        predictions = np.asarray(predictions, dtype=np.float32)
        if inputs == "probabilities":
            predictions, surrogate = _asm_logits(predictions, num_experts), "asm"
        elif inputs != "logits":
            raise ValueError(f"inputs must be 'logits' or 'probabilities', got {inputs!r}.")
        return deferral_metrics(predictions, np.asarray(references, dtype=np.int64), experts, surrogate, num_experts,
                                n_bins, tuple(budgets), expert_costs=settings.get("expert_costs"),
                                defer_threshold=settings.get("defer_threshold"),
                                budget_ranking=settings["budget_ranking"])
