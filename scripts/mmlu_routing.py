"""MMLU routing on RouteLLM's data (GPT-4-1106 vs Mixtral-8x7B): cross-fitted routers, RouteLLM's APGR and CPT.

Writes results/mmlu_routing.json and results/mmlu_routing.md. The logic lives in `research.mmlu_routing`.

    python scripts/mmlu_routing.py                  # embeddings of the 14,037 questions (cached), then all routers
    python scripts/mmlu_routing.py --render-only    # rewrite the report from the JSON
    python scripts/mmlu_routing.py --route-only     # with the route-only deferral models (text; text + subject)
    python scripts/mmlu_routing.py --route-only --embeddings OUT/embeddings_*.npy --route-only-e2e OUT/e2e_predictions.json
                                                    # embeddings and the end-to-end router from scripts/mmlu_e2e_router.py
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

from research import mmlu_routing as mr
from research.mmlu_e2e_router import load_embeddings, load_predictions
from research.mmlu_side_features import fit_route_only_side_features
from hf_defer.data.routellm_mmlu import load_routellm_mmlu
from hf_defer.experts.embeddings import DEFAULT_SENTENCE_ENCODER

ROOT = Path(__file__).resolve().parent.parent


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=ROOT / "results", help="folder of mmlu_routing.{json,md}")
    parser.add_argument("--model", default=DEFAULT_SENTENCE_ENCODER, help="sentence encoder of the questions")
    parser.add_argument("--device", default=None, help="device of the encoder (default: sentence-transformers' choice)")
    parser.add_argument("--max-rows", type=int, default=None, help="a seeded random subset of questions (quick runs)")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--fold-seed", type=int, default=0)
    parser.add_argument("--bootstrap", type=int, default=200, help="resamples for the APGR intervals")
    parser.add_argument("--epochs", type=int, default=30, help="epochs of each logistic regression")
    parser.add_argument("--route-only", action="store_true",
                        help="add the route-only deferral models (mmlu_routing.fit_route_only_deferral, and "
                             "mmlu_side_features.fit_route_only_side_features with the subject as a side feature)")
    parser.add_argument("--embeddings", type=Path, nargs="+", default=None,
                        help="the questions' embeddings from scripts/mmlu_e2e_router.py (embeddings_0.npy ... in "
                             "order, or one .npy) instead of embedding here; same --max-rows and --fold-seed")
    parser.add_argument("--route-only-e2e", type=Path, default=None,
                        help="e2e_predictions.json of scripts/mmlu_e2e_router.py: adds the row of the route-only "
                             "model fine-tuned end to end (same --max-rows, --folds and --fold-seed)")
    parser.add_argument("--render-only", action="store_true", help="rewrite the markdown from the JSON")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    json_path, md_path = args.output / "mmlu_routing.json", args.output / "mmlu_routing.md"
    if args.render_only:
        md_path.write_text(mr.report_markdown(json.loads(json_path.read_text())))
        print(md_path.read_text())
        return
    start = time.perf_counter()
    full = load_routellm_mmlu()
    rows = mr.selected_rows(full.num_rows, args.max_rows, args.fold_seed)  # the rows mmlu_routing_data selects
    e2e, e2e_settings = None, None
    if args.route_only_e2e is not None:  # checked before anything is embedded
        fold = mr.subject_folds([str(s) for s in full.select(rows)["subject"]], args.folds, args.fold_seed)
        e2e = load_predictions(args.route_only_e2e, rows, fold)
        saved = json.loads(args.route_only_e2e.read_text())
        e2e_settings = {"file": str(args.route_only_e2e), "device_name": saved.get("device_name"),
                        "encoder": saved.get("encoder"), "settings": saved.get("settings"),
                        "fold_seconds": [info.get("train_seconds", 0) + info.get("predict_seconds", 0)
                                         for info in saved.get("fold_info", [])],
                        "versions": saved.get("versions")}
    encoder, embeddings_source = args.model, None
    if args.embeddings:
        data, features = full.select(rows), load_embeddings(args.embeddings, rows)
        meta = args.embeddings[0].parent / "embeddings.json"
        if meta.exists():
            saved = json.loads(meta.read_text())
            encoder = f"{saved.get('encoder')} (embeddings of scripts/mmlu_e2e_router.py on {saved.get('device_name')})"
            embeddings_source = (f"came from scripts/mmlu_e2e_router.py ({len(args.embeddings)} files, "
                                 f"{saved.get('seconds')} s on {saved.get('device_name')})")
    else:
        data, features = mr.mmlu_routing_data(args.max_rows, args.fold_seed, args.model, args.device)
    embedding_seconds = round(time.perf_counter() - start, 1)
    record = mr.compare(features, data["subject"], data["gpt-4-1106-preview"], data["mixtral-8x7b-instruct"],
                        folds=args.folds, fold_seed=args.fold_seed, bootstrap=args.bootstrap, epochs=args.epochs,
                        route_only=mr.fit_route_only_deferral if args.route_only else None,
                        route_only_subject=fit_route_only_side_features if args.route_only else None,
                        route_only_e2e=e2e)
    record["settings"] |= {
        "encoder": encoder, "embedding_seconds": embedding_seconds, "embeddings_source": embeddings_source,
        "max_rows": args.max_rows,
        "route_only_e2e": e2e_settings,
        "subjects": len(set(data["subject"])), "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, Python {platform.python_version()}",
        "command": "python scripts/mmlu_routing.py " + " ".join(sys.argv[1:] if argv is None else argv)}
    args.output.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(record, indent=1))
    md_path.write_text(mr.report_markdown(record))
    print(md_path.read_text())


if __name__ == "__main__":
    main()
