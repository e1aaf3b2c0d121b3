"""Quickstart: FedAvg vs FedProj on scikit-learn's digits, in about a minute on a CPU.

Presets, flags and run: fedjax_proj/configs/quickstart.py (``--help`` lists the flags).
"""

import sys

from fedjax_proj.configs import common

if __name__ == "__main__":  # a stop from here on ends in one line (common.exit_on_interrupt)
  common.exit_on_interrupt()

from fedjax_proj.configs import quickstart  # noqa: E402

if __name__ == "__main__":
  common.exit_with(quickstart.main(sys.argv[1:]))
