"""`ConfigError`: a bad setting, named by its path inside the component that checked it.

Components (schedule, diffusion, models, ...) check their own fields in `__post_init__` and know nothing of the
YAML layout; the config layer (`digenrl_verl.config`) re-raises with the key as the user writes it
(`ConfigError.under(prefix)`), so every message names the key, the bad value and the fix.
"""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """`path`=`value` is invalid: `fix`. A ValueError, so callers that catch ValueError keep working."""

    def __init__(self, path: str, value: Any, fix: str) -> None:
        self.path, self.value, self.fix = path, value, fix
        super().__init__(f"{path}={value!r} is invalid: {fix}")

    def under(self, prefix: str) -> "ConfigError":
        """The same error with its path below `prefix` (e.g. `trainer.digenrl`)."""
        return ConfigError(f"{prefix}.{self.path}" if prefix else self.path, self.value, self.fix)
