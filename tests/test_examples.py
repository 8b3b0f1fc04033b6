"""The committed accelerate configuration for multi-GPU FSDP (examples/accelerate/fsdp.yaml) is one that accelerate
reads: its schema and every FSDP option are checked here (no GPU run: see the file's header)."""

from __future__ import annotations

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
    assert "NOT RUN" in FSDP_YAML.read_text()  # until someone runs it on GPUs
