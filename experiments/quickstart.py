"""Quickstart: FedAvg vs FedProj on scikit-learn's digits, in about a minute on a CPU.

Presets, flags and run: fedjax_proj/configs/quickstart.py (``--help`` lists the flags).
"""

import sys

from fedjax_proj.configs import quickstart

if __name__ == "__main__":
  sys.exit(quickstart.main(sys.argv[1:]))
