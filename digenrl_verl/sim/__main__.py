"""``python -m digenrl_verl.sim`` is ``digenrl-sim``."""

import sys

from digenrl_verl.sim.cli import main

sys.exit(main())
