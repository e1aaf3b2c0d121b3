"""CIFAR-10 (and other image datasets) under label skew: FedProj's main experiment.

Presets, flags and run: fedjax_proj/configs/cifar10.py (``--help`` lists the flags).
"""

import sys

from fedjax_proj.configs import common

if __name__ == "__main__":  # a stop from here on ends in one line (common.exit_on_interrupt)
  common.exit_on_interrupt()

from fedjax_proj.configs import cifar10  # noqa: E402

if __name__ == "__main__":
  common.exit_with(cifar10.main(sys.argv[1:]))
