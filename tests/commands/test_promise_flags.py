"""The promises' flags are declared once: `calibrate`, `train` and `serve` give each the same help and type, and the
per-expert budget goes through one parser (which refuses a name given twice)."""

from __future__ import annotations

import argparse

import pytest

from hf_defer.commands.cli import build_parser
from hf_defer.commands.promise_flags import PROMISE_FLAGS, parse_rates
from hf_defer.commands.serve import build_serve_parser


def action(parser: argparse.ArgumentParser, flag: str) -> argparse.Action:
    return next(action for action in parser._actions if flag in action.option_strings)


def calibrate_parser() -> argparse.ArgumentParser:
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return commands.choices["calibrate"]


@pytest.mark.parametrize("name", sorted(PROMISE_FLAGS))
def test_calibrate_and_train_declare_each_promise_the_same_way(name):
    from hf_defer.commands.arguments import build_run_parser

    flag = f"--{name}"
    ours, train = action(calibrate_parser(), flag), action(build_run_parser(prog="t"), flag)
    assert ours.help == train.help == PROMISE_FLAGS[name].help
    assert ours.default == train.default == PROMISE_FLAGS[name].default
    if PROMISE_FLAGS[name].type is not None:
        assert ours.type is train.type is PROMISE_FLAGS[name].type


def test_serve_declares_confidence_as_calibrate_does():
    ours, served = action(calibrate_parser(), "--confidence"), action(build_serve_parser(), "--confidence")
    assert (served.help, served.type, served.default) == (ours.help, ours.type, ours.default)


def test_one_parser_of_the_budget():
    assert parse_rates("0.25") == 0.25 and parse_rates(0.25) == 0.25 and parse_rates(None) is None
    assert parse_rates("alice=0.05, bob=0.1", ["alice", "bob"]) == {"alice": 0.05, "bob": 0.1}
    assert parse_rates("alice=0.05") == {"alice": 0.05}  # names checked where the model's are known
    with pytest.raises(ValueError, match=r"--max_deferral_rate names 'alice' more than once"):
        parse_rates("alice=0.1,alice=0.5")
    with pytest.raises(ValueError, match=r"--max_deferral_rate must lie in \(0, 1\], got 2.0"):
        parse_rates("2")
    with pytest.raises(ValueError, match=r"--max_deferral_rate\['bob'\] must lie in \(0, 1\], got 0.0"):
        parse_rates("alice=0.5,bob=0", ["alice", "bob"])
    with pytest.raises(ValueError, match=r"expert=share pairs of the model's experts \(alice, bob\), e.g. alice=0.1; "
                                         r"got 'carol=0.1'"):
        parse_rates("carol=0.1", ["alice", "bob"])
    with pytest.raises(ValueError, match="got 'alice=lots'"):
        parse_rates("alice=lots")


def test_train_reads_a_budget_per_expert_as_calibrate_does(tmp_path):
    from hf_defer.commands.arguments import DataTrainingArguments

    args = DataTrainingArguments(train_file=str(tmp_path / "t.csv"), expert_column_names="alice,bob",
                                 max_deferral_rate="alice=0.05,bob=0.1")
    assert args.max_deferral_rate == {"alice": 0.05, "bob": 0.1}
    assert DataTrainingArguments(train_file="t.csv", expert_column_names="alice",
                                 max_deferral_rate="0.2").max_deferral_rate == 0.2
    with pytest.raises(ValueError, match="names 'bob' more than once"):
        DataTrainingArguments(train_file="t.csv", expert_column_names="alice,bob", max_deferral_rate="bob=0.1,bob=0.2")
