"""The committed accelerate configuration for multi-GPU FSDP (examples/accelerate/fsdp.yaml) is one that accelerate
reads: its schema and every FSDP option are checked here, and the record of its GPU run backs the file's header."""

from __future__ import annotations

import json
from pathlib import Path

from accelerate.commands.config.config_args import ClusterConfig
from accelerate.commands.launch import launch_command_parser
from accelerate.utils import DistributedType

FSDP_YAML = Path(__file__).resolve().parents[1] / "examples" / "accelerate" / "fsdp.yaml"


def test_fsdp_config_is_read_by_accelerate_and_uses_known_options():
    config = ClusterConfig.from_yaml_file(str(FSDP_YAML))
    assert config.distributed_type == DistributedType.FSDP and config.mixed_precision == "bf16"
    options = {action.dest for action in launch_command_parser()._actions}
    unknown = [key for key in config.fsdp_config if key not in options]
    assert not unknown, unknown
    assert config.fsdp_config["fsdp_version"] == 2
    assert config.fsdp_config["fsdp_auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP"
    header = FSDP_YAML.read_text()
    assert "NOT RUN" not in header and "RUN on one GPU" in header and "results/fsdp_gpu_h200.json" in header


def test_the_fsdp_run_the_config_header_cites_passed_every_check():
    """The header of fsdp.yaml says it was run on a GPU; the record of that run (tests/scripts/fsdp_gpu_check.py on
    an H200) must back it: FSDP engaged in every launch, and every comparison within its tolerance."""
    record = json.loads((FSDP_YAML.parents[2] / "results" / "fsdp_gpu_h200.json").read_text())
    assert record["verdict"] == "PASS" and record["environment"]["cuda_available"]
    checks = {check["name"]: check for check in record["checks"]}
    assert all(check["passed"] for check in checks.values())
    engaged = [name for name in checks if name.startswith("fsdp_engaged[")]
    assert len(engaged) == 4  # the bf16 and fp32-sharded runs and their two resumes
    assert checks["loss_curve_fp32"]["max_abs_diff"] <= 1e-4 and checks["weights_fp32"]["max_abs_diff"] <= 1e-4
    assert checks["loss_curve_bf16"]["max_abs_diff"] <= checks["loss_curve_bf16"]["atol"]
