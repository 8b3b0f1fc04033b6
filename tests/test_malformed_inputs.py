"""Property test (issue 11): random, malformed inputs to `deferral_metrics`, `calibrate_deferral`, the data path
(`DataCollatorForDeferral` and `check_deferral_dataset`) and the pipeline. Each call either returns valid numbers or
raises a `ValueError`/`TypeError` raised by hf_defer itself whose message names the argument at fault; no other
exception type, and no error from deep inside numpy, torch or transformers, escapes.

Each strategy starts from valid arguments and replaces zero, one or two of them (or items inside them) by malformed
values, so that both the happy path and the errors are exercised.
"""

from __future__ import annotations

import math
import traceback
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
from datasets import Dataset
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from hypothesis_profiles import examples
from transformers import BertConfig, BertTokenizer, pipeline

import hf_defer
from hf_defer import DataCollatorForDeferral, DeferralConfig, EncoderForDeferral, calibrate_deferral, deferral_metrics
from hf_defer.data.checks import check_deferral_dataset

PROPERTY = settings(max_examples=examples(200), suppress_health_check=list(HealthCheck))
SLOW_PROPERTY = settings(max_examples=examples(100), suppress_health_check=list(HealthCheck))
PACKAGE = str(Path(hf_defer.__file__).parent)
RESEARCH = str(Path(__file__).resolve().parents[1] / "research")  # routing_baselines, the cascade's baselines
D = 4
WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"the a cat dog sat on mat is good bad very".split()]

MALFORMED = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-101, 20),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=4),
    st.builds(np.int64, st.integers(-3, 20)),
    hnp.arrays(st.sampled_from([np.float32, np.float64, np.int64, np.bool_, np.dtype("U2")]),
               hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)),
    st.lists(st.lists(st.integers(-101, 5), max_size=3), max_size=4),  # ragged
    st.lists(st.one_of(st.integers(-101, 5), st.text(max_size=2), st.none(), st.floats()), max_size=4),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


def check_error(error: BaseException, names: set[str], owners: tuple[str, ...] = (PACKAGE,)) -> None:
    """The error is a ValueError/TypeError raised in hf_defer's own code (or in another of `owners`), and its message
    names one of ``names``."""
    assert type(error) in (ValueError, TypeError), repr(error)
    frames = traceback.extract_tb(error.__traceback__)
    assert frames and frames[-1].filename.startswith(owners), (
        f"{type(error).__name__} raised outside hf_defer, at {frames[-1].filename}:{frames[-1].lineno}: {error}")
    message = str(error)
    assert any(name in message for name in names), f"no argument named in: {message}"


@st.composite
def corrupt(draw, arguments: dict, names: list[str]) -> dict:
    for name in draw(st.lists(st.sampled_from(names), max_size=2, unique=True)):
        arguments[name] = draw(MALFORMED)
    return arguments


# ---------------------------------------------------------------------------------------------------- metrics


@st.composite
def metric_arguments(draw) -> dict:
    n, K, M = draw(st.integers(0, 6)), draw(st.integers(2, 4)), draw(st.integers(1, 3))
    experts = draw(hnp.arrays(np.int64, (n, M), elements=st.integers(0, K - 1)))
    arguments = {
        "logits": draw(hnp.arrays(np.float32, (n, K + M), elements=st.floats(-50, 50, width=32))),
        "labels": draw(hnp.arrays(np.int64, (n,), elements=st.sampled_from([-100, *range(K)]))),
        "expert_labels": experts[:, 0] if M == 1 and draw(st.booleans()) else experts,
        "surrogate": draw(st.sampled_from(hf_defer.modeling.SURROGATES)),
        "num_experts": M,
        "n_bins": draw(st.integers(1, 20)),
        "budgets": tuple(draw(st.lists(st.floats(0.001, 1.0), max_size=3))),
    }
    return draw(corrupt(arguments, list(arguments)))


