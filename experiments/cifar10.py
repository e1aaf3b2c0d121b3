"""CIFAR-10 (and other image datasets) under label skew: FedProj's main experiment.

Presets, flags and run: fedjax_proj/configs/cifar10.py (``--help`` lists the flags).
"""

import sys

from fedjax_proj.configs import cifar10

if __name__ == "__main__":
  sys.exit(cifar10.main(sys.argv[1:]))
