"""The mechanism check, CI-sized: a tiny Qwen2 (the `profile` fixture) trained on two questions' own trajectories
decodes them in fewer forwards, stays identical to its own greedy AR, and the table says what its text did."""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

import torch

from jf_core.decoding.ar import ar_decode
from jf_core.models import load_model, stop_tokens
from jf_core.round.mechanism import run_mechanism, table
from jf_core.trajectory.prompts import load_prompts


def test_training_on_its_own_trajectories_raises_their_tpf_losslessly(profile, tmp_path):
    _, tok = load_model(profile.model.path)
    (tmp_path / "work").mkdir()
    items = load_prompts(profile.prompts.model_copy(update={"limit": 6}), tok).items
    prompts = [p.token_ids for p in items]
    # References for the accuracy column: the base model's own greedy answers, scored by exact match, so the base
    # scores 1.0 and a trained model scores its share of unchanged answers: accuracy must equal "= base".
    base_model, _ = load_model(profile.model.path)
    greedy = ar_decode(base_model, prompts[:5], max_new_tokens=16, stop=stop_tokens(base_model, tok)).sequences
    answers = [{"tokens": list(g)} for g in greedy]

    def same_answer(tokens: list[int], row: dict) -> bool:
        return list(tokens) == row["tokens"]

    strong = {"steps": 40, "lr": 3e-3, "warmup_steps": 2, "batch_size": 2, "ar_weight": 1.0, "checkpoint_every": 1000}
    rows = run_mechanism(
        profile,
        profile.model.path,
        {
            "at_packing": strong,
            "each_visit_onpolicy": {
                **strong,
                "mask": "clean_context",
                "state_pick": "each_visit",
                "onpolicy_every": 10,
            },
        },
        train=prompts[:3],
        measure_trained=2,  # TPF on a sample of the trained questions, as a GPU round measures 64 of a thousand
        held_out=prompts[3:5],
        max_new_tokens=16,
        workdir=(tmp_path / "work"),
        keep=tmp_path / "kept",  # the trained models, for timing them (bench/real_round_speed.py)
        references=(answers[:3], answers[3:5]),
        score=same_answer,
    )
    base, fixed, onpolicy = rows
    assert all(len(r.trained.outputs) == 2 and len(r.held_out.outputs) == 2 for r in rows)
    assert [r.variant for r in rows] == ["base", "at_packing", "each_visit_onpolicy"]
    for row in rows:  # the decoder's promise, whatever training did
        assert row.trained.identical_to_own_ar == 1.0 and row.held_out.identical_to_own_ar == 1.0
        assert 1.0 <= row.trained.tpf <= 8.0
    assert base.trained.identical_to_base == 1.0 and base.train_tokens == 0
    assert base.trained.accuracy == 1.0 and base.held_out.accuracy == 1.0
    for row in rows:  # each set scored against its own questions' references, question for question
        assert row.trained.accuracy == row.trained.identical_to_base
        assert row.held_out.accuracy == row.held_out.identical_to_base
    for row in rows:  # the text kept from the start: the whole answer wherever the text is the base's
        for part in (row.trained, row.held_out):
            if part.identical_to_base == 1.0:
                assert part.base_prefix == statistics.median(len(o) for o in part.outputs)
    assert onpolicy.trained.tpf > base.trained.tpf, table(rows)
    assert fixed.train_tokens > 0 and onpolicy.train_tokens > 0 and onpolicy.final["loss"] >= 0
    refreshes = [h for h in onpolicy.history if "onpolicy_tpf" in h]
    assert [h["step"] for h in refreshes] == [9.0, 19.0, 29.0]  # every 10 steps, not after the last
    elapsed = [h["elapsed_s"] for h in onpolicy.history if "loss" in h]  # the step rate, from the logged rows
    assert len(elapsed) >= 4 and elapsed == sorted(elapsed) and elapsed[0] > 0
    assert base.trajectories["kind"] == "jacobi" and base.trajectories["blocks"] == 6
    assert list((tmp_path / "work").iterdir()) == []  # the scratch is removed
    kept = sorted(p.name for p in (tmp_path / "kept").iterdir())
    assert kept == ["at_packing", "each_visit_onpolicy"]  # whole: no partial directory left beside them
    assert all((tmp_path / "kept" / k / "config.json").exists() for k in kept)
    assert "| each_visit_onpolicy |" in table(rows)