@PROPERTY
@given(metric_arguments())
def test_deferral_metrics(arguments):
    try:
        metrics = deferral_metrics(**arguments)
    except (ValueError, TypeError) as error:
        check_error(error, set(arguments))
        return
    assert all(isinstance(value, float) and 0.0 <= value <= 1.0 for value in metrics.values()), metrics


# ---------------------------------------------------------------------------------------------------- error-cost curves


@st.composite
def curve_arguments(draw) -> tuple[str, dict]:
    """Valid arguments of error_cost_curve, confidence_cascade_curve or router_curve, then zero to two corrupted, or
    one array transposed (an [M, N] where [N, M] is expected) or given a NaN."""
    n, K, M = draw(st.integers(1, 5)), draw(st.integers(2, 4)), draw(st.integers(1, 3))
    unit = st.floats(0, 1, width=32)
    kind = draw(st.sampled_from(["error_cost", "cascade", "router"]))
    labels = draw(hnp.arrays(np.int64, (n,), elements=st.integers(0, K - 1)))
    if kind == "error_cost":
        arguments = {"class_probs": draw(hnp.arrays(np.float64, (n, K), elements=unit)),
                     "expert_accuracy": draw(hnp.arrays(np.float64, (n, M), elements=unit)),
                     "labels": labels, "expert_labels": draw(hnp.arrays(np.int64, (n, M), elements=st.integers(0, K - 1))),
                     "expert_costs": draw(st.lists(st.floats(0, 2), min_size=M, max_size=M)),
                     "scales": draw(st.lists(st.floats(0, 5), min_size=1, max_size=3)),
                     "threshold": draw(st.floats(-1, 1))}
    else:
        L = M + 1
        arguments = {"member_answers": draw(hnp.arrays(np.int64, (n, L), elements=st.integers(0, K - 1))),
                     "labels": labels, "prices": draw(st.lists(st.floats(0, 2), min_size=L, max_size=L)),
                     "thresholds": np.sort(draw(hnp.arrays(np.float64, (2, L - 1), elements=unit)), axis=1)}
        if kind == "cascade":
            arguments["member_confidence"] = draw(hnp.arrays(np.float64, (n, L - 1), elements=unit))
        else:
            arguments["score"] = draw(hnp.arrays(np.float64, (n,), elements=unit))
    arrays = [name for name, value in arguments.items() if isinstance(value, np.ndarray) and value.ndim == 2]
    change = draw(st.sampled_from(["none", "corrupt", "transpose", "nan"]))
    if change == "corrupt":
        arguments = draw(corrupt(arguments, list(arguments)))
    elif change == "transpose":
        name = draw(st.sampled_from(arrays))
        arguments[name] = arguments[name].T
    elif change == "nan":
        name = draw(st.sampled_from([name for name in arrays if arguments[name].dtype == np.float64] + ["labels"]))
        value = arguments[name].astype(np.float64)
        value.flat[draw(st.integers(0, value.size - 1))] = np.nan
        arguments[name] = value
    return kind, arguments


def _two_rows(**changed) -> dict:
    """Valid error_cost_curve arguments for 2 inputs, K = 2 classes and M = 2 experts, with ``changed`` replaced."""
    return {"class_probs": np.full((2, 2), 0.5), "expert_accuracy": np.full((2, 2), 0.5), "labels": np.array([0, 1]),
            "expert_labels": np.array([[0, 1], [1, 1]]), "expert_costs": [0.0, 0.1], "scales": [0.0],
            "threshold": 0.0, **changed}


@SLOW_PROPERTY
@given(curve_arguments())
@example(("error_cost", _two_rows(expert_costs=[[], [0]])))  # drawn on a CI machine: numpy's ragged-array error
@example(("error_cost", _two_rows(expert_costs=[[0.0], [0.1]])))  # nested: was flattened and accepted
@example(("router", {"member_answers": np.array([[0, 1], [1, 1]]), "labels": np.array([0, 1]), "prices": [[], [0]],
                     "score": np.array([0.2, 0.7]), "thresholds": np.array([[0.5]])}))
