"""Cluster specs: pools of ranks with an accelerator class, a speed factor and a memory size per class.

A spec is written as a small string, e.g. ``"gen=8xH800,trn=8xH800"``, ``"gen=8xA800@0.6,trn=8xH800"``
(``@speed`` relative to the reference accelerator of the cost profiles, default 1.0), ``"gen=8xL40S@0.4/48"``
(``/memory`` in GB per rank; default: `KNOWN_MEMORY_GB` for the class, else `DEFAULT_MEMORY_GB`) or
``"col=16xH800"``.

    >>> ClusterSpec.parse("gen=8xA800@0.6,trn=8xH800").speeds
    {'A800': 0.6, 'H800': 1.0}
    >>> ClusterSpec.parse("gen=8xL40S@0.4/48,trn=8xH800").memory
    {'L40S': 48.0, 'H800': 80.0}
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from digenrl_verl.schedule.config import PoolSpec

_POOL = re.compile(r"^(?P<pool>[a-z]+)=(?P<size>\d+)x(?P<cls>[A-Za-z0-9_.-]+?)(?:@(?P<speed>[0-9.]+))?"
                   r"(?:/(?P<mem>[0-9.]+))?$")

KNOWN_MEMORY_GB = {"H800": 80.0, "A800": 80.0, "H100": 80.0, "A100": 80.0, "H200": 141.0, "H20": 96.0, "L40S": 48.0}
"""GPU memory per rank in GB by class name (vendor specifications of the 80 GB / 141 GB / 96 GB / 48 GB parts)."""

DEFAULT_MEMORY_GB = 80.0
"""Memory of a class not in `KNOWN_MEMORY_GB` and given no ``/memory`` (assumption: an 80 GB part)."""


@dataclass(frozen=True)
class ClusterSpec:
    """Pools (name -> size and class), the speed factor and the memory (GB per rank) of each accelerator class."""

    pools: dict[str, PoolSpec]
    speeds: dict[str, float] = field(default_factory=dict)
    memory: dict[str, float] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> "ClusterSpec":
        pools: dict[str, PoolSpec] = {}
        speeds: dict[str, float] = {}
        memory: dict[str, float] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            m = _POOL.match(part)
            if not m:
                raise ValueError(f"cluster spec part {part!r} is not '<pool>=<size>x<class>[@<speed>][/<memory GB>]' "
                                 "(e.g. 'gen=8xH800,trn=8xH800@1.0')")
            if m["pool"] in pools:
                raise ValueError(f"cluster spec {text!r} names pool {m['pool']!r} twice")
            speed = float(m["speed"]) if m["speed"] else 1.0
            if speed <= 0:
                raise ValueError(f"cluster spec {part!r}: speed must be > 0")
            if speeds.get(m["cls"], speed) != speed:
                raise ValueError(f"cluster spec {text!r} gives class {m['cls']!r} two speeds")
            mem = float(m["mem"]) if m["mem"] else KNOWN_MEMORY_GB.get(m["cls"], DEFAULT_MEMORY_GB)
            if mem <= 0:
                raise ValueError(f"cluster spec {part!r}: memory must be > 0 GB")
            if memory.get(m["cls"], mem) != mem:
                raise ValueError(f"cluster spec {text!r} gives class {m['cls']!r} two memory sizes")
            pools[m["pool"]] = PoolSpec(int(m["size"]), m["cls"])
            speeds[m["cls"]] = speed
            memory[m["cls"]] = mem
        return cls(pools, speeds, memory)

    def speed(self, worker_class: str) -> float:
        return self.speeds.get(worker_class, 1.0)

    def memory_gb(self, worker_class: str) -> float:
        """GB per rank of a class."""
        return self.memory.get(worker_class, KNOWN_MEMORY_GB.get(worker_class, DEFAULT_MEMORY_GB))

    def pool_memory_gb(self, pool: str) -> float:
        return self.memory_gb(self.pools[pool].worker_class)

    @property
    def mode(self) -> str:
        return "colocated" if set(self.pools) == {"col"} else "disaggregated"

    @property
    def total_ranks(self) -> int:
        return sum(p.size for p in self.pools.values())

    def colocated(self) -> "ClusterSpec":
        """The same ranks as one colocated pool.

        Colocated tasks run on every rank in lock-step, so the slowest class sets the pace, and every rank holds
        the same shards, so the smallest memory caps what a rank may hold.
        """
        total = self.total_ranks
        speed = min(self.speed(p.worker_class) for p in self.pools.values())
        mem = min(self.memory_gb(p.worker_class) for p in self.pools.values())
        classes = sorted({p.worker_class for p in self.pools.values()})
        name = classes[0] if len(classes) == 1 else "+".join(classes)
        return ClusterSpec({"col": PoolSpec(total, name)}, {name: speed}, {name: mem})

    def describe(self) -> str:
        return ",".join(f"{n}={p.size}x{p.worker_class}@{self.speed(p.worker_class):g}"
                        f"/{self.memory_gb(p.worker_class):g}" for n, p in self.pools.items())
