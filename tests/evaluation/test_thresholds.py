"""calibrate_deferral: the budget is met on the calibration data, highest margins first, and the threshold persists."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from datasets import Dataset
from transformers import BertConfig, BertTokenizer, pipeline

import hf_defer  # registers the "deferral" task
from hf_defer import DeferralConfig, EncoderForDeferral
from hf_defer.evaluation.thresholds import MARGIN_TOLERANCE, calibrate_deferral

D = 5


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def eager_deferrer(num_experts: int = 1, seed: int = 0) -> EncoderForDeferral:
    """A random head-only model whose expert logits are pushed up: it defers almost everything on its own."""
    torch.manual_seed(seed)
    model = EncoderForDeferral(DeferralConfig(feature_size=D, num_labels=3, num_experts=num_experts))
    with torch.no_grad():
        model.head[-1].bias[3:] += 3.0
    return model.eval()


def held_out(n: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, D)).astype("float32")


def margins_by_hand(model: EncoderForDeferral, features: np.ndarray, costs: list[float] | None = None) -> np.ndarray:
    """max_j (expert_accuracy_j - cost_j) - max_y class_prob_y, straight from the model's outputs."""
    with torch.no_grad():
        out = model(features=torch.tensor(features))
    gains = out.expert_accuracy.double() - torch.tensor(costs or [0.0] * model.config.num_experts).double()
    return (gains.max(dim=1).values - out.class_probs.double().max(dim=1).values).numpy()


@pytest.mark.parametrize("rate", [0.1, 0.25, 0.5])
def test_budget_is_met_with_the_highest_margins_first(rate):
    model, features = eager_deferrer(), held_out(57)
    margins = margins_by_hand(model, features)
    assert (margins > 0).sum() > 0.5 * len(features)  # the budget binds
    threshold = calibrate_deferral(model, list(features), max_deferral_rate=rate, batch_size=8)
    assert model.config.defer_threshold == threshold
    deferred = np.array([out["defer"] for out in pipeline("deferral", model=model)(features)])
    budget = math.floor(rate * len(features))
    assert budget - 1 <= deferred.sum() <= budget
    # The deferred inputs are exactly those with the largest margins.
    top = set(np.argsort(-margins)[: deferred.sum()].tolist())
    assert set(np.flatnonzero(deferred).tolist()) == top


def test_costs_and_two_experts_and_a_dataset_with_a_features_column():
    model, features = eager_deferrer(num_experts=2, seed=3), held_out(40, seed=4)
    costs = [0.05, 0.2]
    threshold = calibrate_deferral(model, Dataset.from_dict({"features": features}), max_deferral_rate=0.2,
                                   expert_costs=costs)
    margins = margins_by_hand(model, features, costs)
    assert (margins > threshold).sum() == 8  # floor(0.2 * 40), no ties in random margins
    deferred = [out["defer"] for out in pipeline("deferral", model=model)(features, expert_costs=costs)]
    assert sum(deferred) == 8


def test_a_model_deferring_less_than_the_budget_is_left_alone():
    torch.manual_seed(0)
    model = EncoderForDeferral(DeferralConfig(feature_size=D, num_labels=3)).eval()
    with torch.no_grad():
        model.head[-1].bias[3] -= 3.0
    features = held_out(30)
    assert (margins_by_hand(model, features) > 0).sum() < 3
    assert calibrate_deferral(model, list(features), max_deferral_rate=0.1) == 0.0
    model_all = eager_deferrer()
    assert calibrate_deferral(model_all, list(features), max_deferral_rate=1.0) == 0.0


def test_threshold_survives_save_and_load_and_works_through_a_pipeline(tmp_path):
    model, features = eager_deferrer(), held_out(30)
    classify = pipeline("deferral", model=model)
    threshold = calibrate_deferral(classify, list(features), max_deferral_rate=0.1)
    assert threshold > 0
    model.save_pretrained(tmp_path / "m")
    reloaded = EncoderForDeferral.from_pretrained(tmp_path / "m")
    assert reloaded.config.defer_threshold == threshold
    assert sum(out["defer"] for out in pipeline("deferral", model=reloaded)(features)) == 3


def test_text_dataset_through_the_tokenizer():
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", *"the a cat dog sat on mat".split()]
    tokenizer = BertTokenizer(vocab={word: i for i, word in enumerate(words)})
    torch.manual_seed(0)
    encoder = BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=20,
                         vocab_size=len(words))
    model = EncoderForDeferral(DeferralConfig(encoder=encoder, num_labels=2)).eval()
    with torch.no_grad():
        model.head[-1].bias[2] += 3.0
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(words[4:], size=rng.integers(1, 6))) for _ in range(20)]
    calibrate_deferral(model, Dataset.from_dict({"text": texts}), max_deferral_rate=0.25, tokenizer=tokenizer)
    deferred = sum(out["defer"] for out in pipeline("deferral", model=model, tokenizer=tokenizer)(texts))
    assert 4 <= deferred <= 5


@pytest.mark.parametrize("rate", [0.0, -0.1, 1.5])
def test_budget_outside_zero_one_is_rejected(rate):
    with pytest.raises(ValueError, match=r"max_deferral_rate must lie in \(0, 1\]"):
        calibrate_deferral(eager_deferrer(), list(held_out(5)), max_deferral_rate=rate)


