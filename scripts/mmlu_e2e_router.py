"""MMLU: the route-only deferral model fine-tuned end to end (MiniLM + the subject as a side feature), cross-fitted on
the report's folds, in one process on a GPU; also saves the MiniLM embeddings of the prompts for the CPU report.

    python scripts/mmlu_e2e_router.py --model "$MINILM" --device cuda --output "$OUT"
    python scripts/mmlu_e2e_router.py --model "$MINILM" --device cuda --output "$OUT" --embeddings-only
    python scripts/mmlu_e2e_router.py --model "$MINILM" --device cpu --output /tmp/e2e --max-rows 100 --max-steps 1

Then: python scripts/mmlu_routing.py --embeddings "$OUT"/embeddings_*.npy --route-only-e2e "$OUT/e2e_predictions.json"
The logic lives in `research.mmlu_e2e_router`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from research.mmlu_e2e_router import E2ESettings, run_e2e

DEFAULTS = E2ESettings()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="local folder of the encoder (all-MiniLM-L6-v2)")
    parser.add_argument("--output", type=Path, required=True,
                        help="folder for embeddings_*.npy, embeddings.json, e2e_predictions.json")
    parser.add_argument("--device", default="cuda", help="cuda (bf16 autocast) or cpu")
    parser.add_argument("--max-rows", type=int, default=None, help="a seeded random subset (as scripts/mmlu_routing.py)")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--fold-seed", type=int, default=0, help="seed of the folds and of the --max-rows subset")
    parser.add_argument("--embeddings-only", action="store_true", help="stop after writing the embeddings")
    parser.add_argument("--skip-embeddings", action="store_true",
                        help="only the router (the embeddings came from an earlier run)")
    parser.add_argument("--overwrite", action="store_true", help="replace files already in --output")
    parser.add_argument("--lr", type=float, default=DEFAULTS.lr, help="encoder learning rate")
    parser.add_argument("--head-lr", type=float, default=DEFAULTS.head_lr,
                        help="learning rate of the head and the subject embedding")
    parser.add_argument("--epochs", type=float, default=DEFAULTS.epochs)
    parser.add_argument("--batch-size", type=int, default=DEFAULTS.batch_size)
    parser.add_argument("--eval-batch-size", type=int, default=DEFAULTS.eval_batch_size)
    parser.add_argument("--max-length", type=int, default=DEFAULTS.max_length)
    parser.add_argument("--warmup", type=float, default=DEFAULTS.warmup, help="share of steps of linear warmup")
    parser.add_argument("--weight-decay", type=float, default=DEFAULTS.weight_decay)
    parser.add_argument("--side-feature-dim", type=int, default=DEFAULTS.side_feature_dim)
    parser.add_argument("--head-hidden", type=int, nargs="*", default=list(DEFAULTS.head_hidden_sizes),
                        help="hidden layer sizes of the head (none: linear)")
    parser.add_argument("--seed", type=int, default=DEFAULTS.seed)
    parser.add_argument("--no-group-by-length", action="store_true", help="random batches (more padding)")
    parser.add_argument("--max-steps", type=int, default=-1, help="optimizer steps per fold (smoke test); -1: epochs")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    settings = E2ESettings(lr=args.lr, head_lr=args.head_lr, epochs=args.epochs, batch_size=args.batch_size,
                           eval_batch_size=args.eval_batch_size, max_length=args.max_length, warmup=args.warmup,
                           weight_decay=args.weight_decay, side_feature_dim=args.side_feature_dim,
                           head_hidden_sizes=tuple(args.head_hidden), seed=args.seed,
                           group_by_length=not args.no_group_by_length, max_steps=args.max_steps)
    return run_e2e(args.output, args.model, device=args.device, max_rows=args.max_rows, folds=args.folds,
                   fold_seed=args.fold_seed, settings=settings, embeddings_only=args.embeddings_only,
                   skip_embeddings=args.skip_embeddings,
                   overwrite=args.overwrite, log=lambda message: print(message, flush=True))


if __name__ == "__main__":
    main()
