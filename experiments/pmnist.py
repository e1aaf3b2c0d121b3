"""Permuted MNIST, task-incremental continual FL: FOT and its baselines (FOT paper, Table 1).

Presets and flags: fedjax_proj/configs/pmnist.py (``--help`` lists the flags); what it trains:
fedjax_proj/training/continual_tasks.py.
"""

import sys

from fedjax_proj.configs import common

if __name__ == "__main__":  # a stop from here on ends in one line (common.exit_on_interrupt)
  common.exit_on_interrupt()

from fedjax_proj.configs import pmnist  # noqa: E402

if __name__ == "__main__":
  common.exit_with(pmnist.main(sys.argv[1:]))
