"""Text classification with pretrained encoders as clients: FedProj's Table 2 and FedGKD's AG News.

Presets, flags and run: fedjax_proj/configs/nlp.py (``--help`` lists the flags).
"""

import sys

from fedjax_proj.configs import nlp

if __name__ == "__main__":
  sys.exit(nlp.main(sys.argv[1:]))
