"""Full fine-tuning against LoRA of a deferral model over a small random decoder (Qwen2 architecture), on CPU.

For each variant, in a fresh process (so that peak memory is its own): parameters trained, the memory of weights +
gradients + AdamW state (counted from the tensors), the peak resident memory the training added (measured), and the
median time of one optimizer step (forward, backward, AdamW) over a fixed batch.

    HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 python benchmarks/bench_lora_decoder.py --output benchmarks/lora_decoder.json
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

import torch

# A small decoder: the Qwen2 architecture at width 256, 4 layers, an 8k vocabulary (5.0M parameters with the head).
DECODER = dict(hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=8192, max_position_embeddings=512)
VARIANTS = {
    "full fine-tuning": dict(lora=None, checkpointing=False),
    "full fine-tuning + activation checkpointing": dict(lora=None, checkpointing=True),
    "LoRA r=8 (q, v)": dict(lora=["q_proj", "v_proj"], checkpointing=False),
    "LoRA r=8 (all linear)": dict(lora=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
                                  checkpointing=False),
    "LoRA r=8 (all linear) + activation checkpointing": dict(
        lora=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], checkpointing=True),
}


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def run_variant(name: str, steps: int, batch_size: int, length: int) -> dict:
    from transformers import Qwen2Config

    from hf_defer import DeferralConfig, EncoderForDeferral

    variant = VARIANTS[name]
    torch.manual_seed(0)
    model = EncoderForDeferral(DeferralConfig(encoder=Qwen2Config(**DECODER), num_labels=3)).train()
    if variant["lora"]:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=variant["lora"],
                                                 modules_to_save=["head"]))
    if variant["checkpointing"]:
        model.activation_checkpointing_enable()
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=1e-4)
    batch = {"input_ids": torch.randint(0, DECODER["vocab_size"], (batch_size, length)),
             "attention_mask": torch.ones(batch_size, length, dtype=torch.long),
             "labels": torch.randint(0, 3, (batch_size,)), "expert_labels": torch.randint(0, 3, (batch_size,))}
    before = peak_rss_mib()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    total = sum(p.numel() for p in model.parameters())
    n_trained = sum(p.numel() for p in trained)
    state_bytes = sum(p.numel() * p.element_size() for p in model.parameters()) + sum(
        p.numel() * p.element_size() for p in trained)  # weights + gradients
    state_bytes += sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values()
                       if torch.is_tensor(t))  # AdamW moments
    return {"variant": name, "parameters": total, "trained": n_trained, "trained_fraction": n_trained / total,
            "weights_grads_adam_mib": state_bytes / 2**20, "peak_rss_added_mib": peak_rss_mib() - before,
            "median_step_ms": 1000 * statistics.median(times[2:]), "steps": steps, "final_loss": float(loss)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--output", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_variant(args.child, args.steps, args.batch_size, args.length)))
        return
    rows = []
    for name in VARIANTS:
        command = [sys.executable, __file__, "--child", name, "--steps", str(args.steps), "--batch-size",
                   str(args.batch_size), "--length", str(args.length)]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print("| variant | parameters trained | weights + grads + AdamW (MiB) | peak RSS added (MiB) | ms/step |")
    print("|---|---|---|---|---|")
    for row in rows:
        trained = f"{row['trained']:,} of {row['parameters']:,} ({100 * row['trained_fraction']:.2f} %)"
        print(f"| {row['variant']} | {trained} | {row['weights_grads_adam_mib']:.1f} | "
              f"{row['peak_rss_added_mib']:.1f} | {row['median_step_ms']:.0f} |")
    if args.output:
        setup = {"decoder": DECODER, "batch_size": args.batch_size, "length": args.length, "steps": args.steps,
                 "torch": torch.__version__, "threads": torch.get_num_threads()}
        with open(args.output, "w") as handle:
            json.dump({"setup": setup, "results": rows}, handle, indent=2)
            handle.write("\n")


if __name__ == "__main__":
    main()
