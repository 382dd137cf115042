"""The run config: typed sections, their schema and reference, reading files and overrides.

`RunConfig` and its sections live in `run.py`, its task, reward and evaluation sections in
`task.py`; building one from a mapping or a file, with the rules that cross fields, in
`load.py`; the field helpers, the schema derived from them and the error messages in
`schema.py`; YAML reading and `key=value` overrides in `files.py`.
"""

from rlcore.config.files import read_config_file, read_run_config
from rlcore.config.load import config_from_dict, load_config
from rlcore.config.run import (
    MODES,
    BaseModelConfig,
    EvalConfig,
    LoraConfig,
    ModelConfig,
    RewardConfig,
    RolloutConfig,
    RunConfig,
    RuntimeConfig,
    StalenessConfig,
    TaskConfig,
    TrainConfig,
    config_reference_markdown,
    run_config_schema,
)
from rlcore.errors import ConfigError

__all__ = [
    "MODES",
    "BaseModelConfig",
    "ConfigError",
    "EvalConfig",
    "LoraConfig",
    "ModelConfig",
    "RewardConfig",
    "RolloutConfig",
    "RunConfig",
    "RuntimeConfig",
    "StalenessConfig",
    "TaskConfig",
    "TrainConfig",
    "config_from_dict",
    "config_reference_markdown",
    "load_config",
    "read_config_file",
    "read_run_config",
    "run_config_schema",
]
