"""Cluster specs: pools of ranks with an accelerator class and a speed factor per class.

A spec is written as a small string, e.g. ``"gen=8xH800,trn=8xH800"``, ``"gen=8xA800@0.6,trn=8xH800"``
(``@speed`` relative to the reference accelerator of the cost profiles, default 1.0) or ``"col=16xH800"``.

    >>> ClusterSpec.parse("gen=8xA800@0.6,trn=8xH800").speeds
    {'A800': 0.6, 'H800': 1.0}
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from digenrl_verl.schedule.config import PoolSpec

_POOL = re.compile(r"^(?P<pool>[a-z]+)=(?P<size>\d+)x(?P<cls>[A-Za-z0-9_.-]+?)(?:@(?P<speed>[0-9.]+))?$")


@dataclass(frozen=True)
class ClusterSpec:
    """Pools (name -> size and class) and the speed factor of each accelerator class."""

    pools: dict[str, PoolSpec]
    speeds: dict[str, float] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> "ClusterSpec":
        pools: dict[str, PoolSpec] = {}
        speeds: dict[str, float] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            m = _POOL.match(part)
            if not m:
                raise ValueError(f"cluster spec part {part!r} is not '<pool>=<size>x<class>[@<speed>]' "
                                 "(e.g. 'gen=8xH800,trn=8xH800@1.0')")
            if m["pool"] in pools:
                raise ValueError(f"cluster spec {text!r} names pool {m['pool']!r} twice")
            speed = float(m["speed"]) if m["speed"] else 1.0
            if speed <= 0:
                raise ValueError(f"cluster spec {part!r}: speed must be > 0")
            if speeds.get(m["cls"], speed) != speed:
                raise ValueError(f"cluster spec {text!r} gives class {m['cls']!r} two speeds")
            pools[m["pool"]] = PoolSpec(int(m["size"]), m["cls"])
            speeds[m["cls"]] = speed
        return cls(pools, speeds)

    def speed(self, worker_class: str) -> float:
        return self.speeds.get(worker_class, 1.0)

    @property
    def mode(self) -> str:
        return "colocated" if set(self.pools) == {"col"} else "disaggregated"

    @property
    def total_ranks(self) -> int:
        return sum(p.size for p in self.pools.values())

    def colocated(self) -> "ClusterSpec":
        """The same ranks as one colocated pool.

        Colocated tasks run on every rank in lock-step, so the slowest class sets the pace.
        """
        total = self.total_ranks
        speed = min(self.speed(p.worker_class) for p in self.pools.values())
        classes = sorted({p.worker_class for p in self.pools.values()})
        name = classes[0] if len(classes) == 1 else "+".join(classes)
        return ClusterSpec({"col": PoolSpec(total, name)}, {name: speed})

    def describe(self) -> str:
        return ",".join(f"{n}={p.size}x{p.worker_class}@{self.speed(p.worker_class):g}" for n, p in self.pools.items())
