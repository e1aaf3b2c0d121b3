#!/usr/bin/env bash
# Makes one virtual environment per peer system, under ${PEER_ENVS:-<repository>/../peer-envs}/<system>.
#
# Each system gets its own environment so that no system's pins (numpy, torch, jax) change another's.
# torch is always installed first as `torch==2.13.0`, the CPU build that lies on this machine's disk
# (docs/performance.md, "Peer benchmark"): a later package asking for plain `torch` is then satisfied
# and pip never pulls a CUDA build of several GB. Ours runs from the project's own venv (the package
# installed editable), or from a fresh venv made here with `pip install -e <repo>`.
#
# Usage: benchmarks/perf/peer/make_envs.sh [system ...]   (default: torch pfl flower fedjax tff)
# A failed install is logged to <env>/install.log and the script goes on with the next system; the
# driver (benchmarks/perf/peer/run.py) records a system whose environment is missing as "not installed".
set -u
PY="${PEER_PYTHON:-python3.11}"
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
ROOT="${PEER_ENVS:-$REPO/../peer-envs}"
mkdir -p "$ROOT"

make_env() {  # name, then pip arguments in install order (one pip call per argument group, ';'-split)
  local name="$1"; shift
  local env="$ROOT/$name"
  if [ -x "$env/bin/python" ] && [ -f "$env/.ok" ]; then echo "$name: exists"; return 0; fi
  rm -rf "$env"
  "$PY" -m venv "$env" || return 1
  "$env/bin/pip" install -q --upgrade pip >"$env/install.log" 2>&1
  local group
  for group in "$@"; do
    # shellcheck disable=SC2086
    if ! timeout 900 "$env/bin/pip" install $group >>"$env/install.log" 2>&1; then
      echo "$name: FAILED at 'pip install $group' (see $env/install.log)"; return 1
    fi
  done
  touch "$env/.ok"; echo "$name: ok"
}

systems=("$@")
[ ${#systems[@]} -eq 0 ] && systems=(torch pfl flower fedjax tff)
for s in "${systems[@]}"; do
  case "$s" in
    ours) make_env ours "-e $REPO[cpu-onednn]" ;;
    torch) make_env torch "torch==2.13.0" "numpy psutil" ;;
    # pfl-research: the PyPI package `pfl` with its PyTorch extra (apple/pfl-research README).
    pfl) make_env pfl "torch==2.13.0" "pfl[pytorch]==0.6.0 psutil" ;;
    # Flower's simulation engine runs on Ray: the `simulation` extra.
    flower) make_env flower "torch==2.13.0" "flwr[simulation]==1.42.0 psutil" ;;
    # fedjax 0.0.17 (2023) breaks on current jax, and its unpinned dm-haiku/optax/chex pull one:
    # these are the last releases it imports and runs with (seen here, 2026-12).
    fedjax) make_env fedjax "fedjax==0.0.17" \
      "jax==0.4.30 jaxlib==0.4.30 numpy<2 dm-haiku==0.0.12 optax==0.2.2 chex==0.1.86 psutil" ;;
    # Fails on Python 3.11: it pins jaxlib==0.4.14, which has no wheel for it (kept so that the
    # attempt is reproducible; run.py records the system as not installed).
    tff) make_env tff "tensorflow-federated==0.87.0 psutil" ;;
    *) echo "unknown system '$s' (choose from: ours torch pfl flower fedjax tff)"; exit 2 ;;
  esac
done
