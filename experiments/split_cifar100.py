"""Split-CIFAR100 (10 tasks x 10 classes), task-incremental continual FL: FOT and its baselines.

Presets and flags: fedjax_proj/configs/split_cifar100.py (``--help`` lists the flags); what it
trains: fedjax_proj/training/continual_tasks.py.
"""

import sys

from fedjax_proj.configs import common

if __name__ == "__main__":  # a stop from here on ends in one line (common.exit_on_interrupt)
  common.exit_on_interrupt()

from fedjax_proj.configs import split_cifar100  # noqa: E402

if __name__ == "__main__":
  common.exit_with(split_cifar100.main(sys.argv[1:]))
