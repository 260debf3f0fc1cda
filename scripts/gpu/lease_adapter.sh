#!/bin/bash
# A GPU lease for issue 70, item 4, after lease_call1.sh (wheels installed, the GGUF's first part kept; ONLY=flex_training
# there runs training's FlexAttention check, both packing layouts, beside this): the draft adapter trained by the SmolLM2
# profile's recipe (spans packing, three noisy copies, 3-slot spans; bench/mechanism.py's default profile) on GSM8K's
# train split to about 10^7 packed tokens, then timed against our AR (and AR again: the control row), HF generate, HF
# prompt lookup and the untrained base's Jacobi with prompt lookup at batch 1, 16 and 4 on the test split, every output
# checked against the base's greedy output (bench/gpu_check.py --only adapter_speed), and each model's config tuned on
# the GPU (--tune: the adapter's chain, prompt lookup and the round's corpus as suffix drafts, wide). Carry
# .gpu/part01 and the two GSM8K files. QUESTIONS, STEPS, BATCH, LIMIT (the round's seconds) and TOTAL (the call's: the timing gets what the round
# left) adjust it; what it wrote comes back
# in $OUT. If the round fails on FlexAttention, it runs again on SDPA's dense mask (training.attention: sdpa), where
# the kept contexts apply. DEVICE=cpu with small QUESTIONS/STEPS/TOKENS rehearses it on a CPU.
set -o pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH=/tmp/site:$PWD JF_HOME=${JF_HOME:-/tmp/jf/home}
PY=${PY:-python3}
GGUF=${GGUF:-/tmp/jf/smollm2.gguf}
T0=$(date +%s)
# Warm-up steps: 30, or a tenth of a shorter run's (a rehearsal's few STEPS), since training refuses warmup >= steps.
WARMUP=${WARMUP:-$(( ${STEPS:-660} >= 300 ? 30 : ${STEPS:-660} / 10 ))}
[ -f "$GGUF" ] || { cat /tmp/jf/part00 .gpu/part01 > "$GGUF" && sha256sum "$GGUF" | cut -c1-16; }
# QUESTIONS' synthetic trajectories first: on 2026-12-04's H200 they came at 2,400-3,500 answer tokens/s at a collect
# batch of 512, no faster than 2026-11-27's 3,080 at 128 (so not the launches: unprofiled there), so 3,072 questions
# took about 200 s and left the round's 330 s too little to train; 1,536 take about 100. Then BATCH packed sequences of
# about 240 tokens a step (prompt, clean answer, 3 copies of each block's span), STEPS steps: 64 x 660 is about 10^7
# tokens (about 27 visits of each question). TPF at n = 16 and 32 probed on 32 held-out development questions. The
# adapter trains in bf16 autocast over the fp32 base; it decodes in fp32 below (the exact contract). Training's
# progress lines are kept, one in 50, so a round cut short still says how far it got and at what pace.
round() {  # $1: the variant's name, $2: its extra training fields
  timeout --signal=INT ${LIMIT:-330} $PY bench/mechanism.py --device ${DEVICE:-cuda} --model "$GGUF" --threads ${THREADS:-8} \
    --set prompts.source=.gpu/gsm8k_train.jsonl --set model.dtype=bfloat16 \
    --set evaluation.source=.gpu/gsm8k_test.jsonl --set training.tpf_probe_questions=held_out \
    --set training.checkpoint_every=100000 --set training.tpf_probe_every=${EVERY:-165} \
    --set training.tpf_probe_prompts=${PROBES:-32} --set training.tpf_probe_tokens=${TOKENS:-256} \
    --set 'training.tpf_probe_block_sizes=[16,32]' --set trajectory.max_new_tokens=${TOKENS:-256} \
    --train ${QUESTIONS:-1536} --held-out 16 --measure-trained 8 --max-new-tokens ${TOKENS:-256} \
    --batch-size 64 --collect-batch-size ${COLLECT:-256} \
    --variant "$1:{\"batch_size\": ${BATCH:-64}, \"grad_accum\": 1, \"steps\": ${STEPS:-660}, \"lr\": 1e-3, \"warmup_steps\": ${WARMUP}$2}" \
    --out $OUT/adapter_round.json 2>&1 | stdbuf -oL tr "\r" "\n" \
    | awk '!/^train: / || ++n % 50 == 0 { print; fflush() }' | tee -a $OUT/adapter_round.log
}
trained() {  # the trained model's directory from the round's rows (the base's row comes first), or nothing
  $PY -c "import json, sys; rows = [json.loads(r) for r in open(sys.argv[1]) if r.strip()]
print(next((r['model'] for r in rows[::-1] if r['variant'] != 'base'), ''))" $OUT/adapter_round.json 2>/dev/null
}
round spans "${FIRST:-}"  # FIRST: extra fields for the first try (a rehearsal of the fallback)
rc=$?
# Again on SDPA only where the round failed (not where its time ran out: 124, or 130 for an interrupt).
if [ -z "$(trained)" ] && [ $rc -ne 124 ] && [ $rc -ne 130 ]; then
  echo "round rc=$rc: no row; again on SDPA's dense mask with kept contexts"
  round spans_sdpa ', "attention": "sdpa", "context_memory_mb": 60000'
  rc=$?
fi
echo "round rc=$rc seconds=$(( $(date +%s) - T0 ))"
ADAPTER=$(trained)  # the trained model stays in its round's directory; the row names it
# What is left of the call's TOTAL seconds (15 kept for the copying after it), or SPEED_LIMIT.
SPEED_LIMIT=${SPEED_LIMIT:-$(( ${TOTAL:-590} - ($(date +%s) - T0) - 15 ))}
echo "timing for at most $SPEED_LIMIT s"
timeout --signal=INT $SPEED_LIMIT $PY bench/gpu_check.py --device ${DEVICE:-cuda} --only adapter_speed \
  --adapter-model "$ADAPTER" --base-model "$GGUF.jf-fp32" --prompts .gpu/gsm8k_test.jsonl --num-prompts ${PROMPTS:-6} \
  --batches 1,16,4 --block-sizes 16,32 --max-new-tokens ${TOKENS:-256} --tune --out $OUT/speed 2>&1 | tail -40
echo "total seconds=$(( $(date +%s) - T0 ))"
cp /tmp/jf/gpu-check/gpu_check.json $OUT/flex_check.json 2>/dev/null
tail -5 /tmp/jf/gpu_check.log 2>/dev/null
