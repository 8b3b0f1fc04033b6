"""One save: every folder written by `model.save_pretrained`, `trainer.save_model` or `pipe.save_pretrained` loads in
library mode and in remote-code mode (with and without hf_defer imported), with identical decisions; and saving
never loses a file it did not write (issue 11, item 1)."""

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
from transformers import BertTokenizer, TrainingArguments, pipeline

import hf_defer
from hf_defer import DeferralConfig, DeferralTrainer, EncoderForDeferral, save_for_hub

FEATURES = np.random.default_rng(7).normal(size=(12, 6)).astype("float32")
COSTS = [0.0, 0.05]


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def head_only_model() -> EncoderForDeferral:
    torch.manual_seed(0)
    model = EncoderForDeferral(DeferralConfig(feature_size=6, num_labels=3, num_experts=2,
                                              expert_names=["alice", "bob"])).eval()
    with torch.no_grad():
        model.head[-1].bias[3:] += 0.5  # some inputs defer
    return model


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("folders")
    model = head_only_model()
    model.save_pretrained(root / "model")
    pipeline("deferral", model=model).save_pretrained(root / "pipeline")
    rng = np.random.default_rng(0)
    data = Dataset.from_dict({"features": rng.normal(size=(16, 6)).astype("float32"),
                              "labels": rng.integers(0, 3, 16), "expert_labels": rng.integers(0, 3, (16, 2))})
    args = TrainingArguments(str(root / "out"), report_to=[], use_cpu=True, max_steps=1, save_strategy="no",
                             disable_tqdm=True)
    trainer = DeferralTrainer(model=head_only_model(), args=args, train_dataset=data)
    trainer.train()
    trainer.save_model(str(root / "trainer"))
    return {"model": root / "model", "pipeline": root / "pipeline", "trainer": root / "trainer"}


def decisions(outputs: list[dict]) -> list[tuple]:
    return [(o["label"], o["expert"], o["class_label"]) for o in outputs]


REMOTE = r"""
import json, sys
if sys.argv[1] == "block":
    class BlockHfDefer:
        def find_spec(self, name, path=None, target=None):
            if name == "hf_defer" or name.startswith("hf_defer."):
                raise ModuleNotFoundError(f"No module named {name!r} (blocked for this test)")
    sys.meta_path.insert(0, BlockHfDefer())
from transformers import pipeline
result = {}
for folder in json.loads(sys.argv[2]):
    classify = pipeline(model=folder, trust_remote_code=True)
    result[folder] = [type(classify).__module__, classify(json.loads(sys.argv[3]), expert_costs=json.loads(sys.argv[4]))]
result["hf_defer_modules"] = sorted(name for name in sys.modules if name.startswith("hf_defer"))
print("RESULT" + json.dumps(result))
"""


