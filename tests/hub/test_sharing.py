"""Hub sharing: library mode, remote-code mode without hf_defer, and an offline DeferralTrainer.push_to_hub."""

from __future__ import annotations

import ast
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from datasets import Dataset
from huggingface_hub import HfApi, ModelCard
from huggingface_hub.hf_api import RepoUrl
from huggingface_hub.utils import filter_repo_objects
from safetensors.torch import load_file
from transformers import AutoTokenizer, BertConfig, BertTokenizer, TrainingArguments, pipeline

import hf_defer
from hf_defer import DeferralConfig, DeferralTrainer, EncoderForDeferral
from hf_defer.hub import push_to_hub, save_for_hub
from without_hf_defer import BLOCK_HF_DEFER
from hf_defer.modeling.pipeline_deferral import REMOTE_TASK

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"the a cat dog sat on mat is good bad very".split()]
TEXTS = ["the cat sat on the mat", "a very bad dog", "good"]
CODE_FILES = {"configuration_deferral.py", "modeling_deferral.py", "saving_deferral.py", "surrogates.py", "surrogate_base.py",
              "surrogate_routing.py", "side_features.py", "pipeline_deferral.py", "validators.py", "library_mode.py",
              "guarantee_record.py", "device.py", "availability.py",
              "guarantee_warnings.py", "cascade_folder.py"}
PACKAGE = Path(hf_defer.__file__).parent / "modeling"  # the code a saved folder carries


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def text_model() -> tuple[EncoderForDeferral, BertTokenizer]:
    torch.manual_seed(0)
    encoder = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37,
                         vocab_size=len(WORDS))
    config = DeferralConfig(encoder=encoder, num_labels=3, num_experts=2, pooling="mean",
                            id2label={0: "hate", 1: "offensive", 2: "neither"}, expert_names=["alice", "bob"])
    model = EncoderForDeferral(config).eval()
    with torch.no_grad():  # make some inputs defer
        model.head[-1].bias[3:] += 0.4
    return model, BertTokenizer(vocab={word: i for i, word in enumerate(WORDS)})


@pytest.fixture
def saved(tmp_path) -> tuple[Path, EncoderForDeferral, BertTokenizer]:
    model, tokenizer = text_model()
    folder = tmp_path / "model"
    save_for_hub(model, folder, tokenizer)
    return folder, model, tokenizer


def test_save_for_hub_writes_safetensors_code_and_remote_code_config(saved):
    folder, model, _ = saved
    files = set(os.listdir(folder))
    assert {"model.safetensors", "config.json", "tokenizer_config.json"} <= files
    assert {f for f in files if f.endswith(".py")} == CODE_FILES  # remote code is these modules, not the package
    assert not [f for f in files if f.endswith((".bin", ".pt", ".pth", ".pkl", ".ckpt"))]
    config = json.loads((folder / "config.json").read_text())
    assert config["auto_map"] == {"AutoConfig": "configuration_deferral.DeferralConfig",
                                  "AutoModel": "modeling_deferral.EncoderForDeferral"}
    assert config["custom_pipelines"][REMOTE_TASK]["impl"] == "pipeline_deferral.DeferralPipeline"
    assert config["custom_pipelines"][REMOTE_TASK]["pt"] == ["AutoModel"]
    for name in CODE_FILES:
        assert (folder / name).read_bytes() == (PACKAGE / name).read_bytes()
    # The pipeline module must not need hf_defer: remote code only has the copied siblings.
    tree = ast.parse((folder / "pipeline_deferral.py").read_text())
    imported = {n.module if isinstance(n, ast.ImportFrom) else a.name for n in ast.walk(tree)
                if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names
                if not (isinstance(n, ast.ImportFrom) and n.level == 1 and f"{n.module}.py" in CODE_FILES)}
    assert not [name for name in imported if name is None or name.split(".")[0] not in
                {*sys.stdlib_module_names, "numpy", "torch", "transformers"}], imported
    assert "custom_pipelines" not in model.config.to_dict()  # the in-memory config is left as it was
    weights = load_file(folder / "model.safetensors")
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(weights[name], tensor)