def test_error_cost_and_routing_curves(case):
    from hf_defer.evaluation.costs import error_cost_curve
    from research.routing_baselines import confidence_cascade_curve, router_curve

    kind, arguments = case
    function = {"error_cost": error_cost_curve, "cascade": confidence_cascade_curve, "router": router_curve}[kind]
    try:
        curve = function(**arguments)
    except (ValueError, TypeError) as error:
        check_error(error, {*arguments, "defer_threshold"}, (PACKAGE, RESEARCH))
        return
    # Accepted: the inputs were what the documentation asks for, read in their own order.
    n = len(arguments["labels"])
    assert np.asarray(arguments["labels"]).shape == (n,) and np.isfinite(np.asarray(arguments["labels"], float)).all()
    for name, value in arguments.items():
        if isinstance(value, np.ndarray) and value.ndim == 2 and name not in ("thresholds",):
            assert value.shape[0] == n and np.isfinite(value).all(), name
    assert np.isfinite(curve.cost).all() and ((curve.error >= 0) & (curve.error <= 1)).all()


# ---------------------------------------------------------------------------------------------------- calibration

TWO_EXPERTS = EncoderForDeferral(DeferralConfig(feature_size=D, num_labels=3, num_experts=2)).eval()
ROWS = st.lists(st.floats(-5, 5, width=32), min_size=D, max_size=D)


@st.composite
def calibration_arguments(draw) -> dict:
    arguments = {
        "dataset": draw(st.lists(ROWS, min_size=1, max_size=5)),
        "max_deferral_rate": draw(st.floats(0.01, 1.0)),
        "batch_size": draw(st.integers(1, 4)),
        "expert_costs": draw(st.one_of(st.none(), st.lists(st.floats(-1, 1), min_size=2, max_size=2))),
    }
    if draw(st.booleans()):  # one bad row among good ones
        rows = list(arguments["dataset"])
        rows.insert(draw(st.integers(0, len(rows))), draw(st.one_of(MALFORMED, st.lists(MALFORMED, max_size=D + 1))))
        arguments["dataset"] = rows
    return draw(corrupt(arguments, list(arguments)))


@SLOW_PROPERTY
@given(calibration_arguments())
def test_calibrate_deferral(arguments):
    try:
        threshold = calibrate_deferral(TWO_EXPERTS, **arguments)
    except (ValueError, TypeError) as error:
        check_error(error, {*arguments, "input", "feature vector"})
        return
    assert math.isfinite(threshold) and threshold >= 0.0 and TWO_EXPERTS.config.defer_threshold == threshold


# ---------------------------------------------------------------------------------------------------- data


@st.composite
def example_rows(draw) -> tuple[list[dict], int]:
    n, M = draw(st.integers(1, 4)), draw(st.integers(1, 2))
    rows = []
    for _ in range(n):
        experts = draw(st.lists(st.integers(0, 2), min_size=M, max_size=M))
        rows.append({"features": draw(ROWS), "labels": draw(st.sampled_from([-100, 0, 1, 2])),
                     "expert_labels": experts[0] if M == 1 and draw(st.booleans()) else experts})
    for _ in range(draw(st.integers(0, 2))):  # break a value, or drop a key
        row, key = draw(st.integers(0, n - 1)), draw(st.sampled_from(["features", "labels", "expert_labels", "text"]))
        if draw(st.booleans()):
            rows[row][key] = draw(MALFORMED)
        else:
            rows[row].pop(key, None)
    return rows, M


@PROPERTY
@given(example_rows())
def test_data_collator(case):
    rows, _ = case
    try:
        batch = DataCollatorForDeferral()(rows)
    except (ValueError, TypeError) as error:
        check_error(error, {"features", "labels", "expert_labels", "text"})
        return
    sizes = {value.shape[0] for value in batch.values()}
    assert sizes == {len(rows)} and all(torch.is_tensor(value) for value in batch.values())


