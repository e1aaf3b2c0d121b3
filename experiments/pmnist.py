"""Permuted MNIST, task-incremental continual FL: FOT and its baselines (FOT paper, Table 1).

Presets, flags and run: fedjax_proj/configs/pmnist.py (``--help`` lists the flags).
"""

import sys

from fedjax_proj.configs import pmnist

if __name__ == "__main__":
  sys.exit(pmnist.main(sys.argv[1:]))
