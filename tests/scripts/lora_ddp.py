"""LoRA training of a tiny Llama deferral model, run by tests/test_distributed.py under `accelerate launch` or
`torchrun` with 1 or 2 CPU processes; rank 0 writes the evaluation metrics and a digest of the trained weights
to the JSON file named by the first argument. The global batch is 8 whatever the number of processes."""

import json
import sys
import tempfile
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from transformers import TrainingArguments

from test_decoder_backbones import decoder_model, decoder_tokenizer, text_dataset  # tests/modeling/ is on PYTHONPATH

from hf_defer import DeferralTrainer

torch.manual_seed(0)
model = get_peft_model(decoder_model("llama"), LoraConfig(r=4, target_modules=["q_proj", "v_proj"],
                                                          modules_to_save=["head"]))
tokenizer = decoder_tokenizer()
world_size = int(__import__("os").environ.get("WORLD_SIZE", "1"))
args = TrainingArguments(tempfile.mkdtemp(), max_steps=6, per_device_train_batch_size=8 // world_size,
                         per_device_eval_batch_size=5, learning_rate=5e-3, use_cpu=True, report_to=[],
                         save_strategy="no", disable_tqdm=True, seed=0, data_seed=0)
trainer = DeferralTrainer(model=model, args=args, train_dataset=text_dataset(tokenizer, 48),
                          eval_dataset=text_dataset(tokenizer, 23, seed=1), processing_class=tokenizer)
trainer.train()
metrics = trainer.evaluate()
if trainer.is_world_process_zero():
    weights = {name: float(p.detach().double().sum()) for name, p in model.named_parameters() if p.requires_grad}
    Path(sys.argv[1]).write_text(json.dumps({"world_size": world_size, "metrics": metrics, "weights": weights}))
