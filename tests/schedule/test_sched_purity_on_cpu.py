"""schedule/ must import without torch, ray, numpy or matplotlib (they are blocked in a subprocess)."""

import subprocess
import sys

BLOCKER = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split('.')[0] in {'torch', 'ray', 'numpy', 'matplotlib', 'scipy'}:
            raise ImportError('blocked: ' + name)
sys.meta_path.insert(0, Block())
import pkgutil, importlib
import digenrl_verl.schedule as pkg
for mod in pkgutil.iter_modules(pkg.__path__):
    importlib.import_module('digenrl_verl.schedule.' + mod.name)
import digenrl_verl.sim.cli, digenrl_verl.sim.scenarios, digenrl_verl.viz.gantt
print('ok')
"""


def test_schedule_imports_without_torch_ray_numpy():
    out = subprocess.run([sys.executable, "-c", BLOCKER], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
