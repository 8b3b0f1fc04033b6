"""What a deferral model's PEFT adapters say: whether it has any, which base model they name, whether the head trains
and whether a saved adapter folder could be loaded again. Read by the trainer and by the Hub helpers alike (this
module imports no other part of hf_defer). LoRA and other PEFT adapters go on deferral models both ways `transformers`
users know them:

* `peft.get_peft_model(model, LoraConfig(..., modules_to_save=["head"]))` wraps the model in a `PeftModel`;
* `model.add_adapter(LoraConfig(..., modules_to_save=["head"]))` (transformers' `PeftAdapterMixin`) injects the
  adapter into the model itself.

Either way the adapters go on the encoder's modules (`target_modules`), the deferral head trains in full and is saved
with the adapter (`modules_to_save=["head"]`), and [`DeferralTrainer`] saves checkpoints and the final model in
peft's format: `adapter_config.json` and `adapter_model.safetensors` (adapter and head, not the base model), with the
deferral model card naming the base model. The base model is the deferral model the adapter was added to; its
folder or Hub id is the adapter's `base_model_name_or_path` (load the base with
`AutoModelForDeferral.from_pretrained` before adding the adapter, and that is filled in). Loading the adapter folder
with `AutoModelForDeferral.from_pretrained(folder)`, `pipeline("deferral", model=folder)` or
`PeftModel.from_pretrained(base, folder)` rebuilds the trained model; `merge_and_unload()` gives a plain one.

Example:

```python
>>> import tempfile
>>> from peft import LoraConfig, get_peft_model
>>> from transformers import LlamaConfig
>>> from hf_defer import AutoModelForDeferral, DeferralConfig, EncoderForDeferral
>>> llama = LlamaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37,
...                     vocab_size=64)
>>> base = tempfile.mkdtemp()
>>> EncoderForDeferral(DeferralConfig(encoder=llama, num_labels=3)).save_pretrained(base)
>>> model = get_peft_model(AutoModelForDeferral.from_pretrained(base),
...                        LoraConfig(r=4, target_modules=["q_proj", "v_proj"], modules_to_save=["head"]))
>>> adapter_base_model(model) == base
True
>>> check_head_trainable(model)  # raises when the head would stay frozen

```
"""

from __future__ import annotations

from typing import Any


def is_peft_model(model: Any) -> bool:
    """Whether `model` is a `peft.PeftModel` (`False` when peft is not installed).

    Example:

    ```python
    >>> from hf_defer.inspection import is_peft_model
    >>> from peft import LoraConfig, get_peft_model
    >>> from transformers import LlamaConfig
    >>> from hf_defer import DeferralConfig, EncoderForDeferral
    >>> llama = LlamaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37,
    ...                     vocab_size=64)
    >>> lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], modules_to_save=["head"])
    >>> model = EncoderForDeferral(DeferralConfig(encoder=llama, num_labels=3))
    >>> is_peft_model(model), is_peft_model(get_peft_model(model, lora))
    (False, True)

    ```
    """
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)


def has_adapters(model: Any) -> bool:
    """Whether `model` carries PEFT adapters: a `PeftModel`, or a model given one with `add_adapter`/`load_adapter`.
    Such a model saves only its adapters and the modules in `modules_to_save`, in peft's format.

    Example:

    ```python
    >>> from hf_defer.inspection import has_adapters
    >>> from peft import LoraConfig, get_peft_model
    >>> from transformers import LlamaConfig
    >>> from hf_defer import DeferralConfig, EncoderForDeferral
    >>> llama = LlamaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37,
    ...                     vocab_size=64)
    >>> lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], modules_to_save=["head"])
    >>> model = EncoderForDeferral(DeferralConfig(encoder=llama, num_labels=3))
    >>> has_adapters(model)
    False
    >>> has_adapters(get_peft_model(model, lora))  # as has a model given one by model.add_adapter(lora)
    True

    ```
    """
    return is_peft_model(model) or bool(getattr(model, "_hf_peft_config_loaded", False))


def active_adapter(model: Any) -> str:
    """The name of the active adapter of a model with adapters (a `PeftModel`, or a model given one by
    `add_adapter`).

    Example:

    ```python
    >>> from hf_defer.inspection import active_adapter
    >>> from peft import LoraConfig, get_peft_model
    >>> from transformers import LlamaConfig
    >>> from hf_defer import DeferralConfig, EncoderForDeferral
    >>> llama = LlamaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37,
    ...                     vocab_size=64)
    >>> lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], modules_to_save=["head"])
    >>> model = get_peft_model(EncoderForDeferral(DeferralConfig(encoder=llama, num_labels=3)), lora,
    ...                        adapter_name="toxicity")
    >>> active_adapter(model)
    'toxicity'

    ```
    """
    active = model.active_adapters  # a property of PeftModel, a method of transformers' PeftAdapterMixin
    return (active() if callable(active) else active)[0]


def _active_peft_config(model: Any) -> Any:
    return model.peft_config[active_adapter(model)]


