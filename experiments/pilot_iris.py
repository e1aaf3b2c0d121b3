"""The pilot study of FedProj (paper 000, Section 3; partition from paper 001, C.5).

Presets, flags and run: fedjax_proj/configs/pilot_iris.py (``--help`` lists the flags).
"""

import sys

from fedjax_proj.configs import pilot_iris

if __name__ == "__main__":
  sys.exit(pilot_iris.main(sys.argv[1:]))
