"""A router with side features behind `hf-defer serve`: the side features come from the request's metadata (strings,
as OpenAI's metadata holds them), and the decisions match the model's forward pass on the same text and features."""

from __future__ import annotations

import openai
import pytest
import torch
from transformers import BertTokenizer

from fake_upstream import UpstreamBehaviour, answer_text, fake_upstream_app, serve_in_thread
from hf_defer import EncoderForDeferral
from hf_defer.modeling.side_features import side_feature_tensors
from hf_defer.serving import PromptRouter, build_router_app
from hf_defer.serving.routing import load_router_pipeline
from hf_defer.serving.upstream import parse_upstreams
from tiny_bert import save_tiny_bert

WORDS = "prove the theorem name a city add two numbers".split()
SPECS = [{"name": "tier", "kind": "categorical", "categories": ["free", "pro"], "dim": 2},
         {"name": "length", "kind": "numeric", "mean": 50.0, "std": 20.0}]
REQUESTS = [(text, tier, length) for text in ("prove the theorem", "name a city", "add two numbers")
            for tier in ("free", "pro", "team") for length in (10, 90)]


@pytest.fixture(scope="module")
def router_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("side_router")
    save_tiny_bert(root / "enc", WORDS)
    torch.manual_seed(2)
    model = EncoderForDeferral.from_encoder_pretrained(str(root / "enc"), route_only=True, num_experts=2,
                                                       expert_names=["weak", "strong"], pooling="mean",
                                                       side_features=SPECS)
    with torch.no_grad():
        model.head[-1].weight.mul_(10)
    model.save_pretrained(root / "router")
    BertTokenizer.from_pretrained(root / "enc").save_pretrained(root / "router")
    # a price on the weak model that sends about half of the requests to the strong one, between two margins
    gains = sorted(margins(root / "router"))
    middle = len(gains) // 2
    model.config.expert_costs = [-(gains[middle - 1] + gains[middle]) / 2, 0.0]
    assert model.config.expert_costs[0] >= 0 and gains[middle] - gains[middle - 1] > 1e-4
    model.save_pretrained(root / "router", overwrite=True)
    return root / "router"


def margins(folder) -> list[float]:
    """a_strong - a_weak from the model's forward pass, for each request's text and side features."""
    model = EncoderForDeferral.from_pretrained(folder).eval()
    tokenizer = BertTokenizer.from_pretrained(folder)
    out = []
    with torch.no_grad():
        for text, tier, length in REQUESTS:
            ids, numbers = side_feature_tensors(SPECS, [{"tier": tier, "length": length}])
            a = torch.sigmoid(model(**tokenizer(text, return_tensors="pt"), side_categorical=ids,
                                    side_numeric=numbers).logits[0].double())
            out.append(float(a[1] - a[0]))
    return out


def expected_models(folder) -> list[str]:
    """strong iff a_strong - a_weak + c_weak > 0 (the saved threshold), the route-only rule worked out here."""
    price = EncoderForDeferral.from_pretrained(folder).config.expert_costs[0]
    return ["strong" if gain + price > 0 else "weak" for gain in margins(folder)]


def test_side_features_come_from_the_metadata(router_folder):
    expected = expected_models(router_folder)
    assert 0 < expected.count("strong") < len(expected)
    behaviours = {name: UpstreamBehaviour(name) for name in ("weak", "strong")}
    router = PromptRouter(load_router_pipeline(str(router_folder)))
    with serve_in_thread(fake_upstream_app(behaviours["weak"])) as weak, \
            serve_in_thread(fake_upstream_app(behaviours["strong"])) as strong:
        upstreams = parse_upstreams(["weak", "strong"], {"weak": weak + "/v1", "strong": strong + "/v1"})
        with serve_in_thread(build_router_app(router, upstreams)) as url:
            chat = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
            got = []
            for text, tier, length in REQUESTS:
                completion = chat.chat.completions.create(
                    model="hf-defer-router", messages=[{"role": "user", "content": text}],
                    metadata={"tier": tier, "length": str(length), "user": "someone"})
                assert completion.choices[0].message.content == answer_text(completion.hf_defer["model"], text)
                got.append(completion.hf_defer["model"])
            with pytest.raises(openai.BadRequestError, match=r"needs the side feature\(s\) \['length'\]"):
                chat.chat.completions.create(model="hf-defer-router", metadata={"tier": "pro"},
                                             messages=[{"role": "user", "content": "name a city"}])
            with pytest.raises(openai.BadRequestError, match="'length' of input 0: the model reads 'length' as a "
                                                             "number, got 'long'"):
                chat.chat.completions.create(model="hf-defer-router", metadata={"tier": "pro", "length": "long"},
                                             messages=[{"role": "user", "content": "name a city"}])
            for metadata, kind in (({"tier": ["pro"], "length": "10"}, "list"), ({"tier": {"a": 1}, "length": "10"},
                                                                                 "dict"),
                                   ({"tier": "pro", "length": [10]}, "list"), ({"tier": "pro", "length": ""}, None)):
                with pytest.raises(openai.BadRequestError) as refused:  # never routed on the value's string
                    chat.chat.completions.create(model="hf-defer-router", metadata=metadata,
                                                 messages=[{"role": "user", "content": "name a city"}])
                error = refused.value.body
                assert error["type"] == "invalid_request_error", error
                # a list or dict is refused by the request check (OpenAI's metadata holds strings), before any
                # side feature is read; a blank value by the side features' one rule of "missing"
                name = "tier" if metadata["tier"] != "pro" else "length"
                assert (f"metadata[{name!r}] must be a string (or a number), got {kind}." if kind else
                        "is missing from input 0") in error["message"], error
            with pytest.raises(openai.BadRequestError, match="give them in the request's metadata"):
                chat.chat.completions.create(model="hf-defer-router",
                                             messages=[{"role": "user", "content": "name a city"}])
    assert got == expected
