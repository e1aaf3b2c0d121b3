"""Sequential FL under ExDir label skew: SFedKD's experiments (FedAvg, FedSeq, CWC, SFedKD).

Presets, flags and run: fedjax_proj/configs/sequential.py (``--help`` lists the flags).
"""

import sys

from fedjax_proj.configs import common

if __name__ == "__main__":  # a stop from here on ends in one line (common.exit_on_interrupt)
  common.exit_on_interrupt()

from fedjax_proj.configs import sequential  # noqa: E402

if __name__ == "__main__":
  common.exit_with(sequential.main(sys.argv[1:]))
