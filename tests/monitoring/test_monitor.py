"""DeferralMonitor: its arithmetic against hand-worked values, the audit weighting, the alarm's false-alarm rate over
many simulated unshifted streams, detection of a simulated shift, and its construction from a calibrated model."""

import doctest

import numpy as np
import pytest
from scipy.optimize import minimize
from scipy.stats import binom, chi2

import hf_defer
from hf_defer import DeferralMonitor


def kept(score=0.9, label="yes", alice=0.7, bob=0.6):
    return {"defer": False, "expert": None, "class_label": label, "class_score": score,
            "expert_scores": {"alice": alice, "bob": bob}}


def deferred(expert="alice", alice=0.95, bob=0.8, label="no"):
    return {"defer": True, "expert": expert, "class_label": label, "class_score": 0.6,
            "expert_scores": {"alice": alice, "bob": bob}}


def test_rates_and_label_free_estimate_by_hand():
    monitor = DeferralMonitor(["alice", "bob"], confidence=0.9, max_deferral_rate=0.5, max_error=0.3)
    monitor.update([kept(0.9), deferred("alice", alice=0.95), kept(0.8), deferred("bob", bob=0.7)])
    monitor.update([kept(0.5)])
    channels = monitor.state()["channels"]
    assert channels["deferral_rate"]["mean"] == pytest.approx(2 / 5)
    assert channels["deferral_rate[alice]"]["mean"] == pytest.approx(1 / 5)
    assert channels["deferral_rate[bob]"]["mean"] == pytest.approx(1 / 5)
    # 1 - p where kept, 1 - a_j of the chosen expert where deferred
    assert channels["estimated_error"]["mean"] == pytest.approx((0.1 + 0.05 + 0.2 + 0.3 + 0.5) / 5)
    # two tests (the budget, the estimated error): 0.1 split in halves
    assert monitor.state()["tests"] == 2 and monitor.alpha == pytest.approx(0.05)
    assert channels["deferral_rate"]["confidence"] == pytest.approx(0.95)
    assert channels["deferral_rate"]["lower"] < 0.4 < channels["deferral_rate"]["upper"]
    assert channels["deferral_rate[bob]"]["target"] is None and channels["deferral_rate"]["target"] == 0.5


def test_audit_weighting_by_hand():
    monitor = DeferralMonitor(["alice", "bob"], confidence=0.9, max_error=0.2, audit_rate=0.5, seed=0)
    outputs = [kept(label="yes"), kept(label="no"), deferred("alice"), kept(label="yes"), deferred("bob"),
               kept(label="no"), kept(label="yes"), kept(label="yes")]
    ids = [f"r{i}" for i in range(8)]
    asked = monitor.update(outputs, ids=ids)
    assert {"r2", "r4"} <= set(asked)  # every deferred row
    audited = [i for i in range(8) if ids[i] in asked and not outputs[i]["defer"]]
    assert 0 < len(audited) < 6  # seed 0 draws some of the six kept rows
    truth = {"r0": "no", "r1": "no", "r2": "yes", "r3": "yes", "r4": "no", "r5": "yes", "r6": "no", "r7": "yes"}
    answers = {"r2": "no", "r4": "no"}  # alice wrong on r2, bob right on r4
    assert monitor.state()["awaiting_labels"] == len(asked)
    monitor.update(labels={key: truth[key] for key in asked}, expert_answers=answers)
    # Horvitz-Thompson: deferred rows weigh 1, audited kept ones 1 / 0.5
    losses = {i: float(outputs[i]["class_label"] != truth[ids[i]]) for i in audited}
    expected = (1.0 + 0.0 + sum(losses.values()) / 0.5) / 8
    state = monitor.state()
    assert state["awaiting_labels"] == 0
    assert state["channels"]["system_error"]["n"] == 8
    assert state["channels"]["system_error"]["mean"] == pytest.approx(expected)
    assert state["tests"] == 2


