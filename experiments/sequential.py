"""Sequential FL under ExDir label skew: SFedKD's experiments (FedAvg, FedSeq, CWC, SFedKD).

Presets, flags and run: fedjax_proj/configs/sequential.py (``--help`` lists the flags).
"""

import sys

from fedjax_proj.configs import sequential

if __name__ == "__main__":
  sys.exit(sequential.main(sys.argv[1:]))
