"""Tests of DeferralConfig: fields, nesting of the encoder config, serialization and validation."""

import json

import pytest
import torch
from transformers import AutoConfig, BertConfig, ViTConfig

import hf_defer
from hf_defer import DeferralConfig
from hf_defer.modeling import get_surrogate
from hf_defer.modeling.configuration_deferral import SURROGATE_NAMES


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def tiny_bert() -> BertConfig:
    return BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37, vocab_size=99)


def as_dict(config: DeferralConfig) -> dict:
    """`to_dict()` without the load path, which `from_pretrained` records."""
    return {key: value for key, value in config.to_dict().items() if key != "_name_or_path"}


def test_defaults_and_derived_fields():
    config = DeferralConfig(encoder=tiny_bert(), num_labels=3, num_experts=2)
    assert config.model_type == "deferral"
    assert isinstance(config.encoder, BertConfig) and config.encoder.hidden_size == 32
    assert config.feature_size is None
    assert config.num_labels == 3 and config.num_experts == 2
    assert (config.surrogate, config.pooling, config.head_hidden_sizes) == ("asm", "cls", [])
    assert (config.head_dropout, config.freeze_encoder, config.defer_threshold) == (0.0, False, 0.0)
    assert config.expert_names == ["expert_0", "expert_1"]
    assert config.id2label == {0: "LABEL_0", 1: "LABEL_1", 2: "LABEL_2"}
    assert config.label2id == {"LABEL_0": 0, "LABEL_1": 1, "LABEL_2": 2}
    assert config.keys_to_ignore_at_inference == [
        "class_probs", "expert_accuracy", "defer", "hidden_states", "attentions"
    ]


def test_default_num_labels_is_two():
    assert DeferralConfig(feature_size=4).num_labels == 2


def test_id2label_sets_num_labels_and_label2id():
    config = DeferralConfig(feature_size=384, id2label={0: "hate", 1: "offensive", 2: "neither"})
    assert config.num_labels == 3
    assert config.label2id == {"hate": 0, "offensive": 1, "neither": 2}


def test_surrogate_names_in_sync_with_surrogates_module():
    assert SURROGATE_NAMES == hf_defer.modeling.SURROGATES


def test_encoder_given_as_dict_becomes_its_config_class():
    config = DeferralConfig(encoder={"model_type": "vit", "hidden_size": 32, "image_size": 16}, num_labels=2)
    assert isinstance(config.encoder, ViTConfig)
    assert (config.encoder.hidden_size, config.encoder.image_size) == (32, 16)


def test_loaded_encoder_keeps_its_attention_implementation():
    encoder = tiny_bert()
    encoder._attn_implementation = "eager"
    config = DeferralConfig(encoder=encoder, num_labels=2)
    assert config.encoder._attn_implementation == "eager"


def test_save_and_load_round_trip_nested_encoder(tmp_path):
    config = DeferralConfig(
        encoder=tiny_bert(),
        id2label={0: "a", 1: "b", 2: "c"},
        num_experts=2,
        surrogate="sova",
        pooling="mean",
        head_hidden_sizes=(16, 8),
        head_dropout=0.25,
        freeze_encoder=True,
        expert_names=["doctor", "nurse"],
        defer_threshold=0.5,
    )
    config.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == "deferral"
    assert saved["encoder"]["model_type"] == "bert" and saved["encoder"]["hidden_size"] == 32
    assert saved["head_hidden_sizes"] == [16, 8] and saved["expert_names"] == ["doctor", "nurse"]
    assert saved["id2label"] == {"0": "a", "1": "b", "2": "c"}

    for loaded in (DeferralConfig.from_pretrained(tmp_path), AutoConfig.from_pretrained(tmp_path)):
        assert type(loaded) is DeferralConfig
        assert as_dict(loaded) == as_dict(config)
        assert isinstance(loaded.encoder, BertConfig) and loaded.encoder.intermediate_size == 37
        assert loaded.num_labels == 3 and loaded.id2label == {0: "a", 1: "b", 2: "c"}
        assert (loaded.surrogate, loaded.pooling, loaded.head_dropout) == ("sova", "mean", 0.25)
        assert loaded.freeze_encoder is True and loaded.defer_threshold == 0.5


