"""A cluster simulator for the scheduler: virtual-clock executor, cost profiles, cluster specs, scenarios.

Imports neither torch nor ray. The Gantt PNG is `digenrl_verl.viz.gantt` (shared with the runtime).
"""

from digenrl_verl.sim.cluster import ClusterSpec
from digenrl_verl.sim.executor import Fault, SimExecutor
from digenrl_verl.sim.profiles import PROFILES, CostProfile, from_step_times, get_profile

__all__ = ["ClusterSpec", "Fault", "SimExecutor", "PROFILES", "CostProfile", "from_step_times", "get_profile"]
