"""Text classification with pretrained encoders as clients: FedProj's Table 2 and FedGKD's AG News.

Presets, flags and run: fedjax_proj/configs/nlp.py (``--help`` lists the flags).
"""

import sys

from fedjax_proj.configs import common

if __name__ == "__main__":  # a stop from here on ends in one line (common.exit_on_interrupt)
  common.exit_on_interrupt()

from fedjax_proj.configs import nlp  # noqa: E402

if __name__ == "__main__":
  common.exit_with(nlp.main(sys.argv[1:]))
