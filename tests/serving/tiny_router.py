"""The tiny text router of the serving tests: a route-only model on a one-layer random BERT (experts `weak`, the
default, and `strong`), and the margins a_strong - a_weak of its own forward pass."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import BertTokenizer

from hf_defer import EncoderForDeferral
from tiny_bert import save_tiny_bert

WORDS = "add two numbers prove theorem integrate limit name capital city translate word the of a".split()
PROMPTS = [" ".join(WORDS[(7 * i + k) % len(WORDS)] for k in range(1 + i % 5)) for i in range(24)]


def margins_by_forward(folder: Path, prompts: list[str]) -> list[float]:
    """a_strong - a_weak from the saved model's forward pass, one prompt at a time."""
    model = EncoderForDeferral.from_pretrained(folder).eval()
    tokenizer = BertTokenizer.from_pretrained(folder)
    strong, weak = model.config.expert_names.index("strong"), model.config.expert_names.index("weak")
    out = []
    with torch.no_grad():
        for prompt in prompts:
            accuracy = torch.sigmoid(model(**tokenizer(prompt, return_tensors="pt")).logits[0].double())
            out.append(float(accuracy[strong] - accuracy[weak]))
    return out


def save_tiny_router(root: Path) -> Path:
    """A tiny text route-only model (experts weak, the default, and strong) with a threshold between two margins of
    PROMPTS, far from both, so that about half of them go to strong."""
    save_tiny_bert(root / "encoder", WORDS)
    torch.manual_seed(1)
    model = EncoderForDeferral.from_encoder_pretrained(str(root / "encoder"), route_only=True, num_experts=2,
                                                       expert_names=["weak", "strong"], default_expert="weak",
                                                       pooling="mean")
    with torch.no_grad():
        model.head[-1].weight.mul_(20)  # spread the margins
    model.save_pretrained(root / "router")
    BertTokenizer.from_pretrained(root / "encoder").save_pretrained(root / "router")
    margins = sorted(margins_by_forward(root / "router", PROMPTS))
    gaps = [(margins[i + 1] - margins[i], i) for i in range(len(margins) // 3, 2 * len(margins) // 3)]
    width, i = max(gaps)
    assert width > 1e-4, "the tiny router's margins are too close to set a threshold between them"
    model.config.defer_threshold = (margins[i] + margins[i + 1]) / 2
    model.save_pretrained(root / "router", overwrite=True)
    return root / "router"