def test_a_draft_adapter_raises_tpf_and_keeps_the_base_text_by_construction(profile, tmp_path):
    """The draft-only LoRA variant: the base is frozen and verifies, so both question sets keep the base's greedy
    text, every answer, while TPF on the trained questions rises; the kept directory holds the input's weights
    unchanged beside the adapter, and a model that carries one is not trained whole by mistake. Training computes
    in bf16 (autocast, as on a GPU): the saved base is still the input's fp32 weights, bit for bit, not a bf16
    rounding of them, which would verify with other weights than the base it promises."""
    import pytest
    from safetensors.torch import load_file

    from jf_core.draft_adapter.adapter import FILE
    from jf_core.round.mechanism import train_on_records, variant_profile

    _, tok = load_model(profile.model.path)
    prompts = [p.token_ids for p in load_prompts(profile.prompts.model_copy(update={"limit": 6}), tok).items]
    lora = {"steps": 40, "lr": 1e-2, "warmup_steps": 2, "batch_size": 2, "checkpoint_every": 1000,
            "mask": "clean_context", "state_pick": "each_visit", "draft_lora": {"rank": 8}}  # fmt: skip
    bf16 = profile.model_copy(update={"model": profile.model.model_copy(update={"dtype": "bfloat16"})})
    base, drafted = run_mechanism(
        bf16, profile.model.path, {"draft_lora": lora}, train=prompts[:3], held_out=prompts[3:5],
        max_new_tokens=16, keep=tmp_path / "kept",
    )  # fmt: skip
    for part in (drafted.trained, drafted.held_out):
        assert part.identical_to_base == 1.0 and part.identical_to_own_ar == 1.0
    assert drafted.trained.tpf > base.trained.tpf, table([base, drafted])
    kept = tmp_path / "kept" / "draft_lora"
    assert (kept / FILE).is_file()
    written = load_file(str(kept / "model.safetensors"))
    given = load_file(str(next(Path(profile.model.path).glob("*.safetensors"))))
    assert written.keys() == given.keys() and all(torch.equal(written[k], given[k]) for k in given)

    whole = variant_profile(profile, {**lora, "draft_lora": None})
    with pytest.raises(ValueError, match="carries a draft adapter"):
        train_on_records(whole, str(kept), [], tmp_path / "again", device="cpu")


def test_a_run_that_died_is_taken_up_where_it_stopped(profile, tmp_path):
    """With a resume directory the same call goes on where a dead one stopped: the base row and trajectories read
    back (not measured or collected again), a variant that died between checkpoints resumes from the last one, and
    a rerun with other questions is refused by name."""
    import pytest

    _, tok = load_model(profile.model.path)
    prompts = [p.token_ids for p in load_prompts(profile.prompts.model_copy(update={"limit": 4}), tok).items]
    variant = {"v": {"steps": 10, "checkpoint_every": 5, "lr": 3e-3, "warmup_steps": 1, "batch_size": 2}}
    state = tmp_path / "state"
    scored = []

    def dies_after_the_base(tokens: list[int], row: dict) -> bool:
        scored.append(row)
        if len(scored) > 4:  # the base's 2 + 2 answers are scored; the trained model's first one kills the run
            raise RuntimeError("the process dies here")
        return True

    kw = {"train": prompts[:2], "held_out": prompts[2:4], "max_new_tokens": 16, "resume_dir": state,
          "references": ([{}] * 2, [{}] * 2)}  # fmt: skip
    with pytest.raises(RuntimeError, match="dies here"):
        run_mechanism(profile, profile.model.path, variant, score=dies_after_the_base, **kw)
    first_base = json.loads((state / "base.json").read_text())
    checkpoints = state / "v" / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-00000005", "step-00000010"]
    # As if it had died between its two checkpoints: the last one and the model never written.
    shutil.rmtree(checkpoints / "step-00000010")
    saved = json.loads((checkpoints / "step-00000005" / "trainer_state.json").read_text())["history"]
    shutil.rmtree(state / "v" / "model")

    base, row = run_mechanism(profile, profile.model.path, variant, score=lambda tokens, ref: True, **kw)
    assert base.trajectories == first_base["trajectories"]  # read back: a second collection would time itself anew
    assert base.trained.outputs == first_base["trained"]["outputs"]
    assert row.history[: len(saved)] == saved  # the dead process's logged rows, from its step-5 checkpoint
    assert row.history[-1]["step"] == 9.0 and len(row.history) > len(saved)  # then trained on to the end
    earlier = max(h["elapsed_s"] for h in saved if "elapsed_s" in h)
    assert row.train_seconds > earlier and row.train_tokens > 0  # the dead process's training counts too
    assert row.trained.identical_to_own_ar == 1.0 and (state / "v" / "row.json").is_file()
    assert not (state / "v" / "model").exists() and not checkpoints.exists()  # 540 MB a SmolLM2 copy: not kept

    again = run_mechanism(profile, profile.model.path, variant, score=lambda tokens, ref: True, **kw)
    assert [r.summary() for r in again] == [base.summary(), row.summary()]  # all read back
    with pytest.raises(ValueError, match=r"inputs\.json"):
        run_mechanism(profile, profile.model.path, variant, **{**kw, "held_out": prompts[1:3]})
    with pytest.raises(ValueError, match="variant 'v'"):
        run_mechanism(profile, profile.model.path, {"v": {**variant["v"], "lr": 1e-3}}, **kw)