def test_pipeline_save_pretrained_writes_the_same_remote_code_folder(saved, tmp_path):
    folder, model, tokenizer = saved
    pipeline("deferral", model=model, tokenizer=tokenizer).save_pretrained(tmp_path / "from_pipeline")
    # save_for_hub adds the deferral card (from the config when no card data is given); the rest is the same
    assert set(os.listdir(tmp_path / "from_pipeline")) == set(os.listdir(folder)) - {"README.md"}
    written = json.loads((tmp_path / "from_pipeline" / "config.json").read_text())
    expected = json.loads((folder / "config.json").read_text())
    assert written["custom_pipelines"] == expected["custom_pipelines"] and written["auto_map"] == expected["auto_map"]
    assert "custom_pipelines" not in model.config.to_dict()


def test_save_for_hub_does_not_overwrite_without_asking(saved):
    folder, model, tokenizer = saved
    files = {name: (folder / name).read_bytes() for name in os.listdir(folder)}
    # The same model again: every file is byte-identical, nothing would be lost (the docstring's "files with the same
    # content excepted"), so the save goes through and leaves the folder as it was.
    assert sorted(save_for_hub(model, folder, tokenizer)) == sorted(files)
    assert {name: (folder / name).read_bytes() for name in os.listdir(folder)} == files
    with torch.no_grad():
        model.head[-1].bias += 1.0  # another model: its weights would replace the saved ones
    with pytest.raises(FileExistsError, match=r"overwrite=True") as refusal:
        save_for_hub(model, folder, tokenizer)
    assert "model.safetensors" in str(refusal.value) and "tokenizer_config.json" not in str(refusal.value)
    assert {name: (folder / name).read_bytes() for name in os.listdir(folder)} == files
    save_for_hub(model, folder, tokenizer, overwrite=True)
    assert (folder / "model.safetensors").read_bytes() != files["model.safetensors"]
    with pytest.raises(ValueError, match="deferral model"):
        save_for_hub(torch.nn.Linear(2, 2), folder / "other")


def library_outputs(folder: Path) -> list[dict]:
    return pipeline("deferral", model=str(folder))(TEXTS, expert_costs=[0.0, 0.1])


def test_library_mode_loads_the_folder_without_unpickling(saved, monkeypatch):
    folder, model, tokenizer = saved

    def forbidden(*args, **kwargs):
        raise AssertionError("loading must not unpickle")

    monkeypatch.setattr(torch, "load", forbidden)
    monkeypatch.setattr(pickle, "load", forbidden)
    monkeypatch.setattr(pickle, "loads", forbidden)
    outputs = library_outputs(folder)
    in_memory = pipeline("deferral", model=model, tokenizer=tokenizer)(TEXTS, expert_costs=[0.0, 0.1])
    assert [o["label"] for o in outputs] == [o["label"] for o in in_memory]
    for got, want in zip(outputs, in_memory):
        assert got["expert_accuracy"] == pytest.approx(want["expert_accuracy"], abs=1e-6)
        assert got["scores"] == pytest.approx(want["scores"], abs=1e-6)
    assert {o["label"] for o in outputs} <= {"hate", "offensive", "neither", "defer"}


