"""Resuming the training of a model with PEFT adapters: [`DeferralTrainer`] loads the adapter and head weights of a
checkpoint with [`load_adapter_checkpoint`]. What a model's adapters say (base model, trainable head) is read in
`hf_defer.inspection.adapters`, which the Hub helpers share."""

from __future__ import annotations

import os
from typing import Any

from ..inspection.adapters import active_adapter, is_peft_model

__all__ = ["load_adapter_checkpoint"]


def load_adapter_checkpoint(model: Any, checkpoint: str | os.PathLike) -> None:
    """Loads the adapter and head weights of a checkpoint folder into the active adapter of `model`, in place.

    [`DeferralTrainer`] resumes with it for models given their adapter by `add_adapter`: `Trainer` resumes the
    adapter of a `PeftModel` only, and looks for full model weights otherwise.

    Raises:
        `ValueError`: the checkpoint has no `adapter_model.safetensors`, or weights the model's adapter does not have.
    """
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    path = os.path.join(checkpoint, "adapter_model.safetensors")
    if not os.path.isfile(path):
        raise ValueError(
            f"checkpoint must hold adapter_model.safetensors, got the files {sorted(os.listdir(checkpoint))}."
        )
    state_dict = load_file(path)
    if not is_peft_model(model):  # saved in peft's format, with the keys of a PeftModel around the model
        state_dict = {key.removeprefix("base_model.model."): value for key, value in state_dict.items()}
    result = set_peft_model_state_dict(model, state_dict, adapter_name=active_adapter(model))
    unexpected = getattr(result, "unexpected_keys", None) or []
    if unexpected:
        raise ValueError(f"the adapter in {str(checkpoint)!r} has weights this model lacks: {unexpected[:5]}.")
