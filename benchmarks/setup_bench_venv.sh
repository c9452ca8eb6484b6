#!/usr/bin/env bash
# Create the throwaway virtualenv holding the incumbent IRT tools (never the repo's .venv).
# Usage: bash benchmarks/setup_bench_venv.sh [/work/bench-venv]
set -euo pipefail
VENV="${1:-/work/bench-venv}"
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
# CPU torch first, so py-irt's torch requirement is already met (no CUDA wheel pulled in).
"$VENV/bin/pip" install -q torch==2.13.0
"$VENV/bin/pip" install -q girth==0.8.0 mirt==1.2.0 py-irt==0.7.1 numpy scipy pandas pyarrow psutil
"$VENV/bin/pip" check
"$VENV/bin/python" -c "import torch, mirt, girth, py_irt; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
