"""The loss-scale mutation of tests/verl_omni/test_verl_omni_flag_equals_stock_on_cpu.py (issue 30: "a 0.1 % change
in the loss scale makes the equivalence test fail").

The test puts this folder on PYTHONPATH of the flag's run only when ``DIGENRL_EQUIVALENCE_LOSS_SCALE`` is set (e.g.
1.001); Python imports `sitecustomize` in every process of the run (driver, Ray workers). When a process imports
`digenrl_verl.integrations.verl_omni_worker`, the loss functions its accumulating worker hands verl-omni's engine
(`scaled_loss`, `row_scaled_loss`) return their loss times that factor: the trainer pool's gradient is scaled, nothing
else. verl-omni's own run never gets this folder.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys

_MODULE = "digenrl_verl.integrations.verl_omni_worker"
_FACTOR = os.environ.get("DIGENRL_EQUIVALENCE_LOSS_SCALE")


def _scaled(make):
    def wrapped(*args, **kwargs):
        loss_function = make(*args, **kwargs)

        def loss(*a, **k):
            value, metrics = loss_function(*a, **k)
            return value * float(_FACTOR), metrics

        return loss

    return wrapped


class _Mutation(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _MODULE:
            return None
        sys.meta_path.remove(self)  # the real spec, found once, its loader wrapped
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            module.scaled_loss, module.row_scaled_loss = _scaled(module.scaled_loss), _scaled(module.row_scaled_loss)
            print(f"digenrl mutation: {_MODULE} losses times {_FACTOR}", file=sys.stderr)

        spec.loader.exec_module = exec_module
        return spec


if _FACTOR:
    sys.meta_path.insert(0, _Mutation())
