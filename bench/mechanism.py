"""The mechanism check on a real model: `jf experiment` (jf_cli/experiment.py, over jf_core/experiments/) with the
SmolLM2 profile as its default, kept as the command the experiments' docs (docs/experiments/) were run with and as
the GPU recipe below. Variants of a round's data and training from one model, each trained through the round's own
stages, reported as TPF on the trained questions and on held-out ones beside the text's identity with the base model
and its repetition.

    .venv/bin/python bench/mechanism.py --profile smollm2-135m \
        --set prompts.source=../shared/benchmarks/gsm8k_test.jsonl --train 8 --held-out 8 --max-new-tokens 96 \
        --variant 'fixed:{}' \
        --variant 'each_visit:{"state_pick": "each_visit"}' \
        --variant 'synthetic:{"trajectory": {"kind": "synthetic"}, "training": {"state_pick": "each_visit"}}' \
        --out mechanism.json

Each `--variant NAME:JSON` is a set of overrides on top of the profile (and `--set`): `{"training": {...},
"trajectory": {...}}`, or training's fields alone (`{"lr": 1e-3}`); `"from": "NAME"` starts it from an earlier
variant's trained model (the seed's progressive rounds: round 2 collects its trajectories with round 1's model, an
adapter drafting, and trains on from it). Every variant is a round's stages in its own
directory under the profile's runs directory (`storage.runs_dir`, default `$JF_HOME/runs`), its trajectories shared
with every variant of the same trajectory settings, so the same command run again reads back what is done and goes
on where it died (a training that died resumes from its last checkpoint, `training.checkpoint_every`); each row
names its trained model's directory. Rows go to `--out` as they finish (JSON lines, with each variant's training
history), so a long run can be read while it goes. Trajectories are collected in this process, one model (no Ray);
threads: `--threads` (default 2; run it alone, or with 1 beside other work).

The same round at a GPU's budget (no network there: the model comes as a copied .gguf file, imported next to it
on first use; the prompt file as a copied path), every GSM8K train-split question (1,055), TPF measured on 64 of
them and on 64 held-out ones:

    python bench/mechanism.py --device cuda --model smollm2.gguf --set prompts.source=gsm8k_test.jsonl \
        --set model.dtype=bfloat16 --set trajectory.kind=synthetic --set training.checkpoint_every=100000 \
        --set training.tpf_probe_every=88 --set training.tpf_probe_prompts=32 --set training.tpf_probe_tokens=256 \
        --set 'training.tpf_probe_block_sizes=[32]' --train 100000 --measure-trained 64 --held-out 64 \
        --max-new-tokens 256 --batch-size 64 --collect-batch-size 128 --threads 8 --plot curve.png \
        --variant 'each_visit:{"mask": "clean_context", "state_pick": "each_visit", "batch_size": 32,
                   "grad_accum": 1, "steps": 700, "lr": 1e-4, "warmup_steps": 50}' --out gpu_round.json

(700 steps x 32 packed sequences of about 485 tokens: 1.09 x 10^7 training tokens, TPF at n = 16 and 32 probed 8
times on 32 calibration questions; the run measured below probed n = 16 only, before the probe took more sizes.)
Measured on an H200 on 2026-11-27 (docs/experiments/mechanism.md, has the table and the curve): the whole
command took 7.7 minutes; the synthetic trajectories of 1,055 questions 65 s (3,080 tokens/s), training 294 s (0.35
s a step with the probes, beside the GPU check on the same GPU; 0.24 s a step in the first lease's run).
`--random-weights` runs the same shapes on random weights (the config and tokenizer suffice), which is how the first
run was sized before the weights were on the machine, and how the CUDA path was checked first.

The lent GPU machines' image (2026-11: Python 3.12, torch 2.11, transformers 5.17) lacks pydantic and gguf: carry
their wheels (pydantic, pydantic-core, annotated-types, typing-inspection, typing-extensions, gguf: `pip download
--only-binary=:all: --python-version 3.12 ... -d .whl`, installed there with `--no-index --target`); the 98 MB GGUF
goes over in two parts (the device tool's README). Don't let the profile's `checkpoint_every: 25` stand there: each
checkpoint is 1.6 GB of weights and AdamW state.
"""

from __future__ import annotations

import sys

from jf_cli.main import main as jf


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not any(a == "--profile" or a.startswith("--profile=") for a in argv):
        argv = ["--profile", "smollm2-135m", *argv]  # this script's default, where `jf experiment`'s is tiny
    return jf(["experiment", *argv])


if __name__ == "__main__":
    sys.exit(main())
