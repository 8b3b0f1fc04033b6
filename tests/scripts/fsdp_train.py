"""Full fine-tuning of a tiny Llama deferral model with `DeferralTrainer`, run by tests/training/test_fsdp.py in one
process or under `accelerate launch --config_file examples/accelerate/fsdp.yaml` on 2 CPU processes (gloo). The
global batch is 8 whatever the number of processes. Arguments: the JSON file to write, the output folder, and
`--resume` (continue from the newest checkpoint there). Rank 0 writes the training losses by step and where the
model was saved."""

import json
import os
import sys
from pathlib import Path

import torch
from transformers import TrainingArguments

from test_decoder_backbones import decoder_model, decoder_tokenizer, text_dataset  # tests/modeling/ is on PYTHONPATH

from hf_defer import DeferralTrainer

report, output = Path(sys.argv[1]), sys.argv[2]
resume = "--resume" in sys.argv
max_steps = int(os.environ.get("FSDP_TEST_MAX_STEPS", "6"))
torch.manual_seed(0)
model = decoder_model("llama").train()
tokenizer = decoder_tokenizer()
world_size = int(os.environ.get("WORLD_SIZE", "1"))
args = TrainingArguments(output, max_steps=max_steps, per_device_train_batch_size=8 // world_size,
                         learning_rate=5e-3, report_to=[], save_strategy="steps", save_steps=3,
                         logging_steps=1, disable_tqdm=True, seed=0, data_seed=0, lr_scheduler_type="constant")
trainer = DeferralTrainer(model=model, args=args, train_dataset=text_dataset(tokenizer, 48),
                          processing_class=tokenizer)
trainer.train(resume_from_checkpoint=True if resume else None)
trainer.save_model(str(Path(output) / "final"))
if trainer.is_world_process_zero():
    losses = {entry["step"]: entry["loss"] for entry in trainer.state.log_history if "loss" in entry}
    report.write_text(json.dumps({"world_size": world_size, "losses": losses,
                                  "fsdp": trainer.is_fsdp_enabled, "final": str(Path(output) / "final")}))
