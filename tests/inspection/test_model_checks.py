"""hf_defer.inspection.model_checks: the choice of the checkpoint to resume from when the newest one is half written,
and the refusal of a model that is not a deferral model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from transformers import BertConfig, BertModel
from transformers.testing_utils import CaptureLogger

from hf_defer import DeferralConfig, EncoderForDeferral
from hf_defer.inspection.model_checks import check_deferral_model, last_complete_checkpoint, logger


def test_only_a_deferral_model_passes():
    check_deferral_model(EncoderForDeferral(DeferralConfig(feature_size=4, num_labels=2)))
    encoder = BertModel(BertConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8,
                                   vocab_size=16))
    for other in (encoder, object(), None):
        with pytest.raises(ValueError, match=r"model must be a deferral model .*got " + type(other).__name__):
            check_deferral_model(other)


# ---------------------------------------------------------------------------------------------------- checkpoints


def fake_checkpoint(folder: Path, step: int) -> Path:
    """What Trainer._save_checkpoint writes, in its order: the weights, the optimizer, trainer_state.json last."""
    path = folder / f"checkpoint-{step}"
    path.mkdir(parents=True)
    save_file({"head.weight": torch.randn(4, 3)}, str(path / "model.safetensors"))
    torch.save({"state": {}}, path / "optimizer.pt")
    (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return path


@pytest.mark.parametrize(
    "break_it",
    [
        lambda path: (path / "trainer_state.json").unlink(),  # killed inside the optimizer save: never written
        lambda path: (path / "trainer_state.json").write_text('{"global_st'),  # killed while writing it
        lambda path: (path / "model.safetensors").write_bytes((path / "model.safetensors").read_bytes()[:-10]),
        lambda path: (path / "model.safetensors").unlink(),
    ],
)
def test_the_newest_incomplete_checkpoint_is_skipped_with_a_warning(tmp_path, break_it):
    fake_checkpoint(tmp_path, 3)
    break_it(fake_checkpoint(tmp_path, 12))
    fake_checkpoint(tmp_path, 9).joinpath("trainer_state.json").unlink()
    with CaptureLogger(logger) as captured:
        assert last_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-3")
    assert "checkpoint-12" in captured.out and "checkpoint-9" in captured.out and "incomplete" in captured.out


def test_no_checkpoint_or_only_incomplete_ones(tmp_path):
    assert last_complete_checkpoint(tmp_path) is None
    assert last_complete_checkpoint(tmp_path / "missing") is None
    fake_checkpoint(tmp_path, 5)
    with CaptureLogger(logger) as captured:
        assert last_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-5")
    assert captured.out == ""
    (tmp_path / "checkpoint-5" / "trainer_state.json").unlink()
    with pytest.raises(ValueError, match=r"found no complete checkpoint .*checkpoint-5"):
        last_complete_checkpoint(tmp_path)


def test_a_sharded_fsdp_checkpoint_is_complete_once_its_metadata_is_written(tmp_path):
    """Under FSDP's SHARDED_STATE_DICT the Trainer writes no model file: accelerate saves the weights with
    torch.distributed.checkpoint into pytorch_model_fsdp_0/, whose .metadata comes last (here one process, no group)."""
    import torch.distributed.checkpoint as dcp

    for step in (3, 6):
        path = tmp_path / f"checkpoint-{step}"
        dcp.save({"model": {"head.weight": torch.randn(4, 3)}}, checkpoint_id=str(path / "pytorch_model_fsdp_0"))
        (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    assert last_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-6")
    (tmp_path / "checkpoint-6" / "pytorch_model_fsdp_0" / ".metadata").unlink()  # killed before the shards were all in
    with CaptureLogger(logger) as captured:
        assert last_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-3")
    assert "checkpoint-6" in captured.out