def test_rows_awaiting_a_label_hold_back_the_labelled_channel():
    monitor = DeferralMonitor(["alice"], audit_rate=0.0)
    out = {"defer": False, "expert": None, "class_label": "a", "class_score": 0.9, "expert_scores": {"alice": 0.5}}
    d = {**out, "defer": True, "expert": "alice"}
    assert monitor.update([out, d, out, out], ids="abcd") == ["b"]  # audit_rate 0: deferred rows only
    assert monitor.state()["channels"]["system_error"]["n"] == 1  # "a"; "b" waits, and the rows after it
    monitor.update(labels={"b": "x"}, expert_answers={"b": "y"})
    assert monitor.state()["channels"]["system_error"]["n"] == 4
    assert monitor.state()["channels"]["system_error"]["mean"] == pytest.approx(1 / 4)


def test_labels_aligned_and_class_ids():
    monitor = DeferralMonitor(["alice"], audit_rate=1.0, id2label={0: "no", 1: "yes"})
    out = {"defer": False, "expert": None, "class_label": "yes", "class_score": 0.9, "expert_scores": {"alice": 0.5}}
    monitor.update([out, out, out], labels=[1, 0, None])
    state = monitor.state()
    assert state["channels"]["system_error"]["n"] == 2 and state["channels"]["system_error"]["mean"] == 0.5
    assert state["awaiting_labels"] == 1


def simulate(rng, n, defer_rate, kept_error, expert_error=0.05):
    """n decisions of a calibrated model: the classifier's stated confidence matches its accuracy."""
    d = rng.random(n) < defer_rate
    outputs, labels, answers = [], [], []
    for i in range(n):
        if d[i]:
            outputs.append({"defer": True, "expert": "alice", "class_label": "a", "class_score": 0.5,
                            "expert_scores": {"alice": 1 - expert_error}})
            labels.append("a")
            answers.append("a" if rng.random() >= expert_error else "b")
        else:
            wrong = rng.random() < kept_error
            outputs.append({"defer": False, "expert": None, "class_label": "a", "class_score": 1 - kept_error,
                            "expert_scores": {"alice": 1 - expert_error}})
            labels.append("b" if wrong else "a")
            answers.append(None)
    return outputs, labels, answers


def test_whole_stream_false_alarm_rate_at_the_targets():
    """Every promise holds exactly at its target (the hardest unshifted stream): any alarm at all is false."""
    confidence, streams = 0.8, 150
    rng = np.random.default_rng(11)
    false = 0
    for s in range(streams):
        monitor = DeferralMonitor(["alice"], confidence=confidence, max_deferral_rate=0.2,
                                  max_error=0.2 * 0.05 + 0.8 * 0.24, audit_rate=0.2, seed=s)
        for _ in range(4):
            outputs, labels, answers = simulate(rng, 500, 0.2, 0.24)
            monitor.update(outputs, labels=labels, expert_answers=answers)
        false += monitor.alarm is not None
    assert false / streams <= binom.ppf(1 - 1e-4, streams, 1 - confidence) / streams


def test_a_shift_raises_the_alarm_with_what_and_since_when():
    rng = np.random.default_rng(2)
    monitor = DeferralMonitor(["alice"], confidence=0.9, max_deferral_rate=0.2, max_error=0.2, audit_rate=0.3)
    for _ in range(6):
        monitor.update(*simulate(rng, 500, 0.15, 0.15)[:1])
    assert monitor.alarm is None
    for _ in range(6):  # the classifier's error doubles, and it knows: the label-free estimate sees it
        monitor.update(*simulate(rng, 500, 0.15, 0.35)[:1])
    alarm = monitor.alarm
    assert alarm is not None and alarm["channel"] == "estimated_error"
    assert 3000 < alarm["raised_at_row"] < 3600 and abs(alarm["since_row"] - 3000) < 200
    assert alarm["evidence"] >= alarm["threshold"] == pytest.approx(1 / (0.1 / 3))  # three tests share 0.1
    assert "estimated_error" in alarm["message"] and "row" in alarm["message"]
    assert monitor.state()["alarms"][0] == alarm


