"""CINIC-10 under label skew from an image folder: the FedProj paper's CINIC-10 setting (Table 1).

Presets, flags and run: fedjax_proj/configs/cinic10.py (``--help`` lists the flags).
"""

import sys

from fedjax_proj.configs import cinic10

if __name__ == "__main__":
  sys.exit(cinic10.main(sys.argv[1:]))
