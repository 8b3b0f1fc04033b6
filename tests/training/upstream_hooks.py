"""The private parts of `transformers`, `accelerate` and `datasets` that hf_defer relies on, listed in one place.

hf_defer overrides, calls, patches or reads a few names that their libraries do not document as public. Any minor
release may rename or reshape them, and some breakages would not raise: an override that upstream stops calling, or a
patched function upstream no longer looks up, is skipped silently (slower, or wrong). Each [`UpstreamHook`] below says
which upstream object it is, how and where hf_defer uses it, what it stands in for, the parameters hf_defer's code was
written against and the upstream functions that must still reference it. [`check_upstream_hooks`] checks every hook
against the installed versions; `tests/training/test_upstream_hooks.py` runs it on each tested stack (`make test`,
`make test-latest`, `make test-oldest`), and also fails when hf_defer starts using a private upstream name that is not
listed here. A part of the test suite, not of the package (the wheel does not ship it).

Example:

```python
>>> from upstream_hooks import UPSTREAM_HOOKS, check_upstream_hooks
>>> hook = next(h for h in UPSTREAM_HOOKS if h.target.endswith("._get_grad_norm"))
>>> hook.usage, hook.parameters
('override', ('self', 'model', 'grad_norm'))
>>> check_upstream_hooks()  # the problems with the installed versions: none
[]

```
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import types
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

USAGES = ("override", "call", "patch", "read")


@dataclass(frozen=True)
class UpstreamHook:
    """One private upstream name hf_defer depends on.

    Args:
        target (`str`): the dotted path of the upstream object, e.g. `"transformers.Trainer._get_grad_norm"`.
        usage (`str`): `"override"` (hf_defer's subclass replaces it), `"call"`, `"patch"` (hf_defer swaps the
            module attribute for a while) or `"read"` (an attribute or constant hf_defer reads or sets).
        used_in (`str`): where hf_defer does so.
        stands_in_for (`str`): what hf_defer gets from it, and what would go wrong without it.
        parameters (`tuple[str, ...]`, *optional*): the callable's parameter names, in order, as hf_defer's code was
            written against them; `None` for a non-callable.
        referenced_by (`tuple[str, ...]`): upstream functions whose code must still name the hook; for an override
            or a patch, the callers that make it take effect, for an instance attribute, where upstream sets it.
        instance_attribute (`bool`): the last part of `target` is set on instances (only its owner is resolved).
    """

    target: str
    usage: str
    used_in: str
    stands_in_for: str
    parameters: tuple[str, ...] | None = None
    referenced_by: tuple[str, ...] = ()
    instance_attribute: bool = False

    def __post_init__(self) -> None:
        if self.usage not in USAGES:
            raise ValueError(f"usage must be one of {USAGES}, got {self.usage!r}.")

    @property
    def name(self) -> str:
        """The hook's own name: the last part of `target`."""
        return self.target.rsplit(".", 1)[-1]

    @property
    def distribution(self) -> str:
        """The upstream package: the first part of `target`."""
        return self.target.split(".", 1)[0]


def _trainer(method: str) -> str:
    return f"transformers.Trainer.{method}"


_DATALOADER_PARAMETERS = ("self", "dataset", "description", "batch_size", "sampler_fn", "is_training", "dataloader_key")