def test_from_a_calibrated_model_and_its_folder(tmp_path):
    model = hf_defer.EncoderForDeferral(hf_defer.DeferralConfig(feature_size=4, num_labels=2, num_experts=2,
                                                                expert_names=["alice", "bob"]))
    held_out = list(np.random.default_rng(0).normal(size=(400, 4)).astype("float32"))
    hf_defer.calibrate_deferral(model, held_out, max_deferral_rate={"alice": 0.1, "bob": 0.2}, confidence=0.8)
    monitor = DeferralMonitor.from_model(model)
    assert monitor.confidence == 0.8 and monitor.tests == 2
    state = monitor.state()
    assert state["channels"]["deferral_rate[alice]"]["target"] == 0.1
    assert state["channels"]["deferral_rate[bob]"]["target"] == 0.2
    assert state["channels"]["deferral_rate"]["target"] is None
    assert state["guarantee"]["threshold"] == model.config.defer_threshold
    model.save_pretrained(tmp_path / "m")
    again = DeferralMonitor.from_model(str(tmp_path / "m"), confidence=0.95)
    assert again.confidence == 0.95 and again.alpha == pytest.approx(0.025)
    pipe = hf_defer.DeferralPipeline(model=model)
    monitor.update(pipe(held_out[:20]))
    assert monitor.rows == 20


def test_mistakes_are_named():
    model = hf_defer.EncoderForDeferral(hf_defer.DeferralConfig(feature_size=4, num_labels=2))
    with pytest.raises(ValueError, match="no deferral guarantee"):
        DeferralMonitor.from_model(model)
    with pytest.raises(ValueError, match="audit_rate"):
        DeferralMonitor(["alice"], audit_rate=1.5)
    with pytest.raises(ValueError, match=r"not among the experts \['alice'\]"):
        DeferralMonitor(["alice"], max_deferral_rate={"carol": 0.1})
    monitor = DeferralMonitor(["alice"])
    with pytest.raises(ValueError, match="output 0 is not a deferral pipeline's output"):
        monitor.update([{"label": "yes"}])
    with pytest.raises(ValueError, match="audit_rate"):
        monitor.update([kept()], labels=["yes"])
    audited = DeferralMonitor(["alice"], audit_rate=0)
    audited.update([deferred("alice")], ids=["x"])
    with pytest.raises(ValueError, match="row 'x' was deferred to 'alice'.*expert's answer is missing"):
        audited.update(labels={"x": "yes"})


def test_cost_channel_and_labels_not_asked_for():
    monitor = DeferralMonitor(["alice", "bob"], max_mean_cost=0.5, expert_costs=[2.0, 1.0], audit_rate=0.0)
    monitor.update([deferred("alice"), deferred("bob"), kept(), kept()], ids="abcd")
    cost = monitor.state()["channels"]["mean_cost"]
    assert cost["mean"] == pytest.approx((2.0 + 1.0) / 4) and cost["target"] == 0.5
    assert cost["upper"] <= 2.0 and cost["lower"] <= 0.75 <= cost["upper"]
    monitor.update(labels={"c": "yes", "zzz": "no"})  # "c" was kept and not audited; "zzz" was never seen
    assert monitor.state()["labels_ignored"] == 2


def test_recalibration_isotonic_values_by_hand():
    monitor = DeferralMonitor(["alice", "bob"])
    rows = [kept(0.6), kept(0.7), kept(0.8), kept(0.9), deferred("alice", alice=0.5), deferred("alice", alice=0.6),
            deferred("alice", alice=0.7), deferred("alice", alice=0.9), deferred("bob", bob=0.7)]
    labels = ["yes", "no", "yes", "yes", "yes", "yes", "yes", "yes", "yes"]  # the classifier answers "yes" on kept rows
    answers = [None, None, None, None, "no", "yes", "no", "yes", "yes"]  # alice: wrong, right, wrong, right
    monitor.recalibrate(rows, labels, expert_answers=answers, min_rows=4, level=None)
    # classifier on the kept rows (score, right): (0.6,1) (0.7,0) (0.8,1) (0.9,1): 1 then 0 break the order and are
    # pooled to 1/2 at 0.6 and 0.7; 1 at 0.8 and 0.9. Alice on the rows deferred to her: (0.5,0) (0.6,1) (0.7,0)
    # (0.9,1): 0, then 1/2 at 0.6 and 0.7, then 1. Bob: one row, fewer than min_rows: raw
    assert monitor.recalibration == {"fitted_on_rows": {"classifier": 4, "expert:alice": 4}, "raw": ["expert:bob"],
                                     "level": None, "tests": {}}
    got = monitor.estimated_errors([kept(0.65), kept(0.75), kept(0.95), kept(0.3), deferred("alice", alice=0.8),
                                    deferred("alice", alice=0.55), deferred("bob", bob=0.7)])
    # between the fitted points linearly, beyond them the end values
    np.testing.assert_allclose(got, [0.5, 1 - 0.75, 0.0, 0.5, 1 - 0.75, 1 - 0.25, 0.3])
    monitor.update([kept(0.75)])
    assert monitor.state()["channels"]["estimated_error"]["mean"] == pytest.approx(0.25)
    with pytest.raises(ValueError, match="before its first update"):
        monitor.recalibrate(rows, labels)