def test_other_bad_arguments():
    model = eager_deferrer()
    with pytest.raises(ValueError, match="max_deferral_rate must be a number in"):
        calibrate_deferral(model, list(held_out(5)), max_deferral_rate="0.1")
    with pytest.raises(ValueError, match="empty"):
        calibrate_deferral(model, [])
    with pytest.raises(ValueError, match="'features' column"):
        calibrate_deferral(model, Dataset.from_dict({"text": ["a"]}))
    with pytest.raises(ValueError, match="one cost per expert"):
        calibrate_deferral(model, list(held_out(5)), expert_costs=[0.1, 0.2])
    with pytest.raises(ValueError, match="deferral model"):
        calibrate_deferral(torch.nn.Linear(2, 2), list(held_out(5)))


def test_a_pipeline_built_with_costs_and_a_threshold_is_calibrated_with_its_costs():
    model, features = eager_deferrer(num_experts=2, seed=5), held_out(30, seed=6)
    costs = [0.3, 0.1]
    classify = pipeline("deferral", model=model, expert_costs=costs, defer_threshold=-1.0)
    threshold = calibrate_deferral(classify, list(features), max_deferral_rate=0.2)
    assert (margins_by_hand(model, features, costs) > threshold).sum() == 6
    assert sum(out["defer"] for out in classify(list(features))) == 6


@pytest.mark.parametrize(("num_experts", "costs"), [(1, None), (2, [0.0, 0.05])])
def test_calibrated_pipeline_delivers_the_budgeted_error_that_deferral_metrics_reports(num_experts, costs):
    # Calibrate at 10 % on a set, run the pipeline on the same set: at most 10 % deferred, and its system error is
    # exactly deferral_metrics' budgeted error @10 % (margin ranking) on the model's logits at threshold 0.
    n = 300
    model, features = eager_deferrer(num_experts, seed=3), held_out(n, seed=4)
    rng = np.random.default_rng(5)
    labels, experts = rng.integers(0, 3, n), rng.integers(0, 3, (n, num_experts))
    with torch.no_grad():
        logits = model(features=torch.tensor(features)).logits
    before = hf_defer.deferral_metrics(logits, labels, experts, model, expert_costs=costs, budget_ranking="margin")
    assert before["coverage"] < 0.5  # the budget binds

    threshold = calibrate_deferral(model, list(features), max_deferral_rate=0.1, batch_size=16, expert_costs=costs)
    outputs = pipeline("deferral", model=model)(features, batch_size=7)
    deferred = np.array([out["defer"] for out in outputs])
    assert deferred.sum() <= math.floor(0.1 * n)
    expert_index = {name: j for j, name in enumerate(model.config.expert_names)}
    wrong = [experts[i, expert_index[out["expert"]]] != labels[i] if out["defer"]
             else model.config.label2id[out["class_label"]] != labels[i] for i, out in enumerate(outputs)]
    assert float(np.mean(wrong)) == before["budgeted_error_10"]
    # The threshold lies strictly between two margins, halfway: no input sits on it.
    margins = model.surrogate.deferral_margin(logits, costs)[0].numpy()
    below, above = margins[margins < threshold].max(), margins[margins > threshold].min()
    assert threshold == pytest.approx((below + above) / 2) and not (margins == threshold).any()
    # And the metrics of the saved model (its config's threshold and costs) are those of its pipeline.
    after = hf_defer.deferral_metrics(logits, labels, experts, model)
    assert after["system_error"] == float(np.mean(wrong)) and after["coverage"] == 1 - deferred.mean()


def test_a_batch_size_above_the_number_of_inputs_batches_them_all_at_once(monkeypatch):
    # The inputs stream as a generator; torch's batch sampler of a generator lists `batch_size` indices up front, so
    # an unchecked batch_size of 2**40 took all the memory (seen in CI as a crashed test worker).
    import hf_defer.modeling.pipeline_deferral as pipeline_module

    sizes = []

    class RecordingLoader(torch.utils.data.DataLoader):
        def __init__(self, *args, batch_size=1, **kwargs):
            sizes.append(batch_size)
            assert batch_size <= 6, f"a loader of batch_size={batch_size} for 6 inputs"  # before any memory is taken
            super().__init__(*args, batch_size=batch_size, **kwargs)

    monkeypatch.setattr(pipeline_module, "DataLoader", RecordingLoader)
    model, features = eager_deferrer(), held_out(6)
    threshold = calibrate_deferral(model, list(features), max_deferral_rate=0.5, batch_size=2**40)
    assert sizes == [6]
    one_by_one = calibrate_deferral(model, list(features), max_deferral_rate=0.5, batch_size=1)
    # A batch of 6 and 6 batches of 1 give margins that may differ in their last bits (another matmul kernel), and so
    # may the thresholds: the promise is the decisions. Each threshold keeps MARGIN_TOLERANCE from every margin of
    # either run, so both defer the same inputs, the floor(0.5 * 6) = 3 of highest margin.
    margins = {size: np.array([out["margin"] for out in pipeline("deferral", model=model)(
        list(features), batch_size=size, defer_threshold=0.0, return_margin=True)]) for size in (6, 1)}
    np.testing.assert_allclose(margins[6], margins[1], rtol=0, atol=1e-6)
    for t in (threshold, one_by_one):
        for run in margins.values():
            assert np.abs(run - t).min() >= MARGIN_TOLERANCE
    assert (margins[6] > threshold).tolist() == (margins[1] > one_by_one).tolist() == (
        margins[6] >= np.sort(margins[6])[-3]).tolist()
    assert abs(threshold - one_by_one) <= 1e-6


def test_numpy_numbers_are_accepted():
    model, features = eager_deferrer(), held_out(20)
    threshold = calibrate_deferral(model, list(features), max_deferral_rate=np.float32(0.25), batch_size=np.int64(4))
    assert threshold == calibrate_deferral(model, list(features), max_deferral_rate=0.25, batch_size=4)