def adapter_base_model(model: Any) -> str | None:
    """The folder or Hub id of the base model the active adapter was added to (its `base_model_name_or_path`), or
    `None` for a model without adapters or an adapter whose base was built in memory.

    Example:

    ```python
    >>> import tempfile
    >>> from hf_defer import AutoModelForDeferral
    >>> from hf_defer.inspection import adapter_base_model
    >>> from peft import LoraConfig, get_peft_model
    >>> from transformers import LlamaConfig
    >>> from hf_defer import DeferralConfig, EncoderForDeferral
    >>> llama = LlamaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37,
    ...                     vocab_size=64)
    >>> lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], modules_to_save=["head"])
    >>> base = tempfile.mkdtemp()
    >>> EncoderForDeferral(DeferralConfig(encoder=llama, num_labels=3)).save_pretrained(base)
    >>> adapter_base_model(get_peft_model(AutoModelForDeferral.from_pretrained(base), lora)) == base
    True
    >>> in_memory = EncoderForDeferral(DeferralConfig(encoder=llama, num_labels=3))  # never saved: no folder to name
    >>> print(adapter_base_model(get_peft_model(in_memory, LoraConfig(r=4, target_modules=["q_proj"]))))
    None

    ```
    """
    if not has_adapters(model):
        return None
    config = _active_peft_config(model)
    return getattr(config, "base_model_name_or_path", None) or None


def check_adapter_loadable(model: Any) -> None:
    """Checks that the adapter of `model`, once saved, can be loaded again: that its base model has a folder or Hub id.

    peft saves an adapter with the base model's `name_or_path` as `base_model_name_or_path`, and loading the adapter
    folder loads that base first. An adapter added to a deferral model built in memory
    (`EncoderForDeferral.from_encoder_pretrained(...)`, `EncoderForDeferral(config)`) has none: its folder would be
    written and then fail to load (looking for the base model `None`). [`DeferralTrainer`] warns at construction and
    refuses to save or push such a model, and so does [`hf_defer.save_for_hub`]; a model without adapters passes.

    Raises:
        `ValueError`: the base model of the active adapter was built in memory; the message says what to do.

    Example:

    ```python
    >>> from hf_defer.inspection import check_adapter_loadable
    >>> from peft import LoraConfig, get_peft_model
    >>> from transformers import LlamaConfig
    >>> from hf_defer import DeferralConfig, EncoderForDeferral
    >>> llama = LlamaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37,
    ...                     vocab_size=64)
    >>> lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], modules_to_save=["head"])
    >>> model = get_peft_model(EncoderForDeferral(DeferralConfig(encoder=llama, num_labels=3)), lora)
    >>> check_adapter_loadable(model)
    Traceback (most recent call last):
        ...
    ValueError: this model's adapter was added to a deferral model built in memory ...

    ```
    """
    if not has_adapters(model) or adapter_base_model(model) is not None:
        return
    after = ("model.merge_and_unload().save_pretrained(folder) saves it whole, as a plain deferral model"
             if is_peft_model(model) else "point the adapter at a saved copy of its base weights, "
             f"model.peft_config[{active_adapter(model)!r}].base_model_name_or_path = 'base', then save it")
    raise ValueError(
        "this model's adapter was added to a deferral model built in memory (e.g. "
        "EncoderForDeferral.from_encoder_pretrained(...)), so the adapter's base_model_name_or_path is None and a "
        "saved adapter folder could never be loaded again. Save the base model first and add the adapter to the "
        "loaded copy: base.save_pretrained('base'); model = get_peft_model(AutoModelForDeferral.from_pretrained("
        f"'base'), lora_config) (the adapter then names 'base'). For a model trained already: {after}."
    )


def check_head_trainable(model: Any) -> None:
    """Checks that the deferral head of a model with adapters trains and is saved with the adapter.

    Raises:
        `ValueError`: the head's parameters are frozen, as adapters leave every module they do not target unless it
            is listed in `modules_to_save`.

    Example:

    ```python
    >>> from hf_defer.inspection import check_head_trainable
    >>> from peft import LoraConfig, get_peft_model
    >>> from transformers import LlamaConfig
    >>> from hf_defer import DeferralConfig, EncoderForDeferral
    >>> llama = LlamaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37,
    ...                     vocab_size=64)
    >>> lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], modules_to_save=["head"])
    >>> check_head_trainable(get_peft_model(EncoderForDeferral(DeferralConfig(encoder=llama, num_labels=3)), lora))
    >>> frozen = LoraConfig(r=4, target_modules=["q_proj", "v_proj"])  # no modules_to_save=["head"]
    >>> check_head_trainable(get_peft_model(EncoderForDeferral(DeferralConfig(encoder=llama, num_labels=3)), frozen))
    Traceback (most recent call last):
        ...
    ValueError: the deferral head of this adapter model is frozen, ...

    ```
    """
    if not has_adapters(model):
        return
    base = model.get_base_model() if is_peft_model(model) else model
    if not any(parameter.requires_grad for parameter in base.head.parameters()):
        raise ValueError(
            "the deferral head of this adapter model is frozen, so it would neither train nor be saved with the "
            "adapter: add modules_to_save=['head'] to the adapter config, e.g. LoraConfig(target_modules=[...], "
            "modules_to_save=['head'])."
        )


__all__ = ["active_adapter", "adapter_base_model", "check_adapter_loadable", "check_head_trainable", "has_adapters",
           "is_peft_model"]
