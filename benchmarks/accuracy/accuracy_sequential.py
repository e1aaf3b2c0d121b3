"""Former name of ``python -m benchmarks.accuracy.accuracy_cifar10 --setting=sequential``.

    python -m benchmarks.accuracy.accuracy_sequential --seeds=0,1,2 --rounds=30

runs that command with the same flags (the commands recorded in
results/accuracy_sequential.json keep working); ``--num_teachers=K`` is SFedKD's K,
passed as ``--method_kwargs=sfedkd:num_teachers=K``. See benchmarks/accuracy/accuracy_cifar10.py.
"""

from __future__ import annotations

import argparse
import sys

from benchmarks.accuracy import accuracy_cifar10


def main(argv=None) -> int:
  p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
  p.add_argument("--num_teachers", type=int)
  p.add_argument("--method_kwargs", default="")
  known, rest = p.parse_known_args(sys.argv[1:] if argv is None else argv)
  teachers = f"sfedkd:num_teachers={known.num_teachers}" if known.num_teachers else ""
  method_kwargs = ";".join(b for b in (teachers, known.method_kwargs) if b)
  return accuracy_cifar10.main(["--setting=sequential", f"--method_kwargs={method_kwargs}", *rest])


if __name__ == "__main__":
  sys.exit(main())
