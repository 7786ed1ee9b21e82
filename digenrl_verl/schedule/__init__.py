"""Scheduling decisions for disaggregated diffusion RL: pure Python, no torch and no ray.

The executor protocol and task vocabulary (`types`), the validated `ScheduleConfig`, micro-batch plans
(`plan`: GAP and batch-axis), the online cost profiler (`cost`), BTS (`bts`) and the TAG policies
(`tag`), TCSS (`staleness`), the event-loop `Driver` (`driver`), traces and metrics (`trace`) and lower
bounds (`bounds`). Executors live elsewhere: `digenrl_verl.sim` (virtual clock) and the Ray runtime.
"""

from digenrl_verl.schedule.bounds import Bound, StepCosts, colocated_lower_bound, run_lower_bound, step_lower_bound
from digenrl_verl.schedule.bts import BtsCosts, BtsResult, BtsSolver, BtsState, GenPhase, exhaustive, rollout
from digenrl_verl.schedule.config import (PoolSpec, ScheduleConfig, ScheduleSettings, TagConfig, TcssConfig,
                                          TspConfig)
from digenrl_verl.schedule.cost import CostProfiler
from digenrl_verl.schedule.driver import Driver, DriverStats, StepResult
from digenrl_verl.schedule.plan import BatchAxisPlanner, GapPlanner, MicroBatch, Planner, make_planner
from digenrl_verl.schedule.staleness import GenRequest, StalenessPolicy
from digenrl_verl.schedule.tag import BtsTag, BubbleContext, NoTag, StaticTag, TagDecision, TagPolicy, make_tag_policy
from digenrl_verl.schedule.trace import Decision, ScheduleLine, Trace, TraceEvent, TraceMetrics, parse_text
from digenrl_verl.schedule.types import Completion, Executor, ScheduleError, Task, TaskKind

__all__ = [
    "Bound", "StepCosts", "colocated_lower_bound", "run_lower_bound", "step_lower_bound",
    "BtsCosts", "BtsResult", "BtsSolver", "BtsState", "GenPhase", "exhaustive", "rollout",
    "PoolSpec", "ScheduleConfig", "ScheduleSettings", "TagConfig", "TcssConfig", "TspConfig",
    "CostProfiler", "Driver", "DriverStats", "StepResult",
    "BatchAxisPlanner", "GapPlanner", "MicroBatch", "Planner", "make_planner",
    "GenRequest", "StalenessPolicy",
    "BtsTag", "BubbleContext", "NoTag", "StaticTag", "TagDecision", "TagPolicy", "make_tag_policy",
    "Decision", "ScheduleLine", "Trace", "TraceEvent", "TraceMetrics", "parse_text",
    "Completion", "Executor", "ScheduleError", "Task", "TaskKind",
]
