#!/usr/bin/env bash
# One device call: protocol v2 drift claims at fe6209b (.devcmd/fe, the commit of dir0.5's 50 runs),
# dir0.3 on 14 cores (7 jobs) beside dir0.5's last run on 2; then, given THROUGHPUT seconds, the
# GPU suite's throughput step at this tree's commit.
set -uo pipefail
start=$(date +%s); root=$PWD
left() { echo $(( ${LIMIT:-560} - ($(date +%s) - start) )); }
nvidia-smi -L | tee -a $OUT/device.txt
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl || exit 3
cd .devcmd/fe
mkdir -p benchmarks/results && ln -sfn $root/benchmarks/results/reproduce benchmarks/results/reproduce
export FEDJAX_PROJ_GIT_COMMIT=$(cat COMMIT) DEVICE_DATA=$root/.device_data/device_data.npz EXTRA_ARGS=--protocol=v2
echo "commit $FEDJAX_PROJ_GIT_COMMIT" | tee -a $OUT/device.txt
mkdir -p $OUT/d05 $OUT/d03
secs=$(( $(left) - ${THROUGHPUT:-0} - 45 ))
if [ "$secs" -gt 60 ]; then
  OUT=$OUT/d03 WORK=/tmp/cod03 JOBS=${JOBS:-5} bash benchmarks/claims_on_device.sh $secs fedproj-cifar10-dir0.3:drift 2>&1 | tail -15
fi
echo "claims done: $(left) s left"
cd $root
if [ "${THROUGHPUT:-0}" -gt 0 ]; then
  export PYTHONPATH=$root PYTHONUNBUFFERED=1
  echo "throughput at $(cat .devcmd/HEAD)"
  python3 benchmarks/gpu_suite.py --out_dir=$OUT/suite --name=suite_b --steps=throughput --budget_throughput=$THROUGHPUT 2>&1 | grep -v '^{' | tail -25
fi
echo "end: $(left) s left"
