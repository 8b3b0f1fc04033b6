"""LoRA fine-tuning of a decoder-only deferral model on HateSpeech: bf16, activation checkpointing, a float32 head.

The backbone is a RANDOM-weight Qwen2 with the dimensions of Qwen2-0.5B (494M parameters; nothing is downloaded, so
this runs on a machine without Hub access), its tokenizer a byte-level BPE trained here on the training tweets. The
numbers it writes are evidence about the training path (memory, speed, trainable parameters, that the loss goes
down and the deferral metrics come out), not about what a pretrained 0.5B model would reach.

    # one H100, about 4 minutes in all:
    python scripts/finetune_decoder_lora.py --output results/decoder_lora_h100.json
    # CPU smoke run with a tiny Qwen2 (what tests/test_finetune_script.py runs):
    python scripts/finetune_decoder_lora.py --data labeled_data.csv --tiny --max-steps 2 --output /tmp/tiny.json

It writes a JSON file with the test-split deferral metrics, steps per second, peak GPU memory, and the trained and
total parameter counts.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, TrainerCallback, TrainingArguments

from hf_defer import DeferralConfig, DeferralTrainer, EncoderForDeferral
from hf_defer.data import load_hatespeech

# Qwen2-0.5B (config.json of Qwen/Qwen2-0.5B), the vocabulary size included: the embedding is 136M of the 494M.
QWEN2_0_5B = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                  num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
                  vocab_size=151_936, tie_word_embeddings=True)
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
EOS = "<|endoftext|>"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=None,
                        help="labeled_data.csv (or .csv.gz) of Davidson et al. (2017); default: the copy shipped in hf_defer")
    parser.add_argument("--output", default="decoder_lora.json", help="where to write the JSON of results")
    parser.add_argument("--tiny", action="store_true", help="a tiny Qwen2 (2 layers, width 64) for a CPU run")
    parser.add_argument("--max-steps", type=int, default=1200, help="training steps (default fits ~4 min, H100)")
    parser.add_argument("--max-minutes", type=float, default=3.0, help="stop training after this wall time")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=64, help="tokens per tweet (truncated beyond)")
    parser.add_argument("--learning-rate", type=float, default=5e-4)
    parser.add_argument("--lora-r", type=int, default=16)
    parser.add_argument("--lora-alpha", type=int, default=32)
    parser.add_argument("--lora-target-modules", nargs="+",
                        default=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    parser.add_argument("--vocab-size", type=int, default=8192, help="size of the BPE vocabulary trained here")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", default=None, help="Trainer output folder (default: a temporary one)")
    return parser.parse_args(argv)


def train_tokenizer(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE (the kind Qwen2 uses) trained on `texts`, with an end-of-sequence and no padding token."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=EOS)


class StopAfter(TrainerCallback):
    """Stops training once `seconds` of wall time have passed since the first step began."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.start = seconds, None

    def on_step_begin(self, args, state, control, **kwargs):
        self.start = self.start or time.monotonic()

    def on_step_end(self, args, state, control, **kwargs):
        if time.monotonic() - self.start > self.seconds:
            control.should_training_stop = True


def build_model(tokenizer: PreTrainedTokenizerFast, tiny: bool, device: torch.device) -> EncoderForDeferral:
    dims = TINY | {"vocab_size": len(tokenizer)} if tiny else QWEN2_0_5B
    encoder = Qwen2Config(**dims, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id)
    config = DeferralConfig(encoder=encoder, num_labels=3, num_experts=1, surrogate="asm",
                            id2label={0: "hate_speech", 1: "offensive_language", 2: "neither"})
    with device:  # random weights, built where they will train
        model = EncoderForDeferral(config)
    if device.type == "cuda":  # bf16 backbone, float32 head (as loading with dtype=torch.bfloat16 gives)
        model.encoder.to(torch.bfloat16)
    return model


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    started = time.monotonic()
    data = load_hatespeech(args.data, seed=args.seed)
    tokenizer = train_tokenizer(data["train"]["text"], 512 if args.tiny else args.vocab_size)
    data = data.map(lambda batch: tokenizer(batch["text"], truncation=True, max_length=args.max_length),
                    batched=True, remove_columns=["text", "count", "hate_speech", "offensive_language", "neither"])

    model = build_model(tokenizer, args.tiny, device)
    total = sum(p.numel() for p in model.parameters())
    lora = LoraConfig(r=args.lora_r, lora_alpha=args.lora_alpha, lora_dropout=0.0,
                      target_modules=args.lora_target_modules, modules_to_save=["head"])
    model = get_peft_model(model, lora)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)

    bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
    output_dir = args.output_dir or str(Path(args.output).with_suffix("")) + "_trainer"
    training_args = TrainingArguments(
        output_dir, max_steps=args.max_steps, per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=2 * args.batch_size, learning_rate=args.learning_rate, warmup_steps=0.05,
        lr_scheduler_type="cosine", weight_decay=0.0, bf16=bf16, activation_checkpointing=True,
        logging_steps=max(1, min(50, args.max_steps // 10)), save_strategy="no", eval_strategy="no", report_to=[],
        seed=args.seed, dataloader_num_workers=0, use_cpu=device.type == "cpu", disable_tqdm=True,
    )
    trainer = DeferralTrainer(model=model, args=training_args, train_dataset=data["train"],
                              processing_class=tokenizer, callbacks=[StopAfter(60 * args.max_minutes)])
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    train_output = trainer.train()
    steps, train_seconds = trainer.state.global_step, train_output.metrics["train_runtime"]
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None
    test = trainer.evaluate(data["test"], metric_key_prefix="test")
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]

    results = {
        "backbone": "random-weight Qwen2, " + ("tiny (2 layers, width 64)" if args.tiny else "Qwen2-0.5B dimensions"),
        "tokenizer": f"byte-level BPE, {len(tokenizer)} tokens, trained on the training tweets",
        "device": torch.cuda.get_device_name() if device.type == "cuda" else platform.processor() or "cpu",
        "bf16": bf16,
        "activation_checkpointing": True,
        "parameters": total,
        "trainable_parameters": trainable,
        "trainable_fraction": trainable / total,
        "steps": steps,
        "batch_size": args.batch_size,
        "max_length": args.max_length,
        "train_seconds": train_seconds,
        "steps_per_second": steps / train_seconds,
        "peak_gpu_memory_gib": peak,
        "first_and_last_logged_loss": [losses[0], losses[-1]] if losses else None,
        "test": {key: value for key, value in test.items() if isinstance(value, (int, float))},
        "num_train_examples": data["train"].num_rows,
        "num_test_examples": data["test"].num_rows,
        "total_seconds": time.monotonic() - started,
        "versions": {"torch": torch.__version__, "transformers": __import__("transformers").__version__,
                     "peft": __import__("peft").__version__},
        "args": vars(args),
    }
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps({key: results[key] for key in ("steps", "steps_per_second", "peak_gpu_memory_gib",
                                                    "trainable_parameters", "parameters")}))
    print(json.dumps(results["test"]))
    return results


if __name__ == "__main__":
    main()