def miscalibrated(rng, n):
    """Rows whose classifier is right with chance score^3 (overconfident) and whose expert alice is right with chance
    her score - 0.3; half are deferred to her. Returns the outputs, labels, her answers and each row's true chance."""
    score, alice, defer = rng.uniform(0.5, 1, n), rng.uniform(0.6, 1, n), rng.random(n) < 0.5
    right_class, right_alice = rng.random(n) < score ** 3, rng.random(n) < alice - 0.3
    outputs = [{"defer": bool(d), "expert": "alice" if d else None, "class_label": "yes", "class_score": float(s),
                "expert_scores": {"alice": float(a)}} for d, s, a in zip(defer, score, alice)]
    labels = ["yes" if r else "no" for r in right_class]
    answers = [(label if r else ("no" if label == "yes" else "yes")) if d else None
               for label, r, d in zip(labels, right_alice, defer)]
    return outputs, labels, answers, np.where(defer, alice - 0.3, score ** 3)


def test_recalibrated_estimate_is_closer_to_the_truth_on_miscalibrated_scores():
    rng = np.random.default_rng(0)
    reference = miscalibrated(rng, 4000)
    outputs, _, _, chance = miscalibrated(rng, 5000)
    truth = 1 - chance.mean()  # the expected error of these rows, from the chances that drew them
    raw = DeferralMonitor(["alice"])
    raw.update(outputs)
    fixed = DeferralMonitor(["alice"]).recalibrate(reference[0], reference[1], expert_answers=reference[2])
    fixed.update(outputs)
    raw_error = abs(raw.state()["channels"]["estimated_error"]["mean"] - truth)
    fixed_error = abs(fixed.state()["channels"]["estimated_error"]["mean"] - truth)
    assert raw_error > 0.2  # 1 - E[score] against 1 - E[score^3], 1 - E[a] against 1 - E[a - 0.3]
    assert fixed_error < 0.02 and fixed_error < raw_error / 10
    # row by row too: the recalibrated chances are near the true ones
    assert np.abs((1 - fixed.estimated_errors(outputs)) - chance).mean() < 0.05


def grouped(groups):
    """Kept rows: for each (score, rows, right) that many rows at that class score, the first `right` of them right."""
    outputs, labels = [], []
    for score, rows, right in groups:
        outputs += [kept(score, label="yes") for _ in range(rows)]
        labels += ["yes"] * right + ["no"] * (rows - right)
    return outputs, labels


def test_exactly_calibrated_estimates_stay_raw():
    # 30 of 50 right at 0.6, 40 of 50 at 0.8: the logistic fit through two scores meets the shares, which are the
    # scores: a = 0, b = 1, no likelihood gained
    outputs, labels = grouped([(0.6, 50, 30), (0.8, 50, 40)])
    monitor = DeferralMonitor(["alice", "bob"]).recalibrate(outputs, labels)
    assert monitor.recalibration["fitted_on_rows"] == {} and monitor.recalibration["raw"] == ["classifier"]
    test = monitor.recalibration["tests"]["classifier"]
    assert test["statistic"] == pytest.approx(0.0, abs=1e-8) and test["p_value"] == pytest.approx(1.0)
    assert (test["intercept"], test["slope"]) == (pytest.approx(0.0, abs=1e-6), pytest.approx(1.0))
    np.testing.assert_allclose(monitor.estimated_errors([kept(0.6), kept(0.7)]), [0.4, 0.3])


