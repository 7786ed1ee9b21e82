"""The executor's data calls as one message each: the wire format of `generate_call`, `score_call`, `update_call`.

`trainer.ray_executor.RayExecutor` makes every GEN / SCORE / UPDATE call with one message holding its plain
arguments (`pack`: ids, version, advantages, flags as JSON, never a pickle: a worker deserialises nothing that could
run code), followed by the object refs of the data the call reads (decoded samples, trajectories), which Ray resolves
as before; GEN's shard of the step batch (a `DataProto`) stays its own argument, ahead of the message. The worker's
entry point (`*_call`, next to the typed method in `workers.roles`, and in `bench.noop_workers`) unpacks the message
and calls the typed method (`generate`, `score`, `update`) with the same arguments as before, so the training
engines' methods (the package's and verl-omni's `update`) are unchanged.

Why: Ray serialises each argument that is not an object ref on its own (msgpack, and cloudpickle for whatever
msgpack does not take: a DataProto shard, an advantage tensor) and deserialises each in the actor; a `bytes` argument
is passed as it is. On the driver bench's no-op actors (docs/benchmarks.md#driver-issue-31, 64 actors, one machine)
a call with one int argument reaches ~0.77x the lane rate of `ready()` (no argument), one `bytes` argument ~0.86x, and
the driver's GEN / SCORE / UPDATE mix 0.66x as separate arguments against 0.74x as messages. An argument passed as an
object ref of a `ray.put` value (the step batch, once per step) costs more than the shard it replaces: each call
resolves it through the object store (0.47x against 0.81x for the same call with plain arguments).

Advantages travel as plain floats (`update_call` makes them the fp32 tensor `update` takes), so the driver process
builds no tensor per call.
"""

from __future__ import annotations

import json
from typing import Any


def _plain(value: Any) -> Any:
    """A numpy / torch scalar as its Python number (sample ids come as numpy ints)."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"a call message holds plain values (numbers, bools, lists of them), got {type(value).__name__}")


def pack(*args: Any) -> bytes:
    """One call's plain arguments as one message (`unpack` gives them back as a tuple; floats round-trip exactly)."""
    return json.dumps(args, separators=(",", ":"), default=_plain).encode()


def unpack(message: bytes) -> tuple:
    """The arguments `pack` was given."""
    if not isinstance(message, bytes):
        raise TypeError(f"a call message is bytes (workers.calls.pack), got {type(message).__name__}")
    return tuple(json.loads(message))