def test_head_only_round_trip_and_from_dict(tmp_path):
    config = DeferralConfig(feature_size=384, num_labels=3, surrogate="aova")
    config.save_pretrained(tmp_path)
    loaded = DeferralConfig.from_pretrained(tmp_path)
    assert loaded.encoder is None and loaded.feature_size == 384
    assert as_dict(loaded) == as_dict(config)
    assert as_dict(DeferralConfig.from_dict(config.to_dict())) == as_dict(config)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"feature_size": 8, "num_labels": 1}, "num_labels"),
        ({"feature_size": 8, "id2label": {0: "only"}}, "num_labels"),
        ({"feature_size": 8, "num_labels": 3, "id2label": {0: "a", 1: "b"}}, "num_labels=3"),
        ({"feature_size": 8, "surrogate": "softmax"}, "surrogate must be one of"),
        ({"feature_size": 8, "pooling": "sum"}, "pooling must be one of"),
        ({"feature_size": 8, "num_experts": 0}, "num_experts"),
        ({"feature_size": 0}, "feature_size"),
        ({"feature_size": 8.0}, "feature_size"),
        ({}, "exactly one of `encoder`"),
        ({"encoder": "bert", "feature_size": None}, "encoder must be"),
        ({"encoder": {"hidden_size": 32}}, "model_type"),
        ({"feature_size": 8, "head_hidden_sizes": [4, 0]}, "head_hidden_sizes"),
        ({"feature_size": 8, "head_dropout": 1.0}, "head_dropout"),
        ({"feature_size": 8, "freeze_encoder": "yes"}, "freeze_encoder"),
        ({"feature_size": 8, "num_experts": 2, "expert_names": ["solo"]}, "expert_names"),
        ({"feature_size": 8, "defer_threshold": float("nan")}, "defer_threshold"),
    ],
)
def test_invalid_arguments_raise_value_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DeferralConfig(**kwargs)


def test_both_encoder_and_feature_size_rejected():
    with pytest.raises(ValueError, match="exactly one of `encoder`"):
        DeferralConfig(encoder=tiny_bert(), feature_size=32)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"expert_costs": [0.1, 0.2]}, "expert_costs must have one cost per expert"),
     ({"expert_costs": [-0.1]}, "non-negative"),
     ({"expert_costs": [float("inf")]}, "expert_costs"),
     ({"num_experts": 2, "expert_costs": (0.0, 0.1)}, None)],
)
def test_expert_costs_are_one_finite_number_per_expert(kwargs, message):
    if message is None:
        assert DeferralConfig(feature_size=8, **kwargs).expert_costs == [0.0, 0.1]
    else:
        with pytest.raises(ValueError, match=message):
            DeferralConfig(feature_size=8, **kwargs)


@pytest.mark.parametrize("costs", ["0.1", 0.1, {"a": 0.1}])
def test_expert_costs_that_are_not_a_sequence_are_a_type_error_as_in_the_decision(costs):
    # one check serves the config and the surrogate's decision: the same error type and message for both
    with pytest.raises(TypeError, match="expert_costs must be a sequence of 1 numbers") as config_error:
        DeferralConfig(feature_size=8, expert_costs=costs)
    with pytest.raises(TypeError) as decision_error:
        get_surrogate("asm", 2).decide(torch.zeros(1, 3), expert_costs=costs)
    assert str(config_error.value) == str(decision_error.value)


def test_each_field_has_one_validator_and_save_runs_them(tmp_path):
    validators = sorted(name for name in vars(DeferralConfig) if name.startswith("validate_"))
    assert validators == ["validate_decision", "validate_deferral_guarantee", "validate_encoder", "validate_expert_kinds", "validate_expert_names",
                          "validate_flags",
                          "validate_head", "validate_num_experts", "validate_num_labels", "validate_pooling",
                          "validate_route_only", "validate_side_features", "validate_surrogate"]
    config = DeferralConfig(feature_size=8)
    config.pooling = "sum"  # set after construction: caught when saving
    with pytest.raises(ValueError, match="pooling must be one of"):
        config.save_pretrained(tmp_path)
    assert not (tmp_path / "config.json").exists()


def test_a_loaded_config_keeps_custom_pipelines_and_library_mode_still_works(tmp_path):
    from transformers import pipeline

    from hf_defer import EncoderForDeferral

    EncoderForDeferral(DeferralConfig(feature_size=4)).save_pretrained(tmp_path)
    loaded = DeferralConfig.from_pretrained(tmp_path)
    assert set(loaded.custom_pipelines) == {hf_defer.modeling.pipeline_deferral.REMOTE_TASK}  # no special case on loading
    assert type(pipeline("deferral", model=str(tmp_path))) is hf_defer.DeferralPipeline


def test_numpy_integer_sizes_are_stored_as_int(tmp_path):
    """np.int64 sizes (e.g. labels.max() + 1) used to be refused as "not an integer"."""
    import numpy as np

    config = DeferralConfig(feature_size=np.int64(8), num_labels=np.int64(3), num_experts=np.int32(2),
                            head_hidden_sizes=[np.int64(4)])
    assert (config.feature_size, config.num_labels, config.num_experts, config.head_hidden_sizes) == (8, 3, 2, [4])
    assert all(type(value) is int for value in (config.feature_size, config.num_labels, config.num_experts))
    config.save_pretrained(tmp_path)  # JSON holds them
    assert DeferralConfig.from_pretrained(tmp_path).num_experts == 2
    with pytest.raises(ValueError, match="feature_size"):
        DeferralConfig(feature_size=np.float64(8.0), num_labels=2)
