"""`digenrl_verl.platform.after_import`: a callback on a module right after its code runs, never importing it early."""

from __future__ import annotations

import sys

from digenrl_verl.platform.after_import import _WatchFinder, after_import


def test_the_callback_runs_once_after_the_modules_code_and_not_before(tmp_path, monkeypatch):
    name = "digenrl_after_import_probe"
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / f"{name}.py").write_text("VALUE = 1\n")
    seen = []

    def callback(module):
        seen.append(module.VALUE)  # the module's code has run
        module.VALUE = 2

    after_import(name, callback)
    after_import(name, callback)  # the same callback again: not added twice
    assert seen == [] and name not in sys.modules  # nothing imported ahead of time
    try:
        module = __import__(name)
        assert seen == [1] and module.VALUE == 2
        assert not any(isinstance(f, _WatchFinder) and name in f.watched for f in sys.meta_path)
        after_import(name, lambda m: seen.append("now"))  # already imported: at once
        assert seen == [1, "now"]
    finally:
        sys.modules.pop(name, None)
