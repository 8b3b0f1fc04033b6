"""Gradient accumulation with a short last batch: 4 + 4 + 2 rows accumulated in one optimizer step give the gradient of
one batch of 10 (the mean loss over the 10 rows), not the mean of three batch means, which weights the 2 rows of the
last batch double. Checked against the gradient of the surrogate's mean loss over all rows, computed by hand."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from datasets import Dataset
from transformers import TrainerCallback, TrainingArguments

from hf_defer import DataCollatorForDeferral, DeferralConfig, DeferralTrainer, EncoderForDeferral

D, K, M, N = 4, 3, 2, 10


class GradientsBeforeTheStep(TrainerCallback):
    """Copies every gradient just before the optimizer step (after accumulation; no clipping with max_grad_norm=0)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model, self.steps = model, []

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.steps.append({name: p.grad.detach().clone() for name, p in self.model.named_parameters()
                           if p.grad is not None})


def rows(labels: list[int]) -> Dataset:
    rng = np.random.default_rng(0)
    return Dataset.from_dict({"features": rng.normal(size=(N, D)).astype("float32"), "labels": labels,
                              "expert_labels": rng.integers(0, K, (N, M)).tolist()})


def fresh_model() -> EncoderForDeferral:
    torch.manual_seed(0)
    return EncoderForDeferral(DeferralConfig(feature_size=D, num_labels=K, num_experts=M, head_hidden_sizes=[8]))


def by_hand(model: EncoderForDeferral, data: Dataset) -> tuple[dict[str, torch.Tensor], float]:
    """The gradient and value of the mean surrogate loss over every counted row of `data`, in one forward pass."""
    model = copy.deepcopy(model).train()
    features = torch.tensor(np.asarray(data["features"]))
    labels, experts = torch.tensor(data["labels"]), torch.tensor(data["expert_labels"])
    per_row = model.surrogate(model(features=features).logits, labels, experts, reduction="none")
    counted = (labels != -100).sum()
    loss = per_row.sum() / counted  # the mean over counted rows, worked out here, not by the reduction under test
    loss.backward()
    return {name: p.grad for name, p in model.named_parameters()}, float(loss.detach())


def one_step(tmp_path, data: Dataset, batch_size: int, accumulation: int, default_collator: bool):
    model = fresh_model()
    expected, expected_loss = by_hand(model, data)
    gradients = GradientsBeforeTheStep(model)
    args = TrainingArguments(str(tmp_path), per_device_train_batch_size=batch_size,
                             gradient_accumulation_steps=accumulation, num_train_epochs=1, max_grad_norm=0.0,
                             learning_rate=1e-3, logging_steps=1, report_to=[], use_cpu=True, save_strategy="no",
                             disable_tqdm=True, seed=0)
    collator = {} if default_collator else {"data_collator": DataCollatorForDeferral()}  # not the head-only fast path
    trainer = DeferralTrainer(model=model, args=args, train_dataset=data, callbacks=[gradients], **collator)
    trainer.train()
    assert len(gradients.steps) == 1  # 3 batches (4, 4, 2) and 3 accumulation steps: one optimizer step
    logged = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    return expected, expected_loss, gradients.steps[0], logged


@pytest.mark.parametrize("default_collator", [True, False], ids=["head-only-fast-path", "collator"])
@pytest.mark.parametrize("labels", [
    [0, 1, 2, 0, 1, 2, 0, 1, 2, 1],
    [0, -100, 2, 0, 1, 2, 0, 1, 2, -100],  # ignored rows count in no batch's share
], ids=["all-counted", "two-ignored"])
def test_four_four_two_accumulated_equals_one_batch_of_ten(tmp_path, labels, default_collator):
    data = rows(labels)
    expected, expected_loss, accumulated, logged = one_step(tmp_path / "ga", data, 4, 3, default_collator)
    assert set(accumulated) == set(expected)
    for name, gradient in expected.items():
        torch.testing.assert_close(accumulated[name], gradient, rtol=1e-5, atol=1e-7, msg=name)
    # The logged loss of the step is the mean loss over its 10 rows (the Trainer rounds logs to 4 digits at most).
    assert logged[0] == pytest.approx(expected_loss, abs=1e-4)
    # And the same step without accumulation, one batch of 10, agrees.
    _, _, whole, _ = one_step(tmp_path / "whole", data, N, 1, default_collator)
    for name, gradient in expected.items():
        torch.testing.assert_close(whole[name], gradient, rtol=1e-5, atol=1e-7, msg=name)


def test_evaluation_loss_stays_the_mean(tmp_path):
    # compute_loss outside training (prediction_step) gets the count of one batch: the loss stays that batch's mean.
    data = rows([0, 1, 2, 0, 1, 2, 0, 1, 2, 1])
    model = fresh_model()
    _, expected_loss = by_hand(model.eval(), data)
    args = TrainingArguments(str(tmp_path), per_device_eval_batch_size=4, report_to=[], use_cpu=True,
                             disable_tqdm=True)
    trainer = DeferralTrainer(model=model, args=args, eval_dataset=data)
    assert trainer.evaluate()["eval_loss"] == pytest.approx(expected_loss, rel=1e-5)
