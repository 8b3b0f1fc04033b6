"""Training: `DeferralTrainer` (a `transformers.Trainer`), PEFT/LoRA adapters and padding tokens for decoder
tokenizers.

Imports modeling, evaluation, data and the hub's model card (written at the end of training); never commands,
review or experiments.
"""