UPSTREAM_HOOKS: tuple[UpstreamHook, ...] = (
    UpstreamHook(
        _trainer("_get_grad_norm"), "override", "hf_defer.training.trainer.DeferralTrainer._get_grad_norm",
        "skips the norm of all gradients that the Trainer computes at every step only to log it, when nothing is "
        "logged (logging_strategy='no'); without it training is slower, not wrong",
        ("self", "model", "grad_norm"), (_trainer("_run_epoch"),)),
    UpstreamHook(
        _trainer("_get_dataloader"), "call", "hf_defer.training.trainer.DeferralTrainer.get_train_dataloader",
        "builds the head-only fast path's loader with the Trainer's own sampler, batch size and accelerate "
        "preparation, so that it draws the same batches as the plain loader",
        _DATALOADER_PARAMETERS, (_trainer("get_train_dataloader"),)),
    UpstreamHook(
        _trainer("_get_train_sampler"), "call", "hf_defer.training.trainer.DeferralTrainer.get_train_dataloader",
        "the sampler the plain training loader uses (same seed, same order)",
        ("self", "train_dataset"), (_trainer("get_train_dataloader"),)),
    UpstreamHook(
        _trainer("_train_batch_size"), "read", "hf_defer.training.trainer.DeferralTrainer.get_train_dataloader",
        "the per-process training batch size, as auto_find_batch_size may have lowered it",
        referenced_by=(_trainer("__init__"), _trainer("get_train_dataloader")), instance_attribute=True),
    UpstreamHook(
        _trainer("_get_collator_with_removed_columns"), "override",
        "hf_defer.training.trainer.DeferralTrainer._get_collator_with_removed_columns",
        "keeps the fast path's pass-through collate function unwrapped (the Trainer would rebuild every row as a "
        "dict); without the call the fast path breaks",
        ("self", "data_collator", "description"), (_trainer("_get_dataloader"),)),
    UpstreamHook(
        _trainer("_load_from_checkpoint"), "override",
        "hf_defer.training.trainer.DeferralTrainer._load_from_checkpoint",
        "resumes the adapters that add_adapter gave a model (the Trainer resumes those of a PeftModel only); "
        "without the call a resumed add_adapter run would start from untrained adapters",
        ("self", "resume_from_checkpoint", "model"), (_trainer("train"),)),
    UpstreamHook(
        _trainer("save_model"), "override", "hf_defer.training.trainer.DeferralTrainer.save_model",
        "its private `_internal_call` parameter tells a user's save (which writes the deferral card) from a "
        "checkpoint",
        ("self", "output_dir", "_internal_call"), (_trainer("_save_checkpoint"),)),
    UpstreamHook(
        _trainer("loss_is_scaled_for_ga"), "read", "hf_defer.training.trainer.DeferralTrainer.loss_is_scaled_for_ga",
        "tells the Trainer that the model's loss is a batch mean, to be divided by the accumulation steps; if the "
        "Trainer stopped reading it, accumulated losses would be scaled wrongly",
        referenced_by=(_trainer("training_step"),)),
    UpstreamHook(
        "accelerate.optimizer.is_lomo_available", "patch", "hf_defer.training.trainer._lomo_probe_once",
        "asked twice per optimizer step (an importlib find_spec); patched to a constant for the run. If "
        "AcceleratedOptimizer.step stopped looking it up here, the patch would do nothing (slower, not wrong)",
        (), ("accelerate.optimizer.AcceleratedOptimizer.step",)),
    UpstreamHook(
        "transformers.integrations.peft.PeftAdapterMixin._hf_peft_config_loaded", "read",
        "hf_defer.inspection.adapters.has_adapters",
        "whether add_adapter/load_adapter gave the model adapters (it then saves adapters only, in peft's format)",
        referenced_by=("transformers.integrations.peft.PeftAdapterMixin.add_adapter",)),
    UpstreamHook(
        "transformers.integrations.peft.PeftAdapterMixin.add_adapter", "override",
        "hf_defer.modeling.saving_deferral.DeferralSavingMixin.add_adapter",
        "refuses add_adapter with both versions and the alternative when the installed peft is too old for it, "
        "then calls it", ("self", "adapter_config", "adapter_name")),
    UpstreamHook(
        "transformers.utils.import_utils.is_peft_greater_or_equal", "call",
        "hf_defer.modeling.saving_deferral.DeferralSavingMixin.add_adapter",
        "compares the installed peft with MIN_PEFT_VERSION, as transformers itself does",
        ("library_version", "accept_dev")),
    UpstreamHook(
        "transformers.integrations.peft.MIN_PEFT_VERSION", "read",
        "hf_defer.modeling.saving_deferral.DeferralSavingMixin.add_adapter",
        "the peft version transformers' add_adapter demands; add_adapter is refused with both versions and "
        "peft.get_peft_model as the alternative when the installed peft is older",
        referenced_by=("transformers.integrations.peft.PeftAdapterMixin.add_adapter",)),
    UpstreamHook(
        "transformers.PreTrainedModel._auto_class", "read",
        "hf_defer.modeling.saving_deferral (save_pretrained of a model sharded with FSDP2)",
        "the class attribute that makes save_pretrained copy a model's code files and write its auto_map (read by "
        "is_remote_code, which save_pretrained calls); set to None on FSDP2's wrapper class for the save, where "
        "hf_defer writes its own code files and auto_map (otherwise transformers copies torch's _fsdp_*.py files and "
        "names FSDPEncoderForDeferral)",
        referenced_by=("transformers.PreTrainedModel.is_remote_code",)),
    UpstreamHook(
        "transformers.PreTrainedModel._from_config", "call", "hf_defer.hub.auto.AutoModelForDeferral.from_config",
        "builds a freshly initialised model from a config, with dtype and attention options, as AutoModel does",
        ("config", "kwargs")),
    UpstreamHook(
        "transformers.Pipeline._sanitize_parameters", "override",
        "hf_defer.modeling.pipeline_deferral.DeferralPipeline._sanitize_parameters",
        "sorts the options of pipeline(...) and of each call into preprocessing, forward and decision options (the "
        "custom-pipeline protocol: transformers documents it, though the name is private)",
        ("self", "pipeline_parameters"), ("transformers.Pipeline.__init__", "transformers.Pipeline.__call__")),
    UpstreamHook(
        "transformers.Pipeline._forward", "override", "hf_defer.modeling.pipeline_deferral.DeferralPipeline._forward",
        "runs the deferral model on a preprocessed batch (the custom-pipeline protocol)",
        ("self", "input_tensors", "forward_parameters"), ("transformers.Pipeline.forward",)),
    UpstreamHook(
        "transformers.Pipeline._preprocess_params", "read",
        "hf_defer.modeling.pipeline_deferral.DeferralPipeline (processor options)",
        "the preprocessing options given when the pipeline was built, merged with those of each call",
        referenced_by=("transformers.Pipeline.__init__",), instance_attribute=True),
    UpstreamHook(
        "transformers.Pipeline._postprocess_params", "read",
        "hf_defer.modeling.pipeline_deferral.DeferralPipeline and hf_defer.evaluation.thresholds.calibrate_deferral",
        "the decision options (costs, threshold) the pipeline was built with; calibration drops them to score raw",
        referenced_by=("transformers.Pipeline.__init__",), instance_attribute=True),
    UpstreamHook(
        "transformers.Pipeline._batch_size", "read", "hf_defer.modeling.pipeline_deferral.DeferralPipeline",
        "the batch size given when the pipeline was built (pipeline(..., batch_size=n))",
        referenced_by=("transformers.Pipeline.__init__",), instance_attribute=True),
    UpstreamHook(
        "transformers.HfArgumentParser._add_dataclass_arguments", "override",
        "hf_defer.commands.arguments.RunArgumentParser._add_dataclass_arguments",
        "adds a dataclass's flags to the parser; overridden to put them in --help groups (model, data, deferral, "
        "training)", ("self", "dtype"), ("transformers.HfArgumentParser.__init__",)),
    UpstreamHook(
        "transformers.HfArgumentParser._parse_dataclass_field", "call",
        "hf_defer.commands.arguments.RunArgumentParser._add_dataclass_arguments",
        "turns one dataclass field into an argparse option, as the plain parser does",
        ("parser", "field")),
    UpstreamHook(
        "transformers.PreTrainedConfig._attn_implementation", "read",
        "hf_defer.modeling.configuration_deferral.DeferralConfig.__post_init__",
        "the encoder's attention implementation, kept when the base class rebuilds the encoder's sub-config"),
    UpstreamHook(
        "transformers.PreTrainedConfig._name_or_path", "read",
        "hf_defer.evaluation.thresholds and hf_defer.review.pushing",
        "the folder or Hub id a config was loaded from (read with a fallback: a model built in memory has none)",
        referenced_by=("transformers.PreTrainedConfig.__post_init__",), instance_attribute=True),
    UpstreamHook(
        "datasets.Dataset._fingerprint", "read", "hf_defer.experts.model_experts (the cache key of a model expert's "
        "answers)", "identifies the dataset's content, so cached answers are reused only for the same rows",
        referenced_by=("datasets.Dataset.__init__",), instance_attribute=True),
    UpstreamHook(
        "datasets.Dataset._indices", "read", "hf_defer.data.checks (column checks)",
        "the row mapping of a selected, shuffled or split dataset, taken in one vectorised step; a dataset without "
        "it is read as stored",
        referenced_by=("datasets.Dataset.__init__",), instance_attribute=True),
    # argparse (the standard library): the flag checks read the parser's tables instead of parsing twice.
    UpstreamHook(
        "argparse.HelpFormatter._format_text", "override", "hf_defer.commands.flags.PlainHelpFormatter._format_text",
        "formats a parser's description and epilog; overridden to strip docstring markup from --help",
        ("self", "text"), ("argparse.HelpFormatter.add_text",)),
    UpstreamHook(
        "argparse.HelpFormatter._expand_help", "override", "hf_defer.commands.flags.PlainHelpFormatter._expand_help",
        "expands one flag's help (its %(default)s); overridden to strip docstring markup from --help",
        ("self", "action"), ("argparse.HelpFormatter._format_action",)),
    UpstreamHook(
        "argparse.ArgumentParser._actions", "read", "hf_defer.commands.flags, arguments and cli",
        "every flag of a parser (its dest and option strings): the names a mistyped flag is matched against",
        referenced_by=("argparse._ActionsContainer.__init__",), instance_attribute=True),
    UpstreamHook(
        "argparse.ArgumentParser._option_string_actions", "read", "hf_defer.commands.arguments, cli and flags",
        "the flag strings a parser knows (and the field each sets), read before parsing so that an unknown flag is "
        "reported first, and saved after the first parse of `hf-defer train` so that later runs answer before torch",
        referenced_by=("argparse._ActionsContainer.__init__",), instance_attribute=True),
    UpstreamHook(
        "argparse.ArgumentParser._action_groups", "read", "hf_defer.commands.flags",
        "the --help groups, so that --help shows the essential group alone and --help-all every group",
        referenced_by=("argparse._ActionsContainer.__init__",), instance_attribute=True),
    UpstreamHook(
        "argparse.ArgumentParser._mutually_exclusive_groups", "read", "hf_defer.commands.flags",
        "the parser's exclusive groups, which the short --help formats with the essential flags",
        referenced_by=("argparse._ActionsContainer.__init__",), instance_attribute=True),
    UpstreamHook(
        "argparse._ArgumentGroup._group_actions", "read", "hf_defer.commands.flags",
        "the flags of one --help group, to list the essential ones first in the short --help",
        referenced_by=("argparse._ArgumentGroup.__init__",), instance_attribute=True),
    UpstreamHook(
        "argparse.ArgumentParser._get_formatter", "call", "hf_defer.commands.flags",
        "the parser's help formatter, used to write the short --help as argparse writes the long one",
        ("self",)),
    UpstreamHook(
        "argparse.ArgumentParser._print_message", "call", "hf_defer.commands.arguments.RunArgumentParser",
        "writes --help or --help-all to the stream argparse itself would use", ("self", "message", "file")),
    UpstreamHook(
        "argparse._SubParsersAction", "read", "hf_defer.commands.cli",
        "the sub-command action of the hf-defer parser, whose choices hold each sub-command's own parser"),
)
"""Every private upstream name hf_defer uses. Add an entry when using a new one (the test says which are missing)."""


