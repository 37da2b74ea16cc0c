#!/usr/bin/env bash
# Builds .venv-axolotl: axolotl 0.19.0 with its own pins (transformers 5.16.1, trl 1.9.0,
# accelerate 1.13.0, datasets 4.8.4, kernels <0.17) on a CPU torch 2.13.0, plus packsim editable.
#   bash benchmarks/axolotl/setup.sh            (from the repo root or anywhere)
# torch is pinned through a constraints file in every step, so nothing pulls a CUDA torch build.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
venv="$root/.venv-axolotl"
PYTHON=${PYTHON:-python3}
cons="$root/constraints/axolotl-0.19.txt"
[ -x "$venv/bin/python" ] || "$PYTHON" -m venv "$venv"
py="$venv/bin/python"
"$py" -m pip install -q --upgrade pip
"$py" -c 'import torch' 2>/dev/null || "$py" -m pip install -q -c "$cons" torch==2.13.0
"$py" -m pip install -c "$cons" axolotl==0.19.0
"$py" -m pip install -q --no-deps -e "$root"
"$py" -m pip check || true
"$py" - <<'PY'
import importlib.metadata as md
import packsim, numba, tqdm, tokenizers  # packsim's own deps must be present
for p in ("axolotl", "transformers", "trl", "accelerate", "datasets", "torch", "kernels", "peft"):
    print(f"{p}=={md.version(p)}")
PY
