"""LoRA adapters on deferral models, both ways: `peft.get_peft_model` and transformers' `add_adapter`. Each trains,
evaluates, checkpoints, resumes, saves (adapter + head only), loads three ways, merges and pushes with the same
logits."""

from __future__ import annotations

import importlib.metadata
import json
import os
from pathlib import Path

import pytest
import torch
import transformers
from huggingface_hub import ModelCard
from packaging.version import Version
from safetensors.torch import load_file
from transformers import TrainingArguments, pipeline
from transformers.integrations import peft as transformers_peft

import peft  # noqa: F401  (a test dependency, pyproject [test])
from peft import LoraConfig, PeftModel, get_peft_model  # noqa: E402
from test_decoder_backbones import decoder_model, decoder_tokenizer, padded, text_dataset  # noqa: E402
from test_sharing import fake_hub  # noqa: E402, F401  (the patched HfApi fixture)

import hf_defer  # noqa: E402
from hf_defer import AutoModelForDeferral, DeferralTrainer  # noqa: E402
from hf_defer.inspection.adapters import adapter_base_model, check_head_trainable, has_adapters  # noqa: E402

TARGETS = ["q_proj", "v_proj"]


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture
def base(tmp_path) -> str:
    """The deferral model the adapters are added to, saved with its tokenizer (the adapters' base model)."""
    folder = tmp_path / "base"
    decoder_model("llama").save_pretrained(folder)
    tokenizer = decoder_tokenizer()
    tokenizer.pad_token = tokenizer.eos_token
    tokenizer.save_pretrained(folder)
    return str(folder)


PEFT_VERSION = importlib.metadata.version("peft")
# What transformers' add_adapter demands of peft (0.20 for transformers 5.23, 0.22 for 5.24, which no peft release
# meets yet): on an older peft, hf_defer refuses add_adapter up front (test_add_adapter_on_a_too_old_peft_...).
ADD_ADAPTER_PEFT = getattr(transformers_peft, "MIN_PEFT_VERSION", "0")
ADD_ADAPTER_WORKS = Version(PEFT_VERSION) >= Version(ADD_ADAPTER_PEFT)
# Where this transformers refuses the installed peft, the add_adapter way is not collected (the refusal test covers that
# stack), so the suite skips nothing on any stack.
WAYS = ["peft", "transformers"] if ADD_ADAPTER_WORKS else ["peft"]


def with_lora(base: str, way: str, **lora_kwargs):
    model = AutoModelForDeferral.from_pretrained(base)
    config = LoraConfig(**{"r": 4, "lora_alpha": 8, "target_modules": TARGETS, "modules_to_save": ["head"],
                           **lora_kwargs})
    if way == "peft":
        return get_peft_model(model, config)
    add_adapter(model, config)
    return model


def add_adapter(model, config) -> None:
    """`model.add_adapter(config)`; only collected (WAYS) where this transformers accepts the installed peft."""
    assert ADD_ADAPTER_WORKS, f"transformers {transformers.__version__} refuses peft {PEFT_VERSION} for add_adapter"
    model.add_adapter(config)


def trainer_for(model, output_dir: Path, **kwargs) -> DeferralTrainer:
    tokenizer = decoder_tokenizer()
    defaults = dict(max_steps=4, save_steps=2, per_device_train_batch_size=8, learning_rate=5e-3, report_to=[],
                    use_cpu=True, disable_tqdm=True, seed=0)
    args = TrainingArguments(str(output_dir), **{**defaults, **kwargs})
    return DeferralTrainer(model=model, args=args, train_dataset=text_dataset(tokenizer, 32),
                           eval_dataset=text_dataset(tokenizer, 16, seed=1), processing_class=tokenizer)


def logits(model) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(**padded(decoder_tokenizer(), "left")).logits


