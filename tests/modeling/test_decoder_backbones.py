"""Decoder-only backbones (Llama, Qwen2, Gemma): `last` pooling, the default pooling, padding tokens, gradient
checkpointing and bf16 training. Tiny random configs, no Hub."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    BartConfig,
    BertConfig,
    GemmaConfig,
    LlamaConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
    T5Config,
    TrainingArguments,
)
from transformers.testing_utils import CaptureLogger
from transformers.utils import logging

from hf_defer import DeferralConfig, DeferralTrainer, EncoderForDeferral
from hf_defer.modeling.configuration_deferral import is_decoder_only, resolve_pooling
from hf_defer.training.tokenization import ensure_pad_token

WORDS = ["<unk>", "</s>", *"the a cat dog sat on mat is good bad very not".split()]
DECODERS = {"llama": LlamaConfig, "qwen2": Qwen2Config, "gemma": GemmaConfig}


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def decoder_config(kind: str = "llama", **kwargs):
    sizes = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                 intermediate_size=37, vocab_size=len(WORDS), eos_token_id=1)
    return DECODERS[kind](**{**sizes, **kwargs})


def decoder_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer with an end-of-sequence token and, like Llama's, no padding token."""
    backend = Tokenizer(models.WordLevel({word: i for i, word in enumerate(WORDS)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="</s>")


def decoder_model(kind: str = "llama", seed: int = 0, **config_kwargs) -> EncoderForDeferral:
    torch.manual_seed(seed)
    config = DeferralConfig(encoder=decoder_config(kind), num_labels=3, **config_kwargs)
    return EncoderForDeferral(config).eval()


def text_dataset(tokenizer, n: int = 32, seed: int = 0) -> Dataset:
    rng = np.random.default_rng(seed)
    texts = [" ".join(rng.choice(WORDS[2:], size=rng.integers(1, 7))) for _ in range(n)]
    data = Dataset.from_dict({"text": texts, "labels": rng.integers(0, 3, n), "expert_labels": rng.integers(0, 3, n)})
    return data.map(lambda batch: tokenizer(batch["text"]), batched=True, remove_columns=["text"])


SENTENCES = ["the cat sat on the mat", "a dog", "very very good", "not bad"]


def padded(tokenizer, side: str) -> dict[str, torch.Tensor]:
    tokenizer = ensure_pad_token(tokenizer)
    tokenizer.padding_side = side
    return tokenizer(SENTENCES, padding=True, return_tensors="pt")


@pytest.mark.parametrize("kind", sorted(DECODERS))
def test_last_pooling_reads_the_last_real_token_under_left_and_right_padding(kind):
    model = decoder_model(kind)
    assert model.config.pooling == "last"  # the default for decoder-only backbones
    tokenizer = decoder_tokenizer()
    right, left = padded(tokenizer, "right"), padded(tokenizer, "left")
    assert (right["attention_mask"] == 0).any() and not torch.equal(right["input_ids"], left["input_ids"])
    weight, bias = model.head[-1].weight, model.head[-1].bias
    with torch.no_grad():
        logits_right = model(**right).logits
        logits_left = model(**left).logits
        # Independently: each sentence alone, unpadded, through the bare encoder; its last hidden state; the head.
        expected = torch.stack([
            model.encoder(input_ids=torch.tensor([tokenizer(s)["input_ids"]])).last_hidden_state[0, -1] @ weight.T
            + bias for s in SENTENCES])
        # What sits under the padding does not matter: the mask says where the text ends.
        garbage = right["input_ids"].masked_fill(right["attention_mask"] == 0, 7)
        logits_garbage = model(input_ids=garbage, attention_mask=right["attention_mask"]).logits
    torch.testing.assert_close(logits_right, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits_left, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits_garbage, logits_right, atol=1e-6, rtol=1e-6)


def test_last_pooling_depends_on_every_earlier_token_and_not_on_later_padding():
    model = decoder_model("qwen2")
    ids = torch.tensor([[3, 4, 5, 6]])
    with torch.no_grad():
        base = model(input_ids=ids).logits
        changed_first = model(input_ids=torch.tensor([[9, 4, 5, 6]])).logits
    assert (changed_first - base).abs().max() > 1e-4  # causal attention carries token 1 to the last token


def test_last_pooling_without_attention_mask_uses_the_pad_token_id():
    tokenizer = decoder_tokenizer()
    batch = padded(tokenizer, "right")
    model = decoder_model("llama")
    with torch.no_grad():
        with_mask = model(**batch).logits
        model.config.encoder.pad_token_id = tokenizer.pad_token_id
        without_mask = model(input_ids=batch["input_ids"]).logits
    torch.testing.assert_close(without_mask, with_mask, atol=1e-5, rtol=1e-5)


def test_default_pooling_follows_the_backbone_and_cls_is_refused_on_causal_models():
    bert = BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37)
    assert DeferralConfig(encoder=bert, num_labels=2).pooling == "cls"
    assert DeferralConfig(feature_size=4, num_labels=2).pooling == "cls"
    assert DeferralConfig(encoder=decoder_config("gemma"), num_labels=2, pooling="mean").pooling == "mean"
    assert is_decoder_only(BertConfig(is_decoder=True)) and not is_decoder_only(bert)
    assert is_decoder_only({"model_type": "my-llm", "architectures": ["MyLLMForCausalLM"]})
    assert resolve_pooling({"model_type": "qwen2"}, None) == "last"
    for kind in DECODERS:
        with pytest.raises(ValueError, match="pooling='cls'.*decoder-only.*first token sees no other token"):
            DeferralConfig(encoder=decoder_config(kind), num_labels=2, pooling="cls")
    with pytest.raises(ValueError, match="pooling must be one of"):
        DeferralConfig(encoder=decoder_config(), num_labels=2, pooling="first")


@pytest.mark.parametrize("encoder", [T5Config(d_model=32, num_layers=1, num_heads=2, d_ff=37),
                                     BartConfig(d_model=32, encoder_layers=1, decoder_layers=1),
                                     {"model_type": "t5", "is_encoder_decoder": True}], ids=["t5", "bart", "dict"])
def test_encoder_decoder_configs_are_refused_when_the_config_is_built(encoder):
    with pytest.raises(ValueError, match="encoder-decoder"):
        DeferralConfig(encoder=encoder, num_labels=2)


def test_ensure_pad_token_pads_with_eos_warns_and_sets_the_encoder_pad_token_id():
    tokenizer, model = decoder_tokenizer(), decoder_model()
    assert tokenizer.pad_token is None and model.config.encoder.pad_token_id is None
    logger = logging.get_logger("hf_defer.training.tokenization")
    with CaptureLogger(logger) as captured:
        ensure_pad_token(tokenizer, model)
    assert "no padding token" in captured.out and "'</s>'" in captured.out
    assert tokenizer.pad_token == "</s>" and model.config.encoder.pad_token_id == tokenizer.eos_token_id == 1
    with CaptureLogger(logger) as captured:  # nothing to do the second time
        ensure_pad_token(tokenizer, model)
    assert captured.out == ""
    bare = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"a": 0}, unk_token="a")))
    with pytest.raises(ValueError, match="no padding token and no end-of-sequence token"):
        ensure_pad_token(bare)


