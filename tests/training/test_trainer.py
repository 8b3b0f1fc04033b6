"""DeferralTrainer: loss scale, metrics, eval loss, early errors, resuming, text models, two processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from datasets import Dataset
from transformers import BertConfig, BertTokenizer, TrainingArguments

from hf_defer import DeferralConfig, DeferralTrainer, EncoderForDeferral, deferral_metrics
from hf_defer.modeling import get_surrogate

K, D = 3, 6


def make_data(n: int, num_experts: int = 1, seed: int = 0) -> Dataset:
    rng = np.random.default_rng(seed)
    features = rng.normal(size=(n, D)).astype("float32")
    labels = rng.integers(0, K, n)
    experts = rng.integers(0, K, (n, num_experts)) if num_experts > 1 else rng.integers(0, K, n)
    return Dataset.from_dict({"features": features, "labels": labels, "expert_labels": experts})


def head_model(num_experts: int = 1, surrogate: str = "asm", seed: int = 0) -> EncoderForDeferral:
    torch.manual_seed(seed)
    return EncoderForDeferral(DeferralConfig(feature_size=D, num_labels=K, num_experts=num_experts, surrogate=surrogate))


def args(tmp_path: Path, **overrides) -> TrainingArguments:
    defaults = dict(
        output_dir=str(tmp_path / "out"), report_to=[], use_cpu=True, learning_rate=0.5, optim="sgd",
        lr_scheduler_type="constant", weight_decay=0.0, save_strategy="no", logging_strategy="no",
        disable_tqdm=True, seed=0, dataloader_num_workers=0,
    )
    defaults.update(overrides)
    return TrainingArguments(**defaults)


def test_gradient_accumulation_matches_one_full_batch_and_the_hand_computed_step(tmp_path):
    data = make_data(16)
    start = head_model()
    w0, b0 = (p.detach().clone() for p in start.parameters())

    # Hand-computed SGD step on the mean A-SM loss over all 16 rows.
    features = torch.tensor(np.asarray(data["features"], dtype=np.float32))
    w, b = w0.clone().requires_grad_(), b0.clone().requires_grad_()
    loss = get_surrogate("asm", K)(features @ w.T + b, torch.tensor(data["labels"]), torch.tensor(data["expert_labels"]))
    loss.backward()
    expected = (w0 - 0.5 * w.grad, b0 - 0.5 * b.grad)

    finals = []
    for batch, steps in ((16, 1), (8, 2), (4, 4)):
        model = head_model()
        trainer = DeferralTrainer(
            model=model, train_dataset=data,
            args=args(tmp_path, per_device_train_batch_size=batch, gradient_accumulation_steps=steps, max_steps=1),
        )
        trainer.train()
        finals.append(tuple(p.detach() for p in model.parameters()))
    for weight, bias in finals:
        torch.testing.assert_close(weight, expected[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(bias, expected[1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("num_experts", [1, 2])
def test_evaluate_reports_deferral_metrics_and_exact_eval_loss(tmp_path, num_experts):
    data = make_data(10, num_experts=num_experts, seed=1)
    model = head_model(num_experts, surrogate="ssm")
    # eval batch of 4 over 10 rows: the last batch is short, so a mean of batch means would be off.
    trainer = DeferralTrainer(model=model, eval_dataset=data, args=args(tmp_path, per_device_eval_batch_size=4))
    metrics = trainer.evaluate()

    with torch.no_grad():
        logits = model(features=torch.tensor(np.asarray(data["features"], dtype=np.float32))).logits
    labels, experts = np.asarray(data["labels"]), np.asarray(data["expert_labels"])
    # eval_loss: mean of the per-example S-SM loss, -log p_y - sum_j c_j log p_{K+j}, in float64.
    log_p = torch.log_softmax(logits.double(), dim=1).numpy()
    correct = (experts.reshape(10, num_experts) == labels[:, None]).astype(float)
    per_example = -log_p[np.arange(10), labels] - (correct * log_p[:, K:]).sum(axis=1)
    assert metrics["eval_loss"] == pytest.approx(per_example.mean(), rel=1e-5)

    expected = deferral_metrics(logits.numpy(), labels, experts, surrogate="ssm", num_experts=num_experts)
    for key, value in expected.items():
        assert metrics[f"eval_{key}"] == pytest.approx(value), key
    if num_experts == 2:
        assert {"eval_expert_ece_0", "eval_expert_ece_1", "eval_deferral_rate_0", "eval_deferral_rate_1"} <= set(metrics)


def test_training_reduces_the_loss_and_learns_to_defer_where_the_expert_is_right(tmp_path):
    # Expert perfect when feature 0 > 0, always wrong otherwise; class = argmax of features 1..3.
    rng = np.random.default_rng(3)
    features = rng.normal(size=(400, D)).astype("float32")
    labels = features[:, 1:4].argmax(axis=1)
    experts = np.where(features[:, 0] > 0, labels, (labels + 1) % K)
    data = Dataset.from_dict({"features": features, "labels": labels, "expert_labels": experts})
    model = head_model()
    trainer = DeferralTrainer(model=model, train_dataset=data, eval_dataset=data,
                              args=args(tmp_path, num_train_epochs=20, per_device_train_batch_size=32))
    before = trainer.evaluate()["eval_loss"]
    trainer.train()
    after = trainer.evaluate()
    assert after["eval_loss"] < 0.7 * before
    assert after["eval_system_error"] < 0.1


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        ({"features": [[0.0] * D], "labels": [0]}, "expert_labels"),
        ({"features": [[0.0] * D], "labels": [3], "expert_labels": [0]}, "labels"),
        ({"features": [[0.0] * D], "labels": [0], "expert_labels": [[0, 1]]}, "expert_labels"),
        ({"features": [[0.0] * D], "labels": [0], "expert_labels": [5]}, "expert_labels"),
    ],
)
def test_bad_datasets_fail_at_construction(tmp_path, columns, message):
    with pytest.raises(ValueError, match=message):
        DeferralTrainer(model=head_model(), train_dataset=Dataset.from_dict(columns), args=args(tmp_path))


def test_datasets_given_positionally_are_checked_too(tmp_path):
    data = Dataset.from_dict({"features": [[0.0] * D], "labels": [0]})
    with pytest.raises(ValueError, match="train_dataset must have a 'expert_labels' column"):
        DeferralTrainer(head_model(), args(tmp_path), None, data)


def test_expert_width_must_match_num_experts(tmp_path):
    data = make_data(4, num_experts=2)
    with pytest.raises(ValueError, match="num_experts=3"):
        DeferralTrainer(model=head_model(num_experts=3), eval_dataset=data, args=args(tmp_path))


def test_rejects_a_model_that_is_not_a_deferral_model(tmp_path):
    with pytest.raises(ValueError, match="deferral model"):
        DeferralTrainer(model=torch.nn.Linear(2, 2), args=args(tmp_path))


def test_resuming_from_a_checkpoint_ends_with_the_uninterrupted_weights(tmp_path):
    data = make_data(48, seed=4)
    common = dict(per_device_train_batch_size=8, max_steps=6, learning_rate=0.3, lr_scheduler_type="linear",
                  optim="sgd", optim_args="momentum=0.9")
    full = head_model(seed=5)
    DeferralTrainer(model=full, train_dataset=data, args=args(tmp_path / "a", **common)).train()

    first = head_model(seed=5)
    DeferralTrainer(model=first, train_dataset=data,
                    args=args(tmp_path / "b", save_strategy="steps", save_steps=3, **common)).train()
    resumed = head_model(seed=6)  # different init: everything must come from the checkpoint
    checkpoint = tmp_path / "b" / "out" / "checkpoint-3"
    assert checkpoint.is_dir()
    DeferralTrainer(model=resumed, train_dataset=data, args=args(tmp_path / "b", **common)).train(
        resume_from_checkpoint=str(checkpoint)
    )
    for a, b in zip(full.parameters(), resumed.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
    assert not torch.allclose(next(full.parameters()), next(head_model(seed=5).parameters()))


def test_text_model_with_processing_class_pads_and_trains(tmp_path):
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "good", "bad", "tweet", "very", "not"]
    tokenizer = BertTokenizer(vocab={token: i for i, token in enumerate(vocab)})
    encoder = BertConfig(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=20)
    torch.manual_seed(0)
    model = EncoderForDeferral(DeferralConfig(encoder=encoder.to_dict(), num_labels=K, pooling="mean"))
    texts = ["good tweet", "very bad tweet", "not good", "bad", "very very good tweet", "tweet"]
    data = Dataset.from_dict({"text": texts, "labels": [0, 1, 2, 1, 0, 2], "expert_labels": [0, 1, 1, 1, 0, 0]})
    data = data.map(lambda batch: tokenizer(batch["text"]), batched=True)
    assert tokenizer.unk_token_id not in sum(data["input_ids"], [])  # the vocabulary really is used
    trainer = DeferralTrainer(model=model, train_dataset=data, eval_dataset=data, processing_class=tokenizer,
                              args=args(tmp_path, per_device_train_batch_size=3, per_device_eval_batch_size=4,
                                        num_train_epochs=1))
    before = [p.detach().clone() for p in model.parameters()]
    trainer.train()
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    metrics = trainer.evaluate()
    assert 0.0 <= metrics["eval_system_error"] <= 1.0 and 0.0 <= metrics["eval_coverage"] <= 1.0


DISTRIBUTED_SCRIPT = r"""
import json, sys
import numpy as np, torch, torch.distributed as dist
from datasets import Dataset
from transformers import TrainingArguments
from hf_defer import DeferralConfig, DeferralTrainer, EncoderForDeferral

