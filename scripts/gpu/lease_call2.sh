#!/bin/bash
# A GPU lease, call 2 of 2: the GGUF's second part, then the round (bench/mechanism.py's GPU command; STEPS, EVERY,
# VARIANT, EXTRA (training overrides), SETS (more --set options) and LIMIT adjust it), then the GPU check's results.
set -o pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH=/tmp/site:$PWD
cat /tmp/jf/part00 .gpu/part01 > /tmp/jf/smollm2.gguf && sha256sum /tmp/jf/smollm2.gguf | cut -c1-16
T0=$(date +%s)
timeout --signal=INT ${LIMIT:-545} python3 bench/mechanism.py --device cuda --model /tmp/jf/smollm2.gguf --threads 8 \
  --set prompts.source=/tmp/jf/gsm8k_test.jsonl --set model.dtype=bfloat16 --set trajectory.kind=synthetic \
  --set training.checkpoint_every=100000 --set training.tpf_probe_every=${EVERY:-88} \
  --set training.tpf_probe_prompts=32 --set training.tpf_probe_tokens=256 --set 'training.tpf_probe_block_sizes=[32]' \
  ${SETS} \
  --train 100000 --held-out 64 --measure-trained 64 --max-new-tokens 256 --batch-size 64 --collect-batch-size 128 \
  --variant "${VARIANT:-each_visit}:{\"mask\": \"clean_context\", \"state_pick\": \"each_visit\", \"batch_size\": 32, \"grad_accum\": 1, \"steps\": ${STEPS:-700}, \"lr\": 1e-4, \"warmup_steps\": 50${EXTRA}}" \
  --out $OUT/gpu_round.json 2>&1 | tee $OUT/gpu_round.raw | tr "\r" "\n" | grep -v "^train: " | tee $OUT/gpu_round.log
echo "round rc=$? seconds=$(( $(date +%s) - T0 ))"
cp /tmp/jf/gpu-check/gpu_check.* $OUT/ 2>/dev/null
tail -30 /tmp/jf/gpu_check.log