def test_trainer_gives_a_tokenizer_without_pad_token_one(tmp_path):
    tokenizer, model = decoder_tokenizer(), decoder_model()
    data = text_dataset(tokenizer, 8)
    args = TrainingArguments(str(tmp_path), max_steps=1, per_device_train_batch_size=8, report_to=[], use_cpu=True,
                             save_strategy="no", disable_tqdm=True)
    trainer = DeferralTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer)
    assert tokenizer.pad_token == "</s>" and model.config.encoder.pad_token_id == 1
    assert math.isfinite(trainer.train().training_loss)


@pytest.mark.filterwarnings("ignore:`gradient_checkpointing_enable` is deprecated:FutureWarning")
@pytest.mark.parametrize("enable", ["activation_checkpointing_enable", "gradient_checkpointing_enable"])
def test_gradient_checkpointing_gives_the_same_gradients(enable):
    model = decoder_model("llama").train()
    batch = {**padded(decoder_tokenizer(), "left"), "labels": torch.tensor([0, 1, 2, 1]),
             "expert_labels": torch.tensor([0, 1, 1, 2])}
    model(**batch).loss.backward()
    plain = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    getattr(model, enable)()  # transformers 5.23 renamed gradient checkpointing to activation checkpointing
    assert model.is_activation_checkpointing and model.encoder.layers[0].gradient_checkpointing
    model(**batch).loss.backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, plain[name], atol=1e-6, rtol=1e-5, msg=name)


@pytest.mark.parametrize("load_dtype", [torch.float32, torch.bfloat16], ids=["fp32-weights", "bf16-weights"])
def test_bf16_training_keeps_the_head_in_float32_and_the_loss_finite(tmp_path, load_dtype):
    tokenizer = decoder_tokenizer()
    decoder_model("qwen2").save_pretrained(tmp_path / "base")
    model = EncoderForDeferral.from_pretrained(tmp_path / "base", dtype=load_dtype)
    assert {p.dtype for p in model.head.parameters()} == {torch.float32}
    head_before = model.head[-1].weight.detach().clone()
    args = TrainingArguments(str(tmp_path / "out"), bf16=True, use_cpu=True, max_steps=3, learning_rate=1e-2,
                             per_device_train_batch_size=8, activation_checkpointing=True, report_to=[],
                             save_strategy="no", disable_tqdm=True, logging_steps=1)
    trainer = DeferralTrainer(model=model, args=args, train_dataset=text_dataset(tokenizer, 24),
                              eval_dataset=text_dataset(tokenizer, 8, seed=1), processing_class=tokenizer)
    trainer.train()
    assert model.is_activation_checkpointing  # TrainingArguments(activation_checkpointing=True) turned it on
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 3 and all(math.isfinite(loss) for loss in losses)
    assert math.isfinite(trainer.evaluate()["eval_loss"])
    assert {p.dtype for p in model.head.parameters()} == {torch.float32}
    assert {p.dtype for p in model.encoder.parameters()} == {load_dtype}
    assert not torch.equal(model.head[-1].weight, head_before)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        batch = padded(tokenizer, "right")
        out = model(**batch, labels=torch.tensor([0, 1, 2, 0]), expert_labels=torch.tensor([0, 1, 1, 0]))
    assert out.loss.dtype == torch.float32 and torch.isfinite(out.loss)


def test_from_encoder_pretrained_on_a_decoder_pools_the_last_token_with_a_float32_head(tmp_path):
    from transformers import AutoModel

    AutoModel.from_config(decoder_config("llama")).save_pretrained(tmp_path)
    model = EncoderForDeferral.from_encoder_pretrained(str(tmp_path), num_labels=3, dtype=torch.bfloat16)
    assert model.config.pooling == "last"
    assert {p.dtype for p in model.encoder.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in model.head.parameters()} == {torch.float32}
    with pytest.raises(ValueError, match="pooling='cls'"):
        EncoderForDeferral.from_encoder_pretrained(str(tmp_path), num_labels=3, pooling="cls")