REMOTE = BLOCK_HF_DEFER + r"""
import torch
from transformers import AutoModel, AutoTokenizer, pipeline

folder, texts = sys.argv[1], json.loads(sys.argv[2])
result = {}
for key, call in (("pipeline_untrusted", lambda: pipeline(model=folder)),
                  ("task_untrusted", lambda: pipeline("deferral", model=folder)),
                  ("model_untrusted", lambda: AutoModel.from_pretrained(folder, trust_remote_code=False))):
    try:
        call()
        result[key] = "loaded"
    except Exception as error:
        result[key] = f"{type(error).__name__}: {error}"
classify = pipeline(model=folder, trust_remote_code=True)
result["pipeline_class"] = type(classify).__module__ + "." + type(classify).__name__
result["pipeline"] = classify(texts, expert_costs=[0.0, 0.1])
try:  # the task name of the library, as the card shows (folders saved before 2026-11-26 lack it)
    by_task = pipeline("deferral", model=folder, trust_remote_code=True)
    result["task_pipeline_class"] = type(by_task).__module__ + "." + type(by_task).__name__
    result["task_pipeline"] = by_task(texts, expert_costs=[0.0, 0.1])
except KeyError as error:
    result["task_pipeline_class"] = f"KeyError: {error}"
model = AutoModel.from_pretrained(folder, trust_remote_code=True).eval()
tokenizer = AutoTokenizer.from_pretrained(folder)
with torch.no_grad():
    result["logits"] = model(**tokenizer(texts[0], return_tensors="pt")).logits[0].tolist()
result["model_class"] = type(model).__module__
try:
    model.push_to_hub("someone/remote")  # must fail before any Hub call: the deferral push needs hf_defer
    result["push"] = "pushed"
except ImportError as error:
    result["push"] = str(error)
result["hf_defer_modules"] = sorted(name for name in sys.modules if name.startswith("hf_defer"))
print("RESULT" + json.dumps(result))
"""


