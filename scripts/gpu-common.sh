# Sourced by the GPU scripts (scripts/gpu-*.sh) after their `set -euo pipefail`:
# the repository is the working folder; MEMSNAP is the memsnap binary, absolute
# (default .devrun/memsnap); OUT the folder for what they write, absolute and made
# (default a new temporary one); the hook and scripts/gpu are on PYTHONPATH;
# Python writes unbuffered; NCCL's NVLink multicast is off unless
# NCCL_NVLS_ENABLE says otherwise.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
MEMSNAP="$(realpath "${MEMSNAP:-.devrun/memsnap}")"
OUT="$(realpath -m "${OUT:-$(mktemp -d)}")"; mkdir -p "$OUT"
export PYTHONPATH="$PWD/rankagent/hook:$PWD/scripts/gpu${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}"

# gpu_ranks sets NGPU (the GPUs), NPROC (default $1, else a rank per GPU) and
# BACKEND, exported as MEMSNAP_BACKEND: NCCL with a GPU for each of more than
# one rank, else gloo with every rank on GPU 0.
gpu_ranks() {
  NGPU=$(nvidia-smi -L | wc -l)
  NPROC="${NPROC:-${1:-$NGPU}}"
  BACKEND=gloo
  if [ "$NGPU" -ge "$NPROC" ] && [ "$NPROC" -gt 1 ]; then BACKEND=nccl; fi
  export MEMSNAP_BACKEND="$BACKEND"
}
