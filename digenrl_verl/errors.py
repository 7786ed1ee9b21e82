"""`ConfigError`: a bad setting, named by its field inside the component that checked it.

Components (schedule, diffusion, models, ...) check their own fields in `__post_init__` and know nothing of the
YAML layout. A message names the field (`path`) and may mention other fields as `{field}` in its `fix`; the config
layer (`digenrl_verl.config.verl_omni`) re-raises it with the keys as the user writes them (`keyed`), so every
message names the key, the bad value and the fix while the key names live in the verl-omni adapter
(`config.verl_omni`, `config.verl_omni_reward`).
"""

from __future__ import annotations

from typing import Any, Mapping


class _FieldNames(dict):
    def __missing__(self, field: str) -> str:
        return field


class ConfigError(ValueError):
    """`path`=`value` is invalid: `fix`. A ValueError, so callers that catch ValueError keep working.

    `fix` may name other fields as `{field}`: rendered as the field name here, as the user's key by `keyed`."""

    def __init__(self, path: str, value: Any, fix: str) -> None:
        self.path, self.value, self.fix = path, value, fix
        super().__init__(self.render({}))

    def render(self, keys: Mapping[str, str]) -> str:
        names = _FieldNames(keys)
        return f"{names[self.path]}={self.value!r} is invalid: {self.fix.format_map(names)}"

    def under(self, prefix: str) -> "ConfigError":
        """The same error with its path below `prefix` (e.g. `trainer.digenrl`)."""
        return ConfigError(f"{prefix}.{self.path}" if prefix else self.path, self.value, self.fix)

    def keyed(self, keys: Mapping[str, str]) -> ValueError:
        """A ValueError naming the user's keys: field name -> key (`keys`); fields not in `keys` keep their name."""
        return ValueError(self.render(keys))