def trainable(model) -> set[str]:
    return {name for name, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("way", WAYS)
def test_adapter_trains_checkpoints_resumes_saves_loads_and_merges(base, tmp_path, way):
    model = with_lora(base, way)
    assert has_adapters(model) and adapter_base_model(model) == base
    names = trainable(model)
    assert names and all("lora_" in name or ".head." in f".{name}" for name in names), names
    assert any("head" in name for name in names) and not any("embed" in name for name in names)
    frozen_before = {name: p.detach().clone() for name, p in model.named_parameters() if not p.requires_grad}

    trainer = trainer_for(model, tmp_path / "out")
    trainer.train()
    metrics = trainer.evaluate()
    assert 0 <= metrics["eval_system_error"] <= 1
    for name, p in model.named_parameters():  # the base model's weights did not move
        if name in frozen_before:
            assert torch.equal(p, frozen_before[name]), name
    trained = logits(model)
    assert not torch.allclose(trained, logits(AutoModelForDeferral.from_pretrained(base)))

    # Checkpoints and the final folder hold the adapter and the head in peft's format, not the base model.
    final = tmp_path / "final"
    trainer.save_model(str(final))
    for folder in (tmp_path / "out" / "checkpoint-2", final):
        files = set(os.listdir(folder))
        assert {"adapter_config.json", "adapter_model.safetensors"} <= files, files
        assert not files & {"model.safetensors", "config.json"}, files
    saved = load_file(final / "adapter_model.safetensors")
    assert all("lora_" in key or ".head." in key for key in saved) and any(".head." in key for key in saved)
    assert sum(t.numel() for t in saved.values()) == sum(p.numel() for n, p in model.named_parameters()
                                                         if p.requires_grad)
    assert json.loads((final / "adapter_config.json").read_text())["base_model_name_or_path"] == base
    card = (final / "README.md").read_text()
    # the deferral card, naming the base model by its folder (issue 21: no local path in a card)
    assert "learning-to-defer" in card and f"`{os.path.basename(base)}` (a local folder" in card and base not in card

    # Loading, three ways, gives the logits of the trained model.
    from_auto = AutoModelForDeferral.from_pretrained(final)
    assert has_adapters(from_auto)
    torch.testing.assert_close(logits(from_auto), trained, atol=1e-6, rtol=1e-6)
    pipe = pipeline("deferral", model=str(final))
    torch.testing.assert_close(logits(pipe.model), trained, atol=1e-6, rtol=1e-6)
    assert pipe("the cat sat")["label"] in {"defer", *pipe.model.config.id2label.values()}
    from_peft = PeftModel.from_pretrained(AutoModelForDeferral.from_pretrained(base), final)
    torch.testing.assert_close(logits(from_peft), trained, atol=1e-6, rtol=1e-6)

    # Merging gives a plain deferral model that saves and loads like any other.
    merged = from_peft.merge_and_unload()
    assert type(merged).__name__ == "EncoderForDeferral" and not has_adapters(merged)
    torch.testing.assert_close(logits(merged), trained, atol=1e-5, rtol=1e-5)
    merged.save_pretrained(tmp_path / "merged")
    assert "model.safetensors" in os.listdir(tmp_path / "merged")
    torch.testing.assert_close(logits(AutoModelForDeferral.from_pretrained(tmp_path / "merged")), trained,
                               atol=1e-5, rtol=1e-5)

    # Resuming from the step-2 checkpoint ends where the uninterrupted run ended.
    resumed = with_lora(base, way)
    trainer_for(resumed, tmp_path / "out").train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2"))
    torch.testing.assert_close(logits(resumed), trained, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("way", WAYS)
def test_trainer_push_to_hub_uploads_adapter_head_and_deferral_card(base, tmp_path, fake_hub, way):  # noqa: F811
    model = with_lora(base, way)
    trainer = trainer_for(model, tmp_path / "out", hub_model_id=f"someone/lora-{way}", save_strategy="no",
                          max_steps=2)
    trainer.train()
    trainer.evaluate()
    trainer.push_to_hub()
    files = fake_hub[f"someone/lora-{way}"]
    assert {"adapter_config.json", "adapter_model.safetensors", "README.md", "tokenizer.json"} <= set(files)
    assert "model.safetensors" not in files
    card = ModelCard(files["README.md"].decode())
    assert "learning-to-defer" in card.data.tags and card.data.eval_results
    assert f"`{os.path.basename(base)}` (a local folder" in card.text and base not in card.text  # no local path
    download = tmp_path / "download"
    download.mkdir()
    for name, content in files.items():
        (download / name).write_bytes(content)
    torch.testing.assert_close(logits(AutoModelForDeferral.from_pretrained(download)), logits(model),
                               atol=1e-6, rtol=1e-6)

    # hf_defer.push_to_hub (what model.push_to_hub of a deferral model calls) uploads the adapter and the deferral card,
    # and, as for any model, keeps a card that the repository already has.
    hf_defer.push_to_hub(model, f"someone/helper-{way}")
    files = fake_hub[f"someone/helper-{way}"]
    assert {"adapter_config.json", "adapter_model.safetensors", "README.md"} <= set(files)
    assert not {"config.json", "model.safetensors"} & set(files)  # (add_adapter models also copy their .py modules)
    readme = files["README.md"].decode()
    assert f"`{os.path.basename(base)}` (a local folder" in readme and base not in readme  # no local path (issue 21)
    assert b"learning-to-defer" in files["README.md"]
    files["README.md"] = b"# written on the Hub\n"
    hf_defer.push_to_hub(model, f"someone/helper-{way}")
    assert fake_hub[f"someone/helper-{way}"]["README.md"] == b"# written on the Hub\n"


@pytest.mark.parametrize("way", WAYS)
def test_lora_with_activation_checkpointing_trains_the_adapter(base, tmp_path, way):
    model = with_lora(base, way)
    before = {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}
    trainer = trainer_for(model, tmp_path / "out", activation_checkpointing=True, save_strategy="no", max_steps=2)
    trainer.train()
    assert (model.get_base_model() if way == "peft" else model).is_activation_checkpointing
    moved = {name for name, p in model.named_parameters() if name in before and not torch.equal(p, before[name])}
    assert any("lora_B" in name for name in moved) and any("head" in name for name in moved)


@pytest.mark.parametrize("way", WAYS)
def test_a_frozen_head_is_refused_with_the_fix(base, tmp_path, way):
    model = with_lora(base, way, modules_to_save=None)
    with pytest.raises(ValueError, match=r"modules_to_save=\['head'\]"):
        check_head_trainable(model)
    with pytest.raises(ValueError, match="head of this adapter model is frozen"):
        trainer_for(model, tmp_path / "out")


@pytest.mark.parametrize("way", WAYS)
def test_an_adapter_on_a_base_built_in_memory_is_refused_at_save_with_the_fix(tmp_path, fake_hub, way, caplog):  # noqa: F811
    # The base model has no folder (built from a config, as from_encoder_pretrained builds one): peft would write
    # base_model_name_or_path = None, and the folder would fail to load. Training works (with a warning); saving, the
    # trainer's push and hf_defer's save and push are refused, naming the fix; checkpoints (to resume) are written.
    model = decoder_model("llama")
    config = LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, modules_to_save=["head"])
    if way == "peft":
        model = get_peft_model(model, config)
    else:
        add_adapter(model, config)
    assert adapter_base_model(model) is None
    trainer = trainer_for(model, tmp_path / "out", max_steps=2, save_steps=2)
    assert "base_model_name_or_path is None" in caplog.text
    trainer.train()
    assert (tmp_path / "out" / "checkpoint-2" / "adapter_model.safetensors").is_file()
    fix = r"Save the base model first.*AutoModelForDeferral.from_pretrained\('base'\)"
    with pytest.raises(ValueError, match=fix):
        trainer.save_model(str(tmp_path / "final"))
    assert not (tmp_path / "final").exists()
    with pytest.raises(ValueError, match="could never be loaded again"):
        trainer.push_to_hub()
    with pytest.raises(ValueError, match="could never be loaded again"):
        hf_defer.save_for_hub(model, tmp_path / "helper")
    with pytest.raises(ValueError, match="could never be loaded again"):
        hf_defer.push_to_hub(model, "someone/dead-adapter")
    assert "someone/dead-adapter" not in fake_hub
    with pytest.raises(ValueError, match="could never be loaded again"):
        trainer_for(model, tmp_path / "push", push_to_hub=True, hub_model_id="someone/x")
    if way == "peft":  # the fix the message gives for a trained model: merged, it saves and loads whole
        merged = model.merge_and_unload()
        merged.save_pretrained(tmp_path / "merged")
        torch.testing.assert_close(logits(AutoModelForDeferral.from_pretrained(tmp_path / "merged")), logits(merged))


def test_add_adapter_on_a_too_old_peft_is_refused_naming_both_versions_and_get_peft_model(base, monkeypatch):
    """transformers 5.24's add_adapter demands peft >= 0.22, which is not released: the refusal names the installed
    versions and the way that works with both. Where the installed peft is new enough, transformers is made to ask
    for a newer one, exactly as 5.24 does (its add_adapter reads the same constant)."""
    needed = ADD_ADAPTER_PEFT
    if ADD_ADAPTER_WORKS:
        needed = f"{Version(PEFT_VERSION).major + 1}.0.0"
        monkeypatch.setattr(transformers_peft, "MIN_PEFT_VERSION", needed)
    model = AutoModelForDeferral.from_pretrained(base)
    config = LoraConfig(r=4, target_modules=TARGETS, modules_to_save=["head"])
    with pytest.raises(ValueError) as refused:
        model.add_adapter(config)
    message = str(refused.value)
    for part in (f"peft >= {needed}", f"transformers {transformers.__version__}", f"peft {PEFT_VERSION} is installed",
                 "peft.get_peft_model(model, config)"):
        assert part in message, (part, message)
    assert not has_adapters(model)  # nothing was injected
    # The alternative it names works on the same model.
    wrapped = get_peft_model(model, config)
    assert has_adapters(wrapped) and adapter_base_model(wrapped) == base
    check_head_trainable(wrapped)
    assert any("lora_A" in name for name in trainable(wrapped)) and any("head" in name for name in trainable(wrapped))
