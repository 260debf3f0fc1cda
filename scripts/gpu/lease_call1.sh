#!/bin/bash
# A GPU lease, call 1 of 2 (docs/development.md, "A GPU lease"): install the carried wheels, keep the GGUF's first
# part, copy the tree for the GPU check, which runs on in its own session through call 2.
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
mkdir -p /tmp/jf/repo && cp .gpu/part00 .gpu/gsm8k_test.jsonl /tmp/jf/ || exit 4
tar --exclude=./.gpu --exclude=./.whl -cf - . | tar -xf - -C /tmp/jf/repo
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
(cd /tmp/jf/repo && PYTHONPATH=/tmp/site:/tmp/jf/repo setsid nohup python3 bench/gpu_check.py \
   --only ${ONLY:-lossless,flex_training,forward_cost,numerics} --out /tmp/jf/gpu-check > /tmp/jf/gpu_check.log 2>&1 < /dev/null &)
PYTHONPATH=/tmp/site python3 -c "import torch, transformers, pydantic, gguf; print(torch.__version__, transformers.__version__, pydantic.__version__)"
sleep 2; cat /tmp/jf/gpu_check.log
