"""CIFAR-100 under label skew: the FedProj paper's CIFAR-100 setting (papers 000/001, Table 1).

Presets, flags and run: fedjax_proj/configs/cifar100.py (``--help`` lists the flags).
"""

import sys

from fedjax_proj.configs import cifar100

if __name__ == "__main__":
  sys.exit(cifar100.main(sys.argv[1:]))
