"""Tokenizers of decoder-only backbones: a padding token for those that have none; special token ids copied into the
config without the Trainer's notice."""

from __future__ import annotations

from typing import Any

from transformers.utils import logging

logger = logging.get_logger(__name__)


def ensure_pad_token(tokenizer: Any, model: Any = None) -> Any:
    """Gives a tokenizer without a padding token its end-of-sequence token as padding token, with a warning, as
    `LlamaForSequenceClassification` users do; and records the padding id in the encoder config of `model`.

    Batches of different lengths need padding; Llama, Qwen2, Gemma and other decoder tokenizers often have no
    padding token. Padding with EOS is harmless for a deferral model: `pooling="last"` (the default for decoder-only
    encoders), `"mean"` and `"max"` read the attention mask, not the token ids. [`DeferralTrainer`] calls this on
    its `processing_class`.

    Args:
        tokenizer (`PreTrainedTokenizerBase`): the tokenizer, changed in place.
        model ([`EncoderForDeferral`] or a `PeftModel` of one, *optional*): its `config.encoder.pad_token_id` is set
            when it is `None`.

    Returns:
        The tokenizer.

    Raises:
        `ValueError`: the tokenizer has neither a padding nor an end-of-sequence token.

    Example:

    ```python
    >>> from tokenizers import Tokenizer, models
    >>> from transformers import PreTrainedTokenizerFast
    >>> tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"hi": 0, "</s>": 1}, "hi")),
    ...                                     eos_token="</s>")
    >>> ensure_pad_token(tokenizer).pad_token
    '</s>'

    ```
    """
    if getattr(tokenizer, "pad_token", None) is None:
        if getattr(tokenizer, "eos_token", None) is None:
            raise ValueError(
                f"the tokenizer ({type(tokenizer).__name__}) has no padding token and no end-of-sequence token to pad "
                "with; set tokenizer.pad_token before training."
            )
        logger.warning(
            f"The tokenizer has no padding token; padding with its end-of-sequence token {tokenizer.eos_token!r} "
            "(the attention mask tells padding from text)."
        )
        tokenizer.pad_token = tokenizer.eos_token
    encoder = getattr(getattr(model, "config", None), "encoder", None)
    if encoder is not None and getattr(encoder, "pad_token_id", None) is None:
        encoder.pad_token_id = tokenizer.pad_token_id
    return tokenizer


__all__ = ["ensure_pad_token"]


def align_special_tokens_quietly(model: Any, tokenizer: Any) -> None:
    """Copies the tokenizer's PAD/BOS/EOS ids into the model's config as `Trainer.__init__` does
    (`transformers.trainer_utils.align_special_tokens`), without the warning it logs on every run: a deferral model
    never generates, so the change is no news. The Trainer's own call then finds nothing to change."""
    from transformers.trainer_utils import align_special_tokens

    quiet = logging.get_logger("transformers.trainer_utils")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        align_special_tokens(model, tokenizer)
    finally:
        quiet.setLevel(level)