def resolve(target: str) -> Any:
    """The object a dotted path names: the longest importable module prefix, then attributes.

    Raises:
        `AttributeError` or `ImportError`: some part of the path is gone.
    """
    parts = target.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            obj = getattr(obj, attribute)
        return obj
    raise ImportError(f"no module of {target!r} can be imported.")


def code_names(function: Any) -> set[str]:
    """The global and attribute names `function`'s code uses, nested functions and comprehensions included."""
    function = inspect.unwrap(getattr(function, "__func__", function))
    code = getattr(function, "__code__", None)
    if code is None:
        return set()
    names: set[str] = set()
    stack = [code]
    while stack:
        current = stack.pop()
        names.update(current.co_names)
        stack.extend(const for const in current.co_consts if isinstance(const, types.CodeType))
    return names


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


def check_hook(hook: UpstreamHook) -> list[str]:
    """What no longer holds of `hook` with the installed versions: an empty list when it is as expected."""
    where = f"{hook.distribution} {_version(hook.distribution)}"
    fix = (f"hf_defer uses it in {hook.used_in} ({hook.usage}): it {hook.stands_in_for}. Update that code and this "
           f"entry of tests/training/upstream_hooks.py together.")
    owner_path = hook.target.rsplit(".", 1)[0] if hook.instance_attribute else hook.target
    try:
        obj = resolve(owner_path)
    except (ImportError, AttributeError) as error:
        return [f"{owner_path} is gone in {where} ({error}). {fix}"]
    problems = []
    if hook.parameters is not None:
        try:
            found = tuple(inspect.signature(obj).parameters)
        except (TypeError, ValueError) as error:
            found = (f"<not callable: {error}>",)
        if found != hook.parameters:
            problems.append(f"{hook.target} changed its signature in {where}: expected the parameters "
                            f"{hook.parameters}, found {found}. {fix}")
    for caller in hook.referenced_by:
        try:
            names = code_names(resolve(caller))
        except (ImportError, AttributeError) as error:
            problems.append(f"{caller}, which must reference {hook.target}, is gone in {where} ({error}). {fix}")
            continue
        if hook.name not in names:
            problems.append(f"{caller} no longer references {hook.name} in {where}, so hf_defer's {hook.usage} of "
                            f"{hook.target} would be skipped silently. {fix}")
    return problems


def check_upstream_hooks(hooks: Iterable[UpstreamHook] = UPSTREAM_HOOKS) -> list[str]:
    """Checks each hook against the installed upstream versions; returns the problems found (none: `[]`)."""
    return [problem for hook in hooks for problem in check_hook(hook)]


__all__ = ["UPSTREAM_HOOKS", "UpstreamHook", "check_hook", "check_upstream_hooks", "code_names", "resolve"]
