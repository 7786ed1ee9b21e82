"""The trainer's config: the shipped YAML (`digenrl_trainer.yaml`, verl-omni's key layout) plus the plugin's typed
`trainer.digenrl` section (`digenrl.DigenRLConfig`, registered here in Hydra's ConfigStore so that Hydra composes
it as a structured, closed node), and the verl-omni adapter (`verl_omni`) that turns the tree into typed specs."""

from hydra.core.config_store import ConfigStore

from digenrl_verl.config.digenrl import DigenRLConfig, PoolConfig, PoolsConfig, schema_node

SCHEMA_GROUP, SCHEMA_NAME = "digenrl_schema", "digenrl"

ConfigStore.instance().store(group=SCHEMA_GROUP, name=SCHEMA_NAME, node=schema_node())

__all__ = ["DigenRLConfig", "PoolConfig", "PoolsConfig", "SCHEMA_GROUP", "SCHEMA_NAME"]
