#!/usr/bin/env bash
# One device call: sfedkd-fmnist-exdir, budget mnist, protocol v2, at 18fabff (.devcmd/sf, the
# commit that declared it), on the H200 with JOBS workers; MNIST from .device_mnist (the shared
# train/test npz byte-identical after unpacking; CIFAR-10 and the public set only as 10-image stubs
# the unpacker requires, read by no SFedKD run).
set -uo pipefail
start=$(date +%s); root=$PWD
nvidia-smi -L | tee -a $OUT/device.txt
cd .devcmd/sf
mkdir -p benchmarks/results && ln -sfn $root/benchmarks/results/reproduce benchmarks/results/reproduce
export FEDJAX_PROJ_GIT_COMMIT=$(cat COMMIT) DEVICE_DATA=$root/.device_mnist/device_data.npz EXTRA_ARGS=--protocol=v2
cp -r $root/.whl .whl
echo "commit $FEDJAX_PROJ_GIT_COMMIT" | tee -a $OUT/device.txt
OUT=$OUT WORK=/tmp/cosf JOBS=${JOBS:-16} bash benchmarks/claims_on_device.sh ${SECS:-380} sfedkd-fmnist-exdir:mnist 2>&1 | tail -40
echo "end: $(( $(date +%s) - start )) s"
