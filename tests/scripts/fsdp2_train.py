"""Full fine-tuning of a tiny Llama deferral model sharded with FSDP2 (`torch.distributed.fsdp.fully_shard`, one unit
per decoder layer as examples/accelerate/fsdp.yaml wraps them, then the whole model) on CPU processes with gloo; run by
tests/training/test_fsdp.py under `torchrun` with 1 or 2 processes. The global batch is 8 whatever the number of
processes (each takes its contiguous share of the batch); AdamW, 6 steps.

accelerate 1.15 cannot run this on CPU: `AcceleratorState` switches to FSDP only from a multi-accelerator distributed
type, so `accelerate launch --config_file examples/accelerate/fsdp.yaml` on CPU processes trains with DDP instead (see
the header of that file); this script calls FSDP2 itself.

Arguments: the JSON report, the output folder, and `--stop-after N` (save a sharded checkpoint with
`torch.distributed.checkpoint` after step N and stop) or `--resume` (load it and go on). Rank 0 writes the loss of
every step, a digest of the trained weights, and saves the full (unsharded) model with its tokenizer to
`<output>/final` with `save_pretrained`. `--plain` (one process) trains without FSDP: the reference.
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_state_dict, \
    set_state_dict
from torch.distributed.fsdp import fully_shard

from test_decoder_backbones import decoder_model, decoder_tokenizer, text_dataset  # tests/modeling/ is on PYTHONPATH

STEPS, BATCH = 6, 8
report, output = Path(sys.argv[1]), Path(sys.argv[2])
stop_after = int(sys.argv[sys.argv.index("--stop-after") + 1]) if "--stop-after" in sys.argv else None
resume = "--resume" in sys.argv
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = decoder_model("llama").train()
plain = "--plain" in sys.argv  # the reference: one process, no FSDP
if not plain:
    for module in model.modules():
        if type(module).__name__ in model._no_split_modules:  # LlamaDecoderLayer: TRANSFORMER_BASED_WRAP
            fully_shard(module)
    fully_shard(model)
sharded = sum(1 for p in model.parameters() if type(p).__name__ == "DTensor")
optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
tokenizer = decoder_tokenizer()
tokenizer.pad_token = tokenizer.eos_token
data = text_dataset(tokenizer, BATCH * STEPS)
start = 0
checkpoint = output / "checkpoint"
if resume:
    state = {"model": None, "optimizer": None}
    state["model"], state["optimizer"] = get_state_dict(model, optimizer)
    dcp.load(state, checkpoint_id=str(checkpoint))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    start = json.loads((output / "checkpoint.json").read_text())["step"]
losses = {}
for step in range(start, STEPS):
    share = BATCH // world
    rows = data[step * BATCH + rank * share: step * BATCH + (rank + 1) * share]
    batch = tokenizer.pad({"input_ids": rows["input_ids"]}, return_tensors="pt")
    loss = model(**batch, labels=torch.tensor(rows["labels"]), expert_labels=torch.tensor(rows["expert_labels"])).loss
    loss.backward()  # FSDP2 reduce-scatters the gradients, averaged over the processes
    optimizer.step()
    optimizer.zero_grad()
    mean = loss.detach().clone()
    dist.all_reduce(mean)
    losses[step + 1] = float(mean) / world
    if stop_after is not None and step + 1 == stop_after:
        model_state, optimizer_state = get_state_dict(model, optimizer)
        dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(checkpoint))
        if rank == 0:
            (output / "checkpoint.json").write_text(json.dumps({"step": step + 1}))
        break
full = model.state_dict() if plain else get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                                              cpu_offload=True))
if rank == 0:
    saved = decoder_model("llama")
    saved.load_state_dict(full)
    saved.save_pretrained(output / "final")
    tokenizer.save_pretrained(output / "final")
    weights = {name: float(value.double().sum()) for name, value in full.items()}
    report.write_text(json.dumps({"world_size": world, "losses": losses, "sharded_parameters": sharded,
                                  "files": sorted(p.name for p in checkpoint.glob("*")) if checkpoint.exists() else [],
                                  "weights": weights}))
dist.barrier()
dist.destroy_process_group()
