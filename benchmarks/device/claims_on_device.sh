#!/usr/bin/env bash
# Runs claims of `python -m fedjax_proj.reproduce` on the device machine within a deadline and
# packs every result it finishes into $OUT/claims_results.tgz (docs/reproduction.md, "Running
# claims on a GPU"):
#
#   bash benchmarks/device/claims_on_device.sh SECONDS CLAIM:BUDGET [CLAIM:BUDGET ...]
#
# ($EXTRA_ARGS, e.g. "--seeds=0 --methods=fedavg", is passed to every claim.)
# ($PYTHON, default python3 from PATH, is the interpreter that runs everything: e.g. a venv's.)
# - Data: .device_data/device_data.npz ($DEVICE_DATA), unpacked into the layout of ../shared/data
#   (benchmarks/device/make_device_data.py; the CIFAR-10 claims want --public_format=webp_lossless).
# - Packages: wheels in .whl/ (ml_collections) are installed first where the folder exists.
# - The committed results travel with the tree and are copied in first, so done runs are skipped.
# - Each claim runs with --jobs=$JOBS (default 8): pinned workers sharing the accelerator, which
#   JAX then allocates on demand (XLA_PYTHON_CLIENT_PREALLOCATE=false).
# - Matrix products and convolutions are pinned to full float32 (JAX_DEFAULT_MATMUL_PRECISION),
#   the arithmetic of a CPU run, so GPU and CPU results of a claim compute the same maths.
# - SECONDS count from the first claim's start (after the data is unpacked and checked, a few
#   seconds); a claim starts only with >= 60 s left. At SECONDS the running claim gets SIGTERM
#   (each run stops after its round and checkpoints into its .work folder under $WORK, which is
#   not packed: an unfinished run continues in a later call on the same warm machine, and starts
#   afresh on a fresh one) and the claims not started are named. The pack is refreshed every
#   20 s, so a call cut short still returns what finished. Here: tar xzf claims_results.tgz -C
#   results/reproduce
set -uo pipefail
if [ $# -lt 2 ] || ! [[ $1 =~ ^[0-9]+$ ]]; then
  echo "usage: bash benchmarks/device/claims_on_device.sh SECONDS CLAIM:BUDGET [CLAIM:BUDGET ...]" >&2
  exit 2
fi
for cb in "${@:2}"; do
  if [[ $cb != *:* ]]; then
    echo "claims_on_device: '$cb' is not CLAIM:BUDGET (e.g. fot-pmnist-iid:cpu)" >&2
    exit 2
  fi
done
seconds=$1
shift
python=${PYTHON:-python3}
out=${OUT:-/tmp/claims_out}
work=${WORK:-/tmp/claims_on_device}
data=${DEVICE_DATA:-.device_data/device_data.npz}
mkdir -p "$out" "$work"
if [ -d .whl ]; then
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl || exit 3
fi
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
export JAX_DEFAULT_MATMUL_PRECISION=${JAX_DEFAULT_MATMUL_PRECISION:-float32}
if [ ! -f "$data" ]; then
  echo "claims_on_device: no device data at $data: build it here with" \
    "python -m benchmarks.device.make_device_data and carry .device_data" >&2
  exit 3
fi
"$python" - "$data" "$work/data" "$@" <<'EOF' || exit 3
import sys
from pathlib import Path

import numpy as np

from benchmarks.device import make_device_data
from fedjax_proj.reproduce import claims, run

# Refused before any compute: a claim whose runs read the public set, on a pack whose public set
# is lossy JPEG (distillation and memory on other pixels than a CPU run's).
with np.load(sys.argv[1]) as z:
  about = str(z["about"])
# Unpacked first: resolving a config checks that its data files exist.
unpacked = make_device_data.unpack(Path(sys.argv[1]), Path(sys.argv[2]))
for cb in sys.argv[3:]:
  name, budget = cb.split(":")
  claim = claims.get_claim(name)
  for method in claim.at(budget).methods:
    public = run.resolve_config(claim, budget, method, 0, Path(sys.argv[2])).get("public_data")
    if public and "lossy" in about:
      sys.exit(
        f"claims_on_device: {cb} reads the public set ({method}), but {sys.argv[1]} holds it as "
        "lossy JPEG: build it with --public_format=webp_lossless (docs/reproduction.md, "
        '"Running claims on a GPU")'
      )
print("device data:", unpacked, flush=True)
EOF
results=$work/results
mkdir -p "$results"
cp -r results/reproduce/. "$results/"
touch "$work/start"
deadline=$(($(date +%s) + seconds))
pack() {
  (cd "$results" && find . -name '*-seed*.json' -newer "$work/start" -print0 |
    tar czf "$out/pack.tmp" --null -T -) && mv "$out/pack.tmp" "$out/claims_results.tgz"
}
(while sleep 20; do pack; done) &
packer=$!
status=0
for cb in "$@"; do
  left=$((deadline - $(date +%s)))
  if [ "$left" -lt 60 ]; then
    echo "claims_on_device: deadline reached, $cb not started"
    status=1
    continue
  fi
  echo "claims_on_device: $cb (${left} s left)"
  # Round-by-round progress goes to the log only; the reply keeps the runs' start and end lines.
  timeout -s TERM "$left" "$python" -m fedjax_proj.reproduce "${cb%%:*}" --budget="${cb##*:}" \
    --jobs="${JOBS:-8}" --results="$results" --data="$work/data" ${EXTRA_ARGS:-} 2>&1 |
    tee -a "$out/claims.log" | { grep -v -E "round [0-9]+/[0-9]+|step [0-9]+/" || true; }
  rc=${PIPESTATUS[0]}
  [ "$rc" -eq 0 ] || status=1
done
kill "$packer" 2>/dev/null
pack
echo "claims_on_device: packed $(tar tzf "$out/claims_results.tgz" | grep -c json) result(s)"
exit $status
