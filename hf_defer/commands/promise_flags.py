"""The flags of a calibration's promises, declared once: `--confidence`, `--max_deferral_rate`, `--max_error`,
`--selective` and `--max_mean_cost` mean the same in `calibrate`, `train` (its calibration on the validation split)
and `serve` (its start-up calibration), with one help text, one type and one parser of the per-expert budget form.

Standard library only (the command line imports it before torch and transformers).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from ..modeling.validators import check_share


def parse_rates(value: str | float | None,
                expert_names: Sequence[str] | None = None) -> float | dict[str, float] | None:
    """`--max_deferral_rate 0.1` (all experts together) or `alice=0.05,bob=0.1` (each expert's own share), each
    share checked in (0, 1]; an expert named twice, or (with ``expert_names``) one the model lacks, is refused.

    Example:

    ```python
    >>> from hf_defer.commands.promise_flags import parse_rates
    >>> parse_rates("alice=0.05,bob=0.1", ["alice", "bob"])
    {'alice': 0.05, 'bob': 0.1}
    >>> parse_rates("0.1")
    0.1

    ```
    """
    if value is None or isinstance(value, (int, float)) and not isinstance(value, bool):
        return None if value is None else check_share(value, "--max_deferral_rate")
    known = ", ".join(expert_names) if expert_names else "the model's experts"
    example = expert_names[0] if expert_names else "alice"
    try:
        if "=" not in value:
            return check_share(float(value), "--max_deferral_rate")
        pairs = [(name.strip(), float(rate)) for name, rate in (item.split("=", 1) for item in value.split(","))]
        rates = dict(pairs)
    except ValueError as error:
        if str(error).startswith("--max_deferral_rate"):  # a number outside (0, 1]
            raise
        rates = None
    if rates is not None and len(rates) != len(pairs):  # a repeated name: which of its budgets was meant?
        twice = sorted({name for name, _ in pairs if [n for n, _ in pairs].count(name) > 1})
        raise ValueError(f"--max_deferral_rate names {', '.join(map(repr, twice))} more than once ({value!r}): give "
                         "each expert one budget.")
    if rates is None or not all(rates) or (expert_names is not None and set(rates) - set(expert_names)):
        raise ValueError(f"--max_deferral_rate must be a share in (0, 1] or expert=share pairs of the model's experts "
                         f"({known}), e.g. {example}=0.1; got {value!r}.")
    return {name: check_share(rate, f"--max_deferral_rate[{name!r}]") for name, rate in rates.items()}


@dataclasses.dataclass(frozen=True)
class PromiseFlag:
    """One flag: its type (what the command line's string becomes), help text and default."""

    type: Callable[[str], Any] | None
    help: str
    default: Any = None

    def add_to(self, parser: argparse.ArgumentParser | Any, name: str) -> None:
        """Declares ``--name`` on an argparse parser (or argument group)."""
        if self.type is None:  # a switch
            parser.add_argument(f"--{name}", action="store_true", help=self.help)
        else:
            parser.add_argument(f"--{name}", type=self.type, default=self.default, help=self.help)

    def field(self) -> Any:
        """The same flag as a field of a `HfArgumentParser` dataclass (`train`'s arguments)."""
        return dataclasses.field(default=self.default, metadata={"help": self.help})


PROMISE_FLAGS: dict[str, PromiseFlag] = {
    "confidence": PromiseFlag(float, "Certify the promises on new inputs with this probability over the draw of the "
                                     "calibration inputs, in (0, 1), e.g. 0.9 (hf_defer.calibrate_deferral; recorded "
                                     "in the config and the model card). Default: none, the empirical budget rule "
                                     "(the budget holds on the calibration inputs)."),
    "max_deferral_rate": PromiseFlag(str, "Deferral budget: a share in (0, 1], or one per expert, "
                                          "'alice=0.05,bob=0.1' (with --confidence); the calibrated threshold is "
                                          "stored in the saved config (calibrate: 0.1 when no other promise is given; "
                                          "train calibrates on the validation split only when it is given)."),
    "max_error": PromiseFlag(float, "System error target on new inputs, with the fewest deferrals (needs --confidence, "
                                    "labels and expert answers)."),
    "selective": PromiseFlag(None, "--max_error is the model's error on the inputs it answers itself.", False),
    "max_mean_cost": PromiseFlag(float, "Budget on the mean price per input (needs --confidence and expert costs)."),
}
"""Each promise's flag, by name (without the dashes)."""

GUARANTEE_KINDS = ("high_probability", "expected")
"""The values of `--guarantee` (``hf_defer.evaluation.guarantees.GUARANTEES``; this module imports no numpy)."""


def parse_guarantee(value: str) -> str:
    """`--guarantee`: one of `GUARANTEE_KINDS`, else an error that lists them."""
    if value not in GUARANTEE_KINDS:
        raise argparse.ArgumentTypeError(f"must be one of {', '.join(GUARANTEE_KINDS)}, got {value!r}")
    return value


CALIBRATE_FLAGS: dict[str, PromiseFlag] = {
    "guarantee": PromiseFlag(parse_guarantee, "The kind of promise: high_probability (default: it holds with "
                                              "probability --confidence over the draw of the calibration inputs) or "
                                              "expected (--max_error alone, no --confidence: the error on new inputs "
                                              "at most the target on average over calibration draws, a refused "
                                              "calibration counting as no error; not a statement about this one "
                                              "calibration). With --unlabeled_file, expected takes from it the most "
                                              "deferral it may use.", "high_probability"),
}
"""The flags of `calibrate` alone (`train` and `serve` make high-probability promises only)."""


def add_promise_flags(parser: argparse.ArgumentParser | Any, names: Sequence[str] = tuple(PROMISE_FLAGS)) -> None:
    """Declares the promises' flags ``names`` (all of `PROMISE_FLAGS` by default; `CALIBRATE_FLAGS` by name) on
    ``parser``."""
    for name in names:
        (PROMISE_FLAGS | CALIBRATE_FLAGS)[name].add_to(parser, name)


__all__ = ["CALIBRATE_FLAGS", "GUARANTEE_KINDS", "PROMISE_FLAGS", "PromiseFlag", "add_promise_flags",
           "parse_guarantee", "parse_rates"]
