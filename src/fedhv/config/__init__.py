"""Run configuration: schema, presets, loading and overrides."""

from fedhv.config.loader import dumps, load_config, preset_names, to_dict
from fedhv.config.schema import RunConfig

__all__ = ["RunConfig", "dumps", "load_config", "preset_names", "to_dict"]