def test_strongly_miscalibrated_estimates_get_a_map():
    # 105 of 150 right at 0.9, 120 of 150 at 0.95; the fit meets the shares 0.7 and 0.8, so the likelihood ratio is
    # 2 (105 log(0.7/0.9) + 45 log(0.3/0.1) + 120 log(0.8/0.95) + 30 log(0.2/0.05)) = 88.03, far beyond chi2(2)
    outputs, labels = grouped([(0.9, 150, 105), (0.95, 150, 120)])
    monitor = DeferralMonitor(["alice", "bob"]).recalibrate(outputs, labels)
    test = monitor.recalibration["tests"]["classifier"]
    by_hand = 2 * (105 * np.log(0.7 / 0.9) + 45 * np.log(0.3 / 0.1) + 120 * np.log(0.8 / 0.95) + 30 * np.log(4))
    assert test["statistic"] == pytest.approx(by_hand, rel=1e-6) and test["df"] == 2
    assert test["p_value"] == pytest.approx(np.exp(-by_hand / 2), rel=1e-6)  # chi2(2)'s tail is exp(-x / 2)
    assert monitor.recalibration["fitted_on_rows"] == {"classifier": 300}
    np.testing.assert_allclose(monitor.estimated_errors([kept(0.9), kept(0.95)]), [0.3, 0.2])


def test_a_tiny_noisy_reference_stays_raw():
    # 6 of 10 right at 0.7: one score, the intercept alone: 2 (6 log(0.6/0.7) + 4 log(0.4/0.3)) = 0.4516, p = 0.50
    outputs, labels = grouped([(0.7, 10, 6)])
    monitor = DeferralMonitor(["alice", "bob"]).recalibrate(outputs, labels)
    test = monitor.recalibration["tests"]["classifier"]
    by_hand = 2 * (6 * np.log(0.6 / 0.7) + 4 * np.log(0.4 / 0.3))
    assert test["df"] == 1 and test["statistic"] == pytest.approx(by_hand, rel=1e-9)
    assert test["p_value"] == pytest.approx(chi2.sf(by_hand, 1)) and 0.49 < test["p_value"] < 0.51
    assert monitor.recalibration["fitted_on_rows"] == {}
    assert monitor.estimated_errors([kept(0.7)]).tolist() == pytest.approx([0.3])
    untested = DeferralMonitor(["alice", "bob"]).recalibrate(outputs, labels, level=None)  # the map would say 0.4
    assert untested.estimated_errors([kept(0.7)]).tolist() == pytest.approx([0.4])
    with pytest.raises(ValueError, match="level must be a test level in"):
        DeferralMonitor(["alice"]).recalibrate(outputs, labels, level=1.5)


def test_calibration_test_against_a_brute_force_fit():
    from hf_defer.monitoring.monitor import _calibration_test

    rng = np.random.default_rng(3)
    x = rng.uniform(0.3, 0.99, 200)
    y = (rng.random(200) < x ** 2).astype(float)
    z = np.log(x / (1 - x))

    def loglik(w):
        eta = w[0] + w[1] * z
        return np.sum(y * eta - np.logaddexp(0, eta))

    best = minimize(lambda w: -loglik(w), [0.0, 1.0], method="Nelder-Mead",
                    options={"xatol": 1e-10, "fatol": 1e-12, "maxiter": 10_000})
    test = _calibration_test(x, y)
    assert test["statistic"] == pytest.approx(2 * (-best.fun - loglik([0.0, 1.0])), rel=1e-6)
    assert (test["intercept"], test["slope"]) == (pytest.approx(best.x[0], abs=1e-4), pytest.approx(best.x[1], abs=1e-4))
    assert test["p_value"] == pytest.approx(chi2.sf(test["statistic"], 2))
    with pytest.raises(ValueError, match="as many 0/1 outcomes as estimates"):
        _calibration_test([0.5, 0.6], [1, 2])
    runner = doctest.DocTestRunner()  # its docstring's example, which the public-name doctests do not reach
    for example in doctest.DocTestFinder().find(_calibration_test):
        runner.run(example)
    assert runner.summarize(verbose=False) == (0, 4)


