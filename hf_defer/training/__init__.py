"""Training: `DeferralTrainer` (a `transformers.Trainer`), PEFT/LoRA adapters, padding tokens for decoder
tokenizers, and the list of private upstream names hf_defer relies on (`upstream_hooks`).

Imports modeling, evaluation, data and the hub's model card (written at the end of training); never commands
or review.
"""
