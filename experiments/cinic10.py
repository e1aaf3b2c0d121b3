"""CINIC-10 under label skew from an image folder: the FedProj paper's CINIC-10 setting (Table 1).

Presets, flags and run: fedjax_proj/configs/cinic10.py (``--help`` lists the flags).
"""

import sys

from fedjax_proj.configs import common

if __name__ == "__main__":  # a stop from here on ends in one line (common.exit_on_interrupt)
  common.exit_on_interrupt()

from fedjax_proj.configs import cinic10  # noqa: E402

if __name__ == "__main__":
  common.exit_with(cinic10.main(sys.argv[1:]))