# Remote-code mode is a promise of every saved folder, so it runs in the default suite (10-20 s: a fresh interpreter).
def test_remote_code_mode_without_hf_defer_matches_library_mode(saved, tmp_path):
    folder, model, tokenizer = saved
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path / "modules"), TOKENIZERS_PARALLELISM="false")
    run = subprocess.run([sys.executable, "-c", REMOTE, str(folder), json.dumps(TEXTS)], cwd=tmp_path, env=env,
                         stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    remote = json.loads(run.stdout.split("RESULT", 1)[1])

    assert remote["hf_defer_modules"] == []
    assert remote["pipeline_class"].startswith("transformers_modules.")
    assert remote["model_class"].startswith("transformers_modules.")
    assert "needs hf_defer" in remote["push"], remote["push"]
    assert remote["task_pipeline_class"].startswith("transformers_modules.")
    assert remote["task_pipeline_class"].endswith(".pipeline_deferral.DeferralPipeline")
    assert remote["task_pipeline"] == remote["pipeline"]
    for key in ("pipeline_untrusted", "task_untrusted", "model_untrusted"):
        assert remote[key].startswith("ValueError") and "trust_remote_code=True" in remote[key], remote[key]

    with torch.no_grad():
        logits = model(**tokenizer(TEXTS[0], return_tensors="pt")).logits[0]
    np.testing.assert_allclose(remote["logits"], logits.numpy(), atol=1e-5)
    library = library_outputs(folder)
    assert [o["label"] for o in remote["pipeline"]] == [o["label"] for o in library]
    for got, want in zip(remote["pipeline"], library):
        assert got["expert"] == want["expert"] and got["class_label"] == want["class_label"]
        assert got["class_score"] == pytest.approx(want["class_score"], abs=1e-6)
        assert got["expert_accuracy"] == pytest.approx(want["expert_accuracy"], abs=1e-6)


@pytest.fixture
def fake_hub(monkeypatch) -> dict[str, dict[str, bytes]]:
    """HfApi without a network: create_repo answers, upload_folder adds the files it would upload to the repo's."""
    uploads: dict[str, dict[str, bytes]] = {}

    def create_repo(self, repo_id, **kwargs):  # like the Hub, put a bare name under the token's user
        return RepoUrl(f"https://huggingface.co/{repo_id if '/' in repo_id else 'someone/' + repo_id}")

    def upload_folder(self, *, repo_id, folder_path, ignore_patterns=None, allow_patterns=None, **kwargs):
        names = [str(p.relative_to(folder_path)) for p in Path(folder_path).rglob("*") if p.is_file()]
        kept = filter_repo_objects(names, allow_patterns=allow_patterns, ignore_patterns=ignore_patterns)
        uploads[repo_id] = uploads.get(repo_id, {}) | {name: (Path(folder_path) / name).read_bytes() for name in kept}
        return f"https://huggingface.co/{repo_id}/commit/0"

    def file_exists(self, repo_id, filename, **kwargs):
        return filename in uploads.get(repo_id, {})

    def no_network(self, *args, **kwargs):
        raise AssertionError("unexpected Hub call")

    monkeypatch.setattr(HfApi, "create_repo", create_repo)
    monkeypatch.setattr(HfApi, "upload_folder", upload_folder)
    monkeypatch.setattr(HfApi, "file_exists", file_exists)
    for name in ("create_commit", "upload_file", "model_info", "whoami"):
        monkeypatch.setattr(HfApi, name, no_network)
    return uploads


def test_push_to_hub_helper_uploads_model_code_tokenizer_and_card(fake_hub):
    model, tokenizer = text_model()
    push_to_hub(model, "someone/helper-defer", tokenizer)
    files = fake_hub["someone/helper-defer"]
    assert set(files) == CODE_FILES | {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                                       "README.md"}
    card = ModelCard(files["README.md"].decode())
    assert "`alice`" in card.text and 'pipeline("deferral", model="someone/helper-defer")' in card.text
    assert card.data.eval_results is None  # no metrics were given
    with pytest.raises(TypeError, match="repo_id"):
        push_to_hub(model, None)


def test_model_and_pipeline_push_to_hub_upload_the_deferral_card_and_remote_code(fake_hub):
    model, tokenizer = text_model()
    model.push_to_hub("someone/model-push")
    files = fake_hub["someone/model-push"]
    assert set(files) == CODE_FILES | {"config.json", "model.safetensors", "README.md"}
    assert REMOTE_TASK in json.loads(files["config.json"])["custom_pipelines"]
    assert 'pipeline("deferral", model="someone/model-push")' in files["README.md"].decode()
    assert "has been pushed on the Hub" not in files["README.md"].decode()  # not transformers' generic card

    pipeline("deferral", model=model, tokenizer=tokenizer).push_to_hub("someone/pipe-push", commit_message="v1")
    assert set(fake_hub["someone/pipe-push"]) == set(files) | {"tokenizer.json", "tokenizer_config.json"}

    # As with transformers, a card already in the repository is kept unless card data is given.
    fake_hub["someone/model-push"]["README.md"] = b"# written on the Hub\n"
    model.push_to_hub("someone/model-push")
    assert fake_hub["someone/model-push"]["README.md"] == b"# written on the Hub\n"
    model.push_to_hub("someone/model-push", card_data=hf_defer.hub.DeferralModelCardData.from_model(model))
    assert b"learning-to-defer" in fake_hub["someone/model-push"]["README.md"]
    with pytest.raises(TypeError, match="max_shard_size"):
        model.push_to_hub("someone/model-push", max_shard_size="1GB")


def test_save_pretrained_with_push_to_hub_uploads_the_deferral_card_and_keeps_the_folder_free_of_a_generic_one(
        fake_hub, tmp_path):
    model, _ = text_model()
    model.save_pretrained(tmp_path / "defer-folder", push_to_hub=True, commit_message="first")
    assert "README.md" not in os.listdir(tmp_path / "defer-folder")
    uploaded = fake_hub["someone/defer-folder"]
    assert set(uploaded) == CODE_FILES | {"config.json", "model.safetensors", "README.md"}
    assert b"learning-to-defer" in uploaded["README.md"]
    model.save_pretrained(tmp_path / "other", push_to_hub=True, repo_id="someone/named")
    assert "someone/named" in fake_hub


def test_trainer_push_to_hub_uploads_a_complete_deferral_repo(tmp_path, fake_hub):
    model, tokenizer = text_model()
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(WORDS[5:], size=rng.integers(2, 7))) for _ in range(24)]
    data = Dataset.from_dict({"text": texts, "labels": rng.integers(0, 3, 24),
                              "expert_labels": rng.integers(0, 3, (24, 2))})
    data = data.map(lambda batch: tokenizer(batch["text"]), batched=True, remove_columns=["text"])

    uploads = fake_hub
    args = TrainingArguments(str(tmp_path / "out"), hub_model_id="someone/tiny-defer", report_to=[], use_cpu=True,
                             max_steps=2, per_device_train_batch_size=8, save_strategy="no", disable_tqdm=True)
    trainer = DeferralTrainer(model=model, args=args, train_dataset=data, eval_dataset=data,
                              processing_class=tokenizer)
    trainer.train()
    metrics = trainer.evaluate()
    trainer.push_to_hub(expert_description="Two simulated annotators.", dataset="tiny/synthetic")

    files = uploads["someone/tiny-defer"]
    assert set(files) == CODE_FILES | {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                                       "README.md", "reliability_diagram.png", "training_args.bin"}
    config = json.loads(files["config.json"])
    assert set(config["auto_map"]) == {"AutoConfig", "AutoModel"} and REMOTE_TASK in config["custom_pipelines"]
    for name in CODE_FILES:
        assert files[name] == (PACKAGE / name).read_bytes()
    assert files["reliability_diagram.png"][:8] == b"\x89PNG\r\n\x1a\n"

    out = Path(args.output_dir)
    weights = load_file(out / "model.safetensors")
    for name, tensor in trainer.model.state_dict().items():
        torch.testing.assert_close(weights[name], tensor.cpu())
    assert AutoTokenizer.from_pretrained(out)("the cat")["input_ids"] == tokenizer("the cat")["input_ids"]

    readme = files["README.md"].decode()
    assert "learning-to-defer" in readme and "generated by hf_defer" in readme
    assert "Two simulated annotators." in readme and "This model was trained from scratch" not in readme
    card = ModelCard(readme)
    results = {r.metric_type: r.metric_value for r in card.data.eval_results}
    for key in ("system_error", "coverage", "classifier_error", "expert_ece", "budgeted_error_10"):
        assert results[key] == pytest.approx(metrics[f"eval_{key}"], abs=1e-12)
        assert f"{metrics[f'eval_{key}']:.4f}" in readme
    assert card.data.model_name == "tiny-defer" and 'model="someone/tiny-defer"' in readme
    assert {r.dataset_type for r in card.data.eval_results} == {"tiny/synthetic"}

    # save_model() called by the user writes the same self-contained folder, card included.
    trainer.save_model(str(tmp_path / "saved"))
    saved_files = set(os.listdir(tmp_path / "saved"))
    assert CODE_FILES | {"README.md", "reliability_diagram.png", "model.safetensors"} <= saved_files
    saved_card = ModelCard.load(tmp_path / "saved" / "README.md")
    assert {r.metric_type: r.metric_value for r in saved_card.data.eval_results} == results

    # A README the user wrote is kept, with a warning, not replaced by the card.
    (out / "README.md").write_text("# mine\n")
    trainer.push_to_hub()
    assert uploads["someone/tiny-defer"]["README.md"] == b"# mine\n"


def test_push_to_hub_checks_the_repo_id_with_huggingface_hub_before_any_call(fake_hub):
    model, _ = text_model()
    for bad in ("a/b/c", "bad id", "-starts-with-dash/x"):
        with pytest.raises(ValueError, match="repo_id must be a Hub repository id"):
            push_to_hub(model, bad)
    assert fake_hub == {}


def test_save_for_hub_without_card_data_writes_the_card_of_the_config(tmp_path):
    # Issue 43.8: the Hub guide calls save_for_hub's folder the one "to share"; it had no card without card_data.
    model, tokenizer = text_model()
    model.config.defer_threshold, model.config.expert_costs = 0.125, [0.05, 0.1]
    save_for_hub(model, tmp_path / "to_share", tokenizer)
    card = ModelCard.load(tmp_path / "to_share" / "README.md")
    assert "**Deferral threshold:** 0.125" in card.text and "`alice`" in card.text
    assert card.data.eval_results is None  # no metrics were measured for this config
    assert "# to_share" in card.text  # named after the folder
