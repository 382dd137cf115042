"""The run config: typed sections, their schema and reference, reading files and overrides.

`RunConfig` and its sections live in `run.py`; the schema derived from them and the error
messages in `schema.py`; YAML reading and `key=value` overrides in `files.py`.
"""

from rlcore.config.run import (
    MODES,
    BaseModelConfig,
    EvalConfig,
    ModelConfig,
    RewardConfig,
    RolloutConfig,
    RunConfig,
    RuntimeConfig,
    StalenessConfig,
    TaskConfig,
    TrainConfig,
    config_from_dict,
    config_reference_markdown,
    load_config,
    read_config_file,
    run_config_schema,
)
from rlcore.errors import ConfigError

__all__ = [
    "MODES",
    "BaseModelConfig",
    "ConfigError",
    "EvalConfig",
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
    "run_config_schema",
]