@PROPERTY
@given(example_rows())
@example(([{"features": [0.0] * D, "labels": np.array(0), "expert_labels": [0]}], 1))  # make test-explore: labels
def test_check_deferral_dataset(case):  # stored as [0] were accepted, then the collator refused them
    rows, M = case
    try:
        dataset = Dataset.from_list(rows)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError, ValueError, OverflowError):
        assume(False)  # rows Arrow cannot hold as one table: the datasets library refuses them itself
    model = EncoderForDeferral(DeferralConfig(feature_size=D, num_labels=3, num_experts=M))
    try:
        check_deferral_dataset(dataset, model, "train_dataset")
    except ValueError as error:
        check_error(error, {"train_dataset"})
        return
    # accepted: then the default collator and a forward pass with the loss work on the model's columns (the Trainer
    # drops the others, remove_unused_columns=True)
    batch = DataCollatorForDeferral()(list(dataset.select_columns(["features", "labels", "expert_labels"])))
    assert torch.isfinite(model(**batch).loss)


# ---------------------------------------------------------------------------------------------------- pipeline

torch.manual_seed(0)
TEXT = pipeline(
    "deferral",
    model=EncoderForDeferral(DeferralConfig(
        encoder=BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=20,
                           vocab_size=len(WORDS), max_position_embeddings=12),
        num_labels=3, num_experts=2)).eval(),
    tokenizer=BertTokenizer(vocab={word: i for i, word in enumerate(WORDS)}),
)
HEAD = pipeline("deferral", model=TWO_EXPERTS)
SENTENCES = st.lists(st.sampled_from(WORDS[5:] + ["zebra", "!"]), max_size=14).map(" ".join)
OPTIONS = {
    "top_k": st.one_of(st.none(), st.integers(1, 3)),
    "expert_costs": st.lists(st.floats(-1, 1), min_size=2, max_size=2),
    "defer_threshold": st.floats(-1, 1),
    "truncation": st.sampled_from([True, False, "longest_first"]),
    "max_length": st.integers(1, 30),
    "padding": st.sampled_from([True, False, "longest", "max_length"]),
    "batch_size": st.integers(1, 3),
}


@st.composite
def pipeline_call(draw) -> tuple[str, object, dict]:
    kind = draw(st.sampled_from(["text", "features"]))
    if kind == "text":
        one = st.one_of(SENTENCES, st.fixed_dictionaries({"text": SENTENCES, "text_pair": SENTENCES}))
    else:
        one = ROWS
    inputs = draw(st.one_of(one, st.lists(one, min_size=1, max_size=3)))
    names = [name for name in OPTIONS if kind == "text" or name not in ("truncation", "max_length", "padding")]
    options = {name: draw(OPTIONS[name]) for name in draw(st.lists(st.sampled_from(names), max_size=3, unique=True))}
    if draw(st.booleans()):
        options = draw(corrupt(options, [*names, "expert_cost", "foo", "return_all_scores"]))
    if draw(st.booleans()):
        inputs = draw(st.one_of(MALFORMED, st.lists(st.one_of(one, MALFORMED), min_size=1, max_size=3),
                                st.dictionaries(st.sampled_from(["text", "text_pair", "sentence"]), MALFORMED,
                                                max_size=2)))
    return kind, inputs, options


@SLOW_PROPERTY
@given(pipeline_call())
def test_pipeline(call):
    kind, inputs, options = call
    try:
        outputs = (TEXT if kind == "text" else HEAD)(inputs, **options)
    except (ValueError, TypeError) as error:
        check_error(error, {*options, "inputs", "input", "text", "feature vector", "input_ids", "option"})
        return
    for out in outputs if isinstance(outputs, list) else [outputs]:
        assert 0.0 <= out["class_score"] <= 1.0 and all(0.0 <= a <= 1.0 for a in out["expert_accuracy"])
        assert out["defer"] == (out["label"] == "defer") and len(out["expert_accuracy"]) == 2


@pytest.mark.parametrize("value", [np.float32(0.5), np.int64(2)])
def test_numpy_scalars_are_numbers(value):
    """Spot check outside hypothesis: numpy scalars where Python numbers are expected."""
    assert HEAD([0.0] * D, defer_threshold=value)["label"]
