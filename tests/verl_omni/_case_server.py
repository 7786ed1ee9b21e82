"""One preloaded interpreter that forks a fresh process per engine-test case (`_engine_harness.run_script`).

Every case of the engine tests must start in a process whose platform was chosen before verl was imported, and
importing verl-omni takes ~20 s of CPU here (vLLM, vLLM-Omni, transformers): the cost of ~30 cases. This server is
started once per test session with the cases' environment (`cpu_env(OMP_NUM_THREADS="1")`), imports the modules named
on its command line in its single thread, then, for each request, forks: the child runs the case script as
`python <script> <args>` would (`runpy.run_path(script, run_name="__main__")`, `sys.argv` set), its stdout and stderr
in the request's log file, in its own process group (the client kills the group on a timeout). Each case thus starts
from the same state, the one a fresh interpreter reaches after those imports, and never from another case's.

Protocol, one JSON object per line: request on stdin `{"script", "argv", "log"}`, answers on the stdout this
process starts with: `{"pid"}` when the child is forked, then `{"rc"}` (its exit code) when it ends. Imports'
prints go to stderr (fd 1 is pointed there first). EOF on stdin ends the server.
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import sys
import traceback


def _child(request: dict) -> None:
    """In the forked child: the case script as `__main__`, its output in the log; never returns."""
    os.setpgid(0, 0)
    fd = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    code = 0
    try:
        sys.argv = [request["script"], *request["argv"]]
        sys.path[0] = os.path.dirname(os.path.abspath(request["script"]))
        runpy.run_path(request["script"], run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - the case's failure, reported through its log and exit code
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(preload: list[str]) -> None:
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # what the imports print must not reach the protocol
    for name in preload:
        importlib.import_module(name)
    print(json.dumps({"ready": True}), file=answers)
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            answers.close()
            _child(request)
        print(json.dumps({"pid": pid}), file=answers)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"rc": os.waitstatus_to_exitcode(status)}), file=answers)


if __name__ == "__main__":
    main(sys.argv[1:])
