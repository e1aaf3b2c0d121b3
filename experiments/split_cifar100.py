"""Split-CIFAR100 (10 tasks x 10 classes), task-incremental continual FL: FOT and its baselines.

Presets, flags and run: fedjax_proj/configs/split_cifar100.py (``--help`` lists the flags).
"""

import sys

from fedjax_proj.configs import split_cifar100

if __name__ == "__main__":
  sys.exit(split_cifar100.main(sys.argv[1:]))
