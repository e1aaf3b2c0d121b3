"""The pilot study of FedProj (paper 000, Section 3; partition from paper 001, C.5).

Presets and flags: fedjax_proj/configs/pilot_iris.py (``--help`` lists the flags); what it trains:
fedjax_proj/training/pilot.py.
"""

import sys

from fedjax_proj.configs import common

if __name__ == "__main__":  # a stop from here on ends in one line (common.exit_on_interrupt)
  common.exit_on_interrupt()

from fedjax_proj.configs import pilot_iris  # noqa: E402

if __name__ == "__main__":
  common.exit_with(pilot_iris.main(sys.argv[1:]))
