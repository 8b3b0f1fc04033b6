"""The tiny random BERT the command-line tests train: a word-level tokenizer over `words` and a one-layer encoder,
saved together in one folder (the `--model_name_or_path` of the runs)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import BertConfig, BertModel, BertTokenizer


def save_tiny_bert(folder: Path, words: Sequence[str], max_positions: int = 32) -> Path:
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]
    BertTokenizer(vocab={w: i for i, w in enumerate(vocab)}).save_pretrained(folder)
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=20, max_position_embeddings=max_positions)).save_pretrained(folder)
    return folder
