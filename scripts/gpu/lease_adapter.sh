#!/bin/bash
# A GPU lease for issue 51, after lease_call1.sh (wheels installed, the GGUF's first part kept; ONLY=forward_cost
# there keeps the GPU check short): the draft adapter trained on GSM8K's train split to >= 10^7 packed tokens, then
# timed against our AR and HF generate at batch 1, 4 and 16 on the test split, every output checked against the
# base's greedy output (bench/gpu_check.py --only adapter_speed). STEPS, BATCH and LIMIT adjust it; what it wrote
# comes back in $OUT. Budget (15 minutes a lease, its start included): training about 5 minutes, timing about 3.
set -o pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH=/tmp/site:$PWD JF_HOME=/tmp/jf/home
cat /tmp/jf/part00 .gpu/part01 > /tmp/jf/smollm2.gguf && sha256sum /tmp/jf/smollm2.gguf | cut -c1-16
T0=$(date +%s)
# 600 steps x 32 packed sequences of about 520 tokens: about 10^7 tokens, TPF at n = 16 and 32 probed 8 times on 64
# questions of GSM8K's test file (issue 50's curve, item 3, at a GPU's budget). The adapter trains in bf16 autocast over the
# fp32 base; it decodes in fp32 below (the exact contract).
timeout --signal=INT ${LIMIT:-360} python3 bench/mechanism.py --device cuda --model /tmp/jf/smollm2.gguf --threads 8 \
  --set prompts.source=.gpu/gsm8k_train.jsonl --set model.dtype=bfloat16 --set trajectory.kind=synthetic \
  --set evaluation.source=.gpu/gsm8k_test.jsonl --set training.tpf_probe_questions=held_out \
  --set training.checkpoint_every=100000 --set training.tpf_probe_every=75 \
  --set training.tpf_probe_prompts=64 --set training.tpf_probe_tokens=256 --set 'training.tpf_probe_block_sizes=[32]' \
  --train 100000 --held-out 32 --measure-trained 32 --max-new-tokens 256 --batch-size 64 --collect-batch-size 128 \
  --variant "adapter:{\"mask\": \"clean_context\", \"state_pick\": \"each_visit\", \"draft_lora\": {\"rank\": 16, \"alpha\": 32}, \"batch_size\": ${BATCH:-32}, \"grad_accum\": 1, \"steps\": ${STEPS:-600}, \"lr\": 1e-3, \"warmup_steps\": 30}" \
  --out $OUT/adapter_round.json 2>&1 | tr "\r" "\n" | grep -v "^train: " | tee $OUT/adapter_round.log
echo "round rc=$? seconds=$(( $(date +%s) - T0 ))"
# The trained model stays in its round's directory; the row names it.
ADAPTER=$(python3 -c "import json, sys; print(json.loads(open(sys.argv[1]).read().splitlines()[-1])['model'])" $OUT/adapter_round.json)
python3 bench/gpu_check.py --only adapter_speed --adapter-model "$ADAPTER" \
  --prompts .gpu/gsm8k_test.jsonl --num-prompts 32 --out $OUT/adapter 2>&1 | tail -40