def test_every_saved_folder_loads_in_library_and_remote_code_mode_with_identical_decisions(folders, tmp_path):
    paths = [str(path) for path in folders.values()]
    for path in folders.values():
        config = json.loads((path / "config.json").read_text())
        assert set(config["auto_map"]) == {"AutoConfig", "AutoModel"} and set(config["custom_pipelines"]) == {
            hf_defer.modeling.pipeline_deferral.REMOTE_TASK}
        assert not [name for name in os.listdir(path) if name.startswith(".hf_defer_save_")]  # no temporary folder left

    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path / "modules"))
    run = subprocess.run([sys.executable, "-c", REMOTE, "block", json.dumps(paths), json.dumps(FEATURES.tolist()),
                          json.dumps(COSTS)], cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    remote = json.loads(run.stdout.split("RESULT", 1)[1])
    assert remote.pop("hf_defer_modules") == []

    in_memory = decisions(pipeline("deferral", model=head_only_model())(FEATURES, expert_costs=COSTS))
    assert {label for label, _, _ in in_memory} >= {"defer"} and len(set(in_memory)) > 1
    for path in paths:
        library = pipeline("deferral", model=path)  # hf_defer is imported here: no trust_remote_code needed
        assert type(library) is hf_defer.DeferralPipeline
        assert decisions(library(FEATURES, expert_costs=COSTS)) == in_memory
        module, outputs = remote[path]
        assert module.startswith("transformers_modules.") and decisions(outputs) == in_memory
        # The README's remote-code line in a process that imported hf_defer (this one).
        remote_here = pipeline(model=path, trust_remote_code=True)
        assert type(remote_here).__module__.startswith("transformers_modules.")
        assert decisions(remote_here(FEATURES, expert_costs=COSTS)) == in_memory


def user_folder(path: Path) -> dict[str, bytes]:
    """A folder with the user's own files, as in issue 11."""
    path.mkdir(parents=True, exist_ok=True)
    files = {"model-00001-of-00002.safetensors": b"shard", "modeling_deferral.py": b"# mine\n",
             "surrogates.py": b"# mine too\n", "tokenizer.json": b"{}", "tokenizer_config.json": b"{}"}
    for name, content in files.items():
        (path / name).write_bytes(content)
    return files


def unchanged(path: Path, files: dict[str, bytes]) -> bool:
    names = {name for name in os.listdir(path) if not name.startswith(".")}
    return names == set(files) and all((path / name).read_bytes() == content for name, content in files.items())


def tiny_tokenizer() -> BertTokenizer:
    return BertTokenizer(vocab={w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a"])})


def test_save_for_hub_refuses_to_delete_or_overwrite_the_users_files(tmp_path):
    files = user_folder(tmp_path)
    with pytest.raises(FileExistsError) as refusal:
        save_for_hub(head_only_model(), tmp_path, processing_class=tiny_tokenizer())
    for name in files:
        assert name in str(refusal.value)
    assert unchanged(tmp_path, files) and not [n for n in os.listdir(tmp_path) if n.startswith(".hf_defer")]
    save_for_hub(head_only_model(), tmp_path, processing_class=tiny_tokenizer(), overwrite=True)
    assert not (tmp_path / "model-00001-of-00002.safetensors").exists()
    assert (tmp_path / "surrogates.py").read_bytes() == (Path(hf_defer.__file__).parent / "modeling" / "surrogates.py").read_bytes()


@pytest.mark.parametrize("how", ["model", "pipeline", "trainer"])
def test_model_pipeline_and_trainer_saves_keep_the_users_code_and_shards(tmp_path, how):
    files = user_folder(tmp_path / "d")
    model = head_only_model()
    with pytest.raises(FileExistsError) as refusal:
        if how == "model":
            model.save_pretrained(tmp_path / "d")
        elif how == "pipeline":
            pipeline("deferral", model=model).save_pretrained(tmp_path / "d")
        else:
            args = TrainingArguments(str(tmp_path / "out"), report_to=[], use_cpu=True)
            DeferralTrainer(model=model, args=args).save_model(str(tmp_path / "d"))
    assert all(name in str(refusal.value) for name in
               ("model-00001-of-00002.safetensors", "modeling_deferral.py", "surrogates.py"))
    assert unchanged(tmp_path / "d", files)


def test_saving_again_replaces_only_its_own_files(tmp_path):
    model = head_only_model()
    model.save_pretrained(tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    with torch.no_grad():
        model.head[-1].bias += 1.0
    model.config.defer_threshold = 0.25
    model.save_pretrained(tmp_path)  # config.json, the weights and hf_defer's own code files are replaced
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert EncoderForDeferral.from_pretrained(tmp_path).config.defer_threshold == 0.25
    (tmp_path / "pipeline_deferral.py").write_text("# edited by the user\n")
    with pytest.raises(FileExistsError, match="pipeline_deferral.py"):
        model.save_pretrained(tmp_path)
    model.save_pretrained(tmp_path, overwrite=True)
    assert "DeferralPipeline" in (tmp_path / "pipeline_deferral.py").read_text()


def test_a_folder_saved_with_the_old_task_name_is_rewritten_for_library_mode(tmp_path):
    model = head_only_model()
    model.config.custom_pipelines = {"deferral": {"impl": "pipeline_deferral.DeferralPipeline", "pt": ["AutoModel"]},
                                     "other": {"impl": "mine.Pipeline", "pt": ["AutoModel"]}}
    model.save_pretrained(tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())["custom_pipelines"]
    assert set(written) == {"other", hf_defer.modeling.pipeline_deferral.REMOTE_TASK}
    assert set(model.config.custom_pipelines) == {"deferral", "other"}  # the in-memory config is left as it was


def test_a_model_sharded_with_fsdp2_saves_the_code_of_its_deferral_class(tmp_path):
    """`fully_shard` turns the model into an `FSDPEncoderForDeferral`, a class torch makes at run time in a module of
    its own; the folder still holds hf_defer's code files (not torch's) and names `EncoderForDeferral` in auto_map,
    like the unsharded model's (here one gloo process; the weights are gathered as the Trainer does)."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.fsdp import fully_shard

    head_only_model().save_pretrained(tmp_path / "plain")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = fully_shard(head_only_model())
        assert type(model).__name__ == "FSDPEncoderForDeferral"
        model.save_pretrained(tmp_path / "sharded",
                              state_dict=get_model_state_dict(model, options=StateDictOptions(full_state_dict=True)))
        assert "_auto_class" not in type(model).__dict__  # the class torch made is left as it was
    finally:
        dist.destroy_process_group()
    plain, sharded = (json.loads((tmp_path / name / "config.json").read_text()) for name in ("plain", "sharded"))
    assert sharded["auto_map"] == plain["auto_map"] and plain["auto_map"]["AutoModel"].endswith(".EncoderForDeferral")
    assert sharded["architectures"] == ["EncoderForDeferral"]
    assert sorted(os.listdir(tmp_path / "sharded")) == sorted(os.listdir(tmp_path / "plain"))
    loaded = EncoderForDeferral.from_pretrained(tmp_path / "sharded")
    torch.testing.assert_close(loaded.state_dict(), head_only_model().state_dict())