def test_calibrated_estimates_get_a_map_about_level_of_the_time():
    # 400 reference sets of 200 calibrated rows: the test rejects each with chance about 0.05 (the large-sample law);
    # a binomial(400, 0.05) count lies in [9, 33] with probability > 0.999. Overconfident rows (right with chance
    # score^3) are caught on every set.
    from hf_defer.monitoring.monitor import _calibration_test

    rng = np.random.default_rng(4)
    rejected = caught = 0
    for _ in range(400):
        x = rng.uniform(0.5, 1, 200)
        rejected += _calibration_test(x, rng.random(200) < x)["p_value"] < 0.05
        caught += _calibration_test(x, rng.random(200) < x ** 3)["p_value"] < 0.05
    assert binom.ppf(0.0005, 400, 0.05) <= rejected <= binom.ppf(0.9995, 400, 0.05)
    assert caught == 400


def test_from_model_with_a_reference(tmp_path):
    config = hf_defer.DeferralConfig(feature_size=4, num_labels=2, expert_names=["alice"])
    config.deferral_guarantee = {"threshold": 0.0, "n": 1000, "confidence": 0.9,
                                 "claims": [{"kind": "deferral_rate", "target": 0.2}]}
    rng = np.random.default_rng(1)
    outputs, labels, answers, _ = miscalibrated(rng, 500)
    monitor = DeferralMonitor.from_model(config, reference={"outputs": outputs, "labels": labels,
                                                            "expert_answers": answers}, horizon=1000)
    deferred_rows = sum(out["defer"] for out in outputs)
    assert monitor.recalibration["fitted_on_rows"] == {"classifier": 500 - deferred_rows, "expert:alice": deferred_rows}
    assert monitor.channels["deferral_rate"].detector.horizon == 1000
    same = DeferralMonitor.from_model(config, reference=(outputs, labels, answers))
    np.testing.assert_allclose(same.estimated_errors(outputs), monitor.estimated_errors(outputs))
    with pytest.raises(ValueError, match="reference must hold outputs, labels"):
        DeferralMonitor.from_model(config, reference={"outputs": outputs})
    import datasets

    table = datasets.Dataset.from_list([{**out, "labels": label, "expert_answers": answer}
                                        for out, label, answer in zip(outputs, labels, answers)])
    from_table = DeferralMonitor.from_model(config, reference=table)
    assert from_table.recalibration == monitor.recalibration
    np.testing.assert_allclose(from_table.estimated_errors(outputs), monitor.estimated_errors(outputs))
    with pytest.raises(ValueError, match=r"a `labels` column \(and `expert_answers`\), got columns \['defer', 'expert'"):
        DeferralMonitor.from_model(config, reference=table.remove_columns(["labels"]))
    with pytest.raises(ValueError, match="or a datasets.Dataset of outputs"):
        DeferralMonitor.from_model(config, reference="reference.csv")
    with pytest.raises(ValueError, match="500 outputs, 499 labels"):
        DeferralMonitor.from_model(config, reference=(outputs, labels[:-1]))
    with pytest.raises(ValueError, match="horizon must be a positive whole number"):
        DeferralMonitor(["alice"], horizon=-5)


def test_recalibration_of_a_route_only_model_by_hand():
    def routed(accuracy):
        return {"defer": True, "expert": "alice", "estimated_accuracy": accuracy}

    monitor = DeferralMonitor(["alice"])
    # (estimated accuracy, right): (0.9,0) (0.8,1) (0.7,1) (0.6,0): sorted 0, 1, 1, 0 -> 0, then 1, 1, 0 pooled to 2/3
    monitor.recalibrate([routed(0.9), routed(0.8), routed(0.7), routed(0.6)], [0, 1, 1, 0], min_rows=4, level=None)
    assert monitor.recalibration == {"fitted_on_rows": {"route": 4}, "raw": [], "level": None, "tests": {}}
    np.testing.assert_allclose(monitor.estimated_errors([routed(0.65), routed(0.85)]), [1 - 1 / 3, 1 - 2 / 3])
    with pytest.raises(ValueError, match=r"labels\[1\] must be 1 \(the chosen expert was right\) or 0"):
        DeferralMonitor(["alice"]).recalibrate([routed(0.9), routed(0.8)], [1, "yes"])