out = sys.argv[1]
rng = np.random.default_rng(0)
n, d = 37, 6  # odd size: the last batch is short and the sampler must not count a row twice
data = Dataset.from_dict({"features": rng.normal(size=(n, d)).astype("float32"),
                          "labels": rng.integers(0, 3, n), "expert_labels": rng.integers(0, 3, (n, 2))})
torch.manual_seed(0)
model = EncoderForDeferral(DeferralConfig(feature_size=d, num_labels=3, num_experts=2))
args = TrainingArguments(output_dir=out + "/run", use_cpu=True, report_to=[], per_device_train_batch_size=4,
                         per_device_eval_batch_size=5, num_train_epochs=2, save_strategy="no",
                         logging_strategy="no", disable_tqdm=True, ddp_backend="gloo")
trainer = DeferralTrainer(model=model, args=args, train_dataset=data, eval_dataset=data)
trainer.train()
metrics = trainer.evaluate()
world = dist.get_world_size() if dist.is_initialized() else 1
if trainer.is_world_process_zero():
    model.save_pretrained(out + "/model")
    json.dump({"world_size": world, "metrics": metrics}, open(out + "/result.json", "w"))
"""


@pytest.mark.slow  # make test-slow (CI): the quick suite stays under 3 minutes on 2 cores
def test_two_processes_train_and_evaluate_every_example_once(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(DISTRIBUTED_SCRIPT)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(script), str(tmp_path)], env=env, timeout=300, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]  # what the processes said, where a launch fails
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["world_size"] == 2

    # One-process evaluation of the saved weights, computed directly.
    model = EncoderForDeferral.from_pretrained(tmp_path / "model")
    rng = np.random.default_rng(0)
    features = rng.normal(size=(37, 6)).astype("float32")
    labels, experts = rng.integers(0, 3, 37), rng.integers(0, 3, (37, 2))
    with torch.no_grad():
        logits = model(features=torch.tensor(features)).logits
    # DeferralTrainer reports the budgets the saved pipeline delivers (ranking by margin, see DeferralMetrics)
    expected = deferral_metrics(logits.numpy(), labels, experts, num_experts=2, budget_ranking="margin")
    metrics = result["metrics"]
    for key, value in expected.items():
        assert metrics[f"eval_{key}"] == pytest.approx(value, abs=1e-6), key
    loss = get_surrogate("asm", 3, 2)(logits, torch.tensor(labels), torch.tensor(experts))
    assert metrics["eval_loss"] == pytest.approx(loss.item(), rel=1e-5)


def test_head_only_fast_path_gives_the_weights_of_the_collator_path_bit_for_bit(tmp_path, num_experts=1):
    # 300 shuffled steps with momentum and a cosine schedule: any difference in the batches would show
    data = make_data(400, num_experts=num_experts, seed=7)
    data = data.add_column("text", [f"row {i}" for i in range(400)])  # removed by either path
    common = dict(per_device_train_batch_size=8, num_train_epochs=6, learning_rate=0.2, optim="sgd",
                  optim_args="momentum=0.9", lr_scheduler_type="cosine", max_grad_norm=0.0, seed=3)
    results = []
    for fast in (True, False):
        model = head_model(num_experts, seed=1)
        trainer = DeferralTrainer(model=model, train_dataset=data, eval_dataset=data,
                                  args=args(tmp_path / str(fast), **common))
        if not fast:
            trainer.head_only_max_bytes = 0  # too large to hold: the Trainer's own loader and the collator
        assert (trainer._head_only_rows() is not None) is fast
        trainer.train()
        assert trainer.state.global_step == 300
        results.append(([p.detach().clone() for p in model.parameters()], trainer.evaluate()))
    (fast_weights, fast_metrics), (slow_weights, slow_metrics) = results
    assert all(torch.equal(a, b) for a, b in zip(fast_weights, slow_weights))
    assert fast_metrics.keys() == slow_metrics.keys()
    assert all(fast_metrics[k] == slow_metrics[k] for k in fast_metrics if not k.endswith(("_runtime", "per_second")))


@pytest.mark.parametrize("num_experts", [1, 2])
def test_head_only_batches_are_the_collated_rows(tmp_path, num_experts):
    data = make_data(10, num_experts=num_experts, seed=2)
    trainer = DeferralTrainer(model=head_model(num_experts), train_dataset=data, args=args(tmp_path))
    rows = trainer._head_only_rows()
    expected = trainer.data_collator([data[i] for i in (7, 2, 9)])
    batch = rows.__getitems__([7, 2, 9])
    assert batch.keys() == expected.keys()
    for key in batch:
        assert batch[key].dtype == expected[key].dtype and torch.equal(batch[key], expected[key]), key


def test_fast_path_only_where_it_is_exact(tmp_path):
    data = make_data(10)
    custom = DeferralTrainer(model=head_model(), train_dataset=data, args=args(tmp_path),
                             data_collator=lambda rows: rows)
    assert custom._head_only_rows() is None  # the user's collator decides what a batch is
    grouped = DeferralTrainer(model=head_model(), train_dataset=data,
                              args=args(tmp_path, train_sampling_strategy="group_by_length"))
    assert grouped._head_only_rows() is None
    ragged = Dataset.from_dict({"features": [[0.0] * D, [0.0] * (D - 1)], "labels": [0, 1], "expert_labels": [0, 1]})
    with pytest.raises(ValueError, match=r"'features' must have feature_size=.* rows \[1\]"):
        DeferralTrainer(model=head_model(), train_dataset=ragged, args=args(tmp_path))  # caught before any step
    trainer = DeferralTrainer(model=head_model(), train_dataset=data, args=args(tmp_path))
    trainer.train_dataset = ragged  # set after the checks: left to the collator, whose error names the row
    assert trainer._head_only_rows() is None


def test_training_checks_the_data_once_and_skips_per_step_probes(tmp_path, monkeypatch):
    import accelerate.optimizer

    probes = []
    original_probe = accelerate.optimizer.is_lomo_available

    def counted_probe():
        probes.append(1)
        return original_probe()

    monkeypatch.setattr(accelerate.optimizer, "is_lomo_available", counted_probe)
    data = make_data(64)
    model = head_model()
    trainer = DeferralTrainer(model=model, train_dataset=data, args=args(tmp_path, per_device_train_batch_size=8,
                                                                           max_grad_norm=0.0, max_steps=20))
    shape_checks, value_checks, norms = [], [], []
    check_targets, expert_label_tensor = model.surrogate.check_targets, model.surrogate._expert_label_tensor
    monkeypatch.setattr(model.surrogate, "check_targets",
                        lambda *a, **k: value_checks.append(a[4] if len(a) > 4 else k.get("check_values", True))
                        or check_targets(*a, **k))
    monkeypatch.setattr(model.surrogate, "_expert_label_tensor",
                        lambda *a, **k: shape_checks.append(1) or expert_label_tensor(*a, **k))
    monkeypatch.setattr(trainer.accelerator, "clip_grad_norm_", lambda *a, **k: norms.append(1))
    trainer.train()
    # the answers' shape and dtype checked on every batch (on the short path of a batch with every answer, which
    # calls no check_targets), their values never
    assert len(shape_checks) == 20 and not any(value_checks)
    assert norms == []  # max_grad_norm=0 and no logging: no gradient norm to compute
    assert len(probes) == 1  # accelerate's per-step LOMO import probe asked once for the run
    assert accelerate.optimizer.is_lomo_available is counted_probe  # and put back afterwards


def test_resume_true_skips_a_half_written_newest_checkpoint(tmp_path):
    """A run killed inside the optimizer save leaves checkpoint-6 without trainer_state.json (written last); resuming
    used to fail with FileNotFoundError. It now resumes from checkpoint-3, warns naming checkpoint-6, and ends with
    the uninterrupted run's weights."""
    from transformers.testing_utils import CaptureLogger

    from hf_defer.inspection.model_checks import logger

    data = make_data(48, seed=4)
    common = dict(per_device_train_batch_size=8, max_steps=6, learning_rate=0.3, optim="sgd", optim_args="momentum=0.9")
    full = head_model(seed=5)
    DeferralTrainer(model=full, train_dataset=data, args=args(tmp_path / "a", **common)).train()

    killed = head_model(seed=5)
    DeferralTrainer(model=killed, train_dataset=data,
                    args=args(tmp_path / "b", save_strategy="steps", save_steps=3, **common)).train()
    newest = tmp_path / "b" / "out" / "checkpoint-6"
    (newest / "trainer_state.json").unlink()
    optimizer = newest / "optimizer.pt"
    optimizer.write_bytes(optimizer.read_bytes()[:20])
    resumed = head_model(seed=6)
    with CaptureLogger(logger) as captured:
        DeferralTrainer(model=resumed, train_dataset=data, args=args(tmp_path / "b", **common)).train(
            resume_from_checkpoint=True)
    assert "checkpoint-6" in captured.out and "incomplete" in captured.out
    for a, b in zip(full.parameters(), resumed.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


def test_float16_trainable_weights_are_warned_about(tmp_path):
    """A float16 checkpoint loads as float16 in transformers 5 (dtype="auto"); AdamW on float16 weights turned a
    MiniLM router's weights NaN on a GPU while the Trainer's logged loss stayed finite. The trainer says so up front,
    and stays quiet for float32 weights and for frozen float16 ones (a LoRA base)."""
    from transformers.testing_utils import CaptureLogger

    from hf_defer.training.trainer import logger

    data = make_data(8)
    half = head_model()
    half.head.half()
    with CaptureLogger(logger) as captured:
        DeferralTrainer(model=half, train_dataset=data, args=args(tmp_path / "a"))
    assert "2 trainable parameters are float16" in captured.out and "dtype=torch.float32" in captured.out
    torch.manual_seed(0)
    frozen = EncoderForDeferral(DeferralConfig(feature_size=D, num_labels=K, num_experts=1, head_hidden_sizes=[4]))
    frozen.head[0].half().requires_grad_(False)  # a frozen float16 part (as a LoRA base) is not trained: no warning
    for model, name in ((head_model(), "b"), (frozen, "c")):
        with CaptureLogger(logger) as captured:
            DeferralTrainer(model=model, train_dataset=data, args=args(tmp_path / name))
        assert "float16" not in captured.out
