"""The router's decisions on prompts, as a server needs them: [`PromptRouter`] batches the prompts of concurrent
requests into one forward pass of the route-only model and caps the share of calls to the costly models."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from ..modeling.surrogate_routing import is_route_only

__all__ = ["PromptRouter", "RoutingDecision", "load_router_pipeline"]


class RoutingDecision(NamedTuple):
    """Where one prompt goes.

    Attributes:
        model (`str`): the expert (upstream model) that gets the request.
        wanted (`str`): the expert the router picked; differs from `model` when the strong-call cap sent it to the
            default model instead.
        deferred (`bool`): `model` is not the default (cheap) one: a strong-model call.
        margin (`float`): the router's margin `max_{j != d} (a_j - c_j) - (a_d - c_d)`, compared with the threshold.
        ranking (`tuple[str, ...]`): every expert, best estimated gain `a_j - c_j` first (the order of a fall-back).
        seconds (`float`): time from the request's arrival at the router to its decision (queueing and the forward).
        output (`dict`, *optional*): the route-only pipeline's output for the prompt, before the cap (`defer`,
            `expert`, `estimated_accuracy`, `expert_scores`, `margin`): what the server's monitor is fed.

    Example:

    ```python
    >>> from hf_defer.serving import RoutingDecision
    >>> decision = RoutingDecision(model="cheap", wanted="strong", deferred=False, margin=0.31,
    ...                            ranking=("strong", "cheap"), seconds=0.004)  # the cap kept it on the cheap model
    >>> decision.wanted != decision.model, decision.ranking[0]
    (True, 'strong')

    ```
    """

    model: str
    wanted: str
    deferred: bool
    margin: float
    ranking: tuple[str, ...]
    seconds: float
    output: Mapping[str, Any] | None = None


def load_router_pipeline(router: str, encoder: str | None = None, backend: str = "torch") -> Any:
    """The deferral pipeline of a saved route-only model; a head-only router (trained on sentence embeddings) is put
    on its sentence encoder `encoder` first, so that it reads text. `backend="onnx"`: `router` is a folder of
    `hf-defer export --onnx` (a head-only router exported with `--encoder`), run by ONNX Runtime.

    Example:

    ```python
    >>> from hf_defer.serving.routing import load_router_pipeline
    >>> load_router_pipeline("no/such/folder")  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    OSError: --router 'no/such/folder': ...

    ```
    """
    import hf_defer  # noqa: F401  (registers the deferral model type and task)
    from transformers import AutoConfig, AutoTokenizer, pipeline

    try:
        config = AutoConfig.from_pretrained(router)
    except (OSError, ValueError) as error:
        raise OSError(f"--router {router!r}: not a saved deferral model folder or Hub id ({error}).") from None
    if not is_route_only(config):
        raise ValueError(f"--router {router!r} must be a route-only deferral model (trained with `hf-defer train "
                         f"--route_only`), got model_type={getattr(config, 'model_type', None)!r}, "
                         f"route_only={getattr(config, 'route_only', None)!r}.")
    if backend == "onnx":
        if encoder is not None or config.encoder is None:
            raise ValueError(f"--backend onnx: --router {router!r} must be an exported router that reads text; put a "
                             "head-only router on its sentence encoder when exporting it (hf-defer export --onnx "
                             "--encoder ENCODER ROUTER OUT) and serve OUT without --encoder.")
        from ..onnx import onnx_pipeline, require_onnx

        require_onnx()
        return onnx_pipeline(router)
    if config.encoder is not None:
        if encoder is not None:
            raise ValueError(f"--encoder {encoder!r} is for a head-only router; --router {router!r} has its own "
                             "encoder.")
        return pipeline("deferral", model=router)
    if encoder is None:
        raise ValueError(f"--router {router!r} is a head-only model (it reads feature vectors): give --encoder, the "
                         "sentence encoder it was trained on (e.g. sentence-transformers/all-MiniLM-L6-v2).")
    from ..experts.embeddings import head_on_sentence_encoder
    from ..modeling.modeling_deferral import EncoderForRouting

    text_model = head_on_sentence_encoder(EncoderForRouting.from_pretrained(router), encoder).eval()
    return pipeline("deferral", model=text_model, tokenizer=AutoTokenizer.from_pretrained(encoder))


class _Pending(NamedTuple):
    prompt: Any  # the text, or {"text": ..., side features...}
    future: asyncio.Future
    arrived: float


class PromptRouter:
    r"""Routes prompts with a route-only deferral pipeline, for a server under concurrent load.

    Each prompt goes to ``argmax_j (a_j - c_j)`` when the margin over the default expert ``d`` exceeds the threshold
    (the calibrated ``config.defer_threshold`` unless `defer_threshold` is given), else to ``d``: the pipeline's rule.
    Prompts that arrive together are decided in one forward pass (up to `max_batch_size`, waiting at most
    `max_wait_ms` for more), off the event loop.

    With `max_strong_rate` = ``r``, a hard cap on top of the threshold: of the first ``n`` routed prompts at most
    ``floor(r n)`` go to a model other than the default one; a prompt the router would send there beyond that goes to
    the default model (`RoutingDecision.wanted` keeps the router's pick). Calibrating the threshold to the same budget
    (`calibrate_deferral`) makes the cap a guard that rarely acts; without it the cap alone holds the budget.

    Args:
        pipeline ([`DeferralPipeline`]): of a route-only model that reads text (see [`load_router_pipeline`]).
        defer_threshold (`float`, *optional*): the margin; defaults to the model's calibrated one.
        max_strong_rate (`float`, *optional*): the cap, in [0, 1]; none when `None`.
        max_batch_size (`int`, *optional*, defaults to 32): prompts per forward pass.
        max_wait_ms (`float`, *optional*, defaults to 2.0): how long the first prompt of a batch waits for others.
        max_length (`int`, *optional*, defaults to 512): prompts are truncated to this many tokens.

    Example:

    ```python
    >>> import asyncio
    >>> from hf_defer.serving import PromptRouter
    >>> from hf_defer.serving.routing import load_router_pipeline
    >>> def route(router, prompts):  # in a server, `await router.route(prompt)` inside a request
    ...     async def all_of_them():
    ...         async with router:
    ...             return await asyncio.gather(*(router.route(p) for p in prompts))
    ...     return asyncio.run(all_of_them())
    >>> # route(PromptRouter(load_router_pipeline("my-router")), ["2 + 2?", "Prove Fermat's last theorem."])

    ```
    """

    def __init__(self, pipeline: Any, *, defer_threshold: float | None = None, max_strong_rate: float | None = None,
                 max_batch_size: int = 32, max_wait_ms: float = 2.0, max_length: int = 512) -> None:
        config = pipeline.model.config
        if not is_route_only(config) or pipeline.input_kind != "text":
            raise ValueError("PromptRouter needs the pipeline of a route-only model that reads text, got "
                             f"route_only={getattr(config, 'route_only', None)!r}, input kind {pipeline.input_kind!r}.")
        if max_strong_rate is not None and (isinstance(max_strong_rate, bool) or not 0 <= max_strong_rate <= 1):
            raise ValueError(f"max_strong_rate must be a number in [0, 1], got {max_strong_rate!r}.")
        for name, value in (("max_batch_size", max_batch_size), ("max_length", max_length)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}.")
        if not max_wait_ms >= 0:
            raise ValueError(f"max_wait_ms must be >= 0, got {max_wait_ms!r}.")
        self.pipeline = pipeline
        self.expert_names: list[str] = list(config.expert_names)
        self.default_expert: str = config.default_expert
        self.costs = [float(c) for c in (config.expert_costs or [0.0] * len(self.expert_names))]
        self.defer_threshold = float(config.defer_threshold if defer_threshold is None else defer_threshold)
        self.max_strong_rate = max_strong_rate
        self.max_batch_size, self.max_wait_s, self.max_length = max_batch_size, max_wait_ms / 1000, max_length
        self.routed = 0
        self.strong = 0
        self._queue: asyncio.Queue[_Pending] | None = None
        self._worker: asyncio.Task | None = None

    # ------------------------------------------------------------------ synchronous decisions
    @property
    def side_features(self) -> list[str]:
        """The names of the router's side features (`config.side_features`): each request must give them."""
        return [spec["name"] for spec in getattr(self.pipeline.model.config, "side_features", None) or []]

    def decide(self, prompts: Sequence[Any]) -> list[dict[str, Any]]:
        """The pipeline's outputs (with `margin`) for `prompts` (texts, or dicts with the text and the side
        features), at the router's threshold, without the cap."""
        return self.pipeline(list(prompts), batch_size=min(len(prompts), self.max_batch_size),
                             defer_threshold=self.defer_threshold, return_margin=True, truncation=True,
                             max_length=self.max_length)

    def _ranking(self, output: Mapping[str, Any]) -> tuple[str, ...]:
        gains = [a - c for a, c in zip(output["expert_accuracy"], self.costs)]
        order = sorted(range(len(gains)), key=lambda j: -gains[j])
        return tuple(self.expert_names[j] for j in order)

    def _apply_cap(self, output: Mapping[str, Any], arrived: float) -> RoutingDecision:
        """The decision for one output, in arrival order: counts it and applies the strong-call cap."""
        wanted = output["expert"]
        model = wanted
        self.routed += 1
        if wanted != self.default_expert:
            if self.max_strong_rate is not None and self.strong + 1 > math.floor(self.max_strong_rate * self.routed
                                                                                 + 1e-9):
                model = self.default_expert
            else:
                self.strong += 1
        return RoutingDecision(model, wanted, model != self.default_expert, float(output["margin"]),
                               self._ranking(output), time.perf_counter() - arrived, output)

    # ------------------------------------------------------------------ asynchronous, batched
    async def __aenter__(self) -> PromptRouter:
        self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    def start(self) -> None:
        """Starts the batching task on the running event loop (a server's startup)."""
        if self._worker is None:
            self._queue = asyncio.Queue()
            self._worker = asyncio.get_running_loop().create_task(self._work())

    async def stop(self) -> None:
        """Stops the batching task (a server's shutdown); prompts still waiting get `asyncio.CancelledError`."""
        if self._worker is not None:
            self._worker.cancel()
            try:
                await self._worker
            except asyncio.CancelledError:
                pass
            while self._queue is not None and not self._queue.empty():
                self._queue.get_nowait().future.cancel()
            self._worker = self._queue = None

    async def route(self, prompt: str, side_features: dict[str, Any] | None = None) -> RoutingDecision:
        """Where `prompt` goes; concurrent calls share forward passes. Needs [`start`] (or `async with router`).
        A router with side features needs each of them in `side_features` (name -> value; a `ValueError` names a
        missing one); other names are ignored."""
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError(f"the prompt to route must be a non-empty string, got {prompt!r:.60}.")
        if self.side_features:
            given = dict(side_features or {})
            missing = [name for name in self.side_features if name not in given]
            if missing:
                raise ValueError(f"this router needs the side feature(s) {missing} of each request, in its metadata "
                                 f"(e.g. metadata={{{missing[0]!r}: ...}}); got {sorted(given)}.")
            item: Any = {"text": prompt, **{name: given[name] for name in self.side_features}}
            from ..modeling.side_features import side_feature_tensors

            side_feature_tensors(self.pipeline.model.config.side_features, [item])  # a bad value fails this request only
            prompt = item
        if self._queue is None:
            raise RuntimeError("PromptRouter.route needs the router started: `async with router:` or start().")
        future = asyncio.get_running_loop().create_future()
        await self._queue.put(_Pending(prompt, future, time.perf_counter()))
        return await future

    async def _work(self) -> None:
        assert self._queue is not None
        while True:
            batch = [await self._queue.get()]
            deadline = time.perf_counter() + self.max_wait_s
            while len(batch) < self.max_batch_size:
                if self._queue.empty():
                    left = deadline - time.perf_counter()
                    if left <= 0:
                        break
                    try:
                        batch.append(await asyncio.wait_for(self._queue.get(), left))
                    except asyncio.TimeoutError:
                        break
                else:
                    batch.append(self._queue.get_nowait())
            batch = [item for item in batch if not item.future.cancelled()]
            if not batch:
                continue
            try:
                outputs = await asyncio.to_thread(self.decide, [item.prompt for item in batch])
            except Exception as error:  # noqa: BLE001  (each waiting request gets the error)
                for item in batch:
                    if not item.future.done():
                        item.future.set_exception(error)
                continue
            for item, output in zip(batch, outputs):
                if not item.future.done():
                    item.future.set_result(self._apply_cap(output, item.arrived))
