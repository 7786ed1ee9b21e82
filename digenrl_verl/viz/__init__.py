"""Pictures of a run that both the runtime (`trainer/`) and the simulator (`sim/`) draw.

`gantt`: the PNG timeline of a `schedule.trace.Trace`. Lives outside `schedule/` (which stays pure: no
matplotlib) and outside `sim/` (the runtime must not import the simulator). matplotlib is imported only
when a PNG is written.
"""
