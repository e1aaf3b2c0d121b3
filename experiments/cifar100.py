"""CIFAR-100 under label skew: the FedProj paper's CIFAR-100 setting (papers 000/001, Table 1).

Presets, flags and run: fedjax_proj/configs/cifar100.py (``--help`` lists the flags).
"""

import sys

from fedjax_proj.configs import common

if __name__ == "__main__":  # a stop from here on ends in one line (common.exit_on_interrupt)
  common.exit_on_interrupt()

from fedjax_proj.configs import cifar100  # noqa: E402

if __name__ == "__main__":
  common.exit_with(cifar100.main(sys.argv[1:]))
