"""An experiment, CI-sized: a tiny Qwen2 (the `profile` fixture) trained on a few questions' own trajectories, each
variant through the round's stages, decodes them in fewer forwards, stays identical to its own greedy AR, and the
table says what its text did; a run that died is taken up where it stopped by the stages' own rule."""

from __future__ import annotations

import shutil
import statistics
from pathlib import Path

import pytest
import torch

from jf_core.decoding import JFDecodeConfig
from jf_core.decoding.ar import ar_decode
from jf_core.experiments.measure import Measure, Questions
from jf_core.experiments.run import ExperimentRow, run_experiment, table
from jf_core.experiments.variants import variant_profile
from jf_core.models import load_model, stop_tokens
from jf_core.round.collection import collect_in_process
from jf_core.round.paths import round_paths
from jf_core.trajectory.prompts import load_prompts


def _setup(profile, tmp_path, questions: int, held: int = 2):
    """The experiment's profile (its own runs directory, `questions` trained on, 16-token answers) and the held-out
    questions after them."""
    p = profile.model_copy(
        update={
            "prompts": profile.prompts.model_copy(update={"limit": questions}),
            "trajectory": profile.trajectory.model_copy(update={"max_new_tokens": 16}),
            "storage": profile.storage.model_copy(update={"runs_dir": str(tmp_path / "runs")}),
        }
    )
    _, tok = load_model(p.model.path)
    every = [q.token_ids for q in load_prompts(p.prompts.model_copy(update={"limit": questions + held}), tok).items]
    return p, every[:questions], every[questions:]


def test_training_on_its_own_trajectories_raises_their_tpf_losslessly(profile, tmp_path):
    p, trained, held = _setup(profile, tmp_path, 3)
    # References for the accuracy column: the base model's own greedy answers, scored by exact match, so the base
    # scores 1.0 and a trained model scores its share of unchanged answers: accuracy must equal "= base".
    base_model, tok = load_model(p.model.path)
    greedy = ar_decode(base_model, trained[:2] + held, max_new_tokens=16, stop=stop_tokens(base_model, tok)).sequences
    answers = [{"tokens": list(g)} for g in greedy]
    measure = Measure(
        trained=Questions(trained[:2], answers[:2]),  # a sample of the trained questions, as a GPU round measures 64
        held_out=Questions(held, answers[2:]),
        block_size=p.trajectory.block_size,
        max_new_tokens=16,
        score=lambda tokens, row: list(tokens) == row["tokens"],
    )
    strong = {"steps": 40, "lr": 3e-3, "warmup_steps": 2, "batch_size": 2, "ar_weight": 1.0, "checkpoint_every": 1000}
    onpolicy = {**strong, "mask": "clean_context", "state_pick": "each_visit", "onpolicy_every": 10}
    variants = {
        "at_packing": {"training": strong},
        "each_visit_onpolicy": {"training": onpolicy},
        "synthetic": {"training": {**strong, "state_pick": "each_visit"}, "trajectory": {"kind": "synthetic"}},
    }
    seen = []
    rows = run_experiment(p, p.model.path, variants, measure, collect=collect_in_process, on_row=seen.append)
    base, fixed, onpol, synthetic = rows
    assert seen == rows and [r.variant for r in rows] == ["base", *variants]
    assert all(len(r.trained.outputs) == 2 and len(r.held_out.outputs) == 2 for r in rows)
    for row in rows:  # the decoder's promise, whatever training did
        assert row.trained.identical_to_own_ar == 1.0 and row.held_out.identical_to_own_ar == 1.0
        assert 1.0 <= row.trained.tpf <= 8.0
    assert base.trained.identical_to_base == 1.0 and base.train_tokens == 0 and base.model == p.model.path
    assert base.trained.accuracy == 1.0 and base.held_out.accuracy == 1.0
    for row in rows:  # each set scored against its own questions' references, question for question
        assert row.trained.accuracy == row.trained.identical_to_base
        assert row.held_out.accuracy == row.held_out.identical_to_base
        for part in (row.trained, row.held_out):  # the text kept from the start: the whole answer where unchanged
            if part.identical_to_base == 1.0:
                assert part.base_prefix == statistics.median(len(o) for o in part.outputs)
    assert onpol.trained.tpf > base.trained.tpf, table(rows)
    assert fixed.train_tokens > 0 and onpol.train_tokens > 0 and onpol.final["loss"] >= 0
    refreshes = [h for h in onpol.history if "onpolicy_tpf" in h]
    assert [h["step"] for h in refreshes] == [9.0, 19.0, 29.0]  # every 10 steps, not after the last
    elapsed = [h["elapsed_s"] for h in onpol.history if "loss" in h]  # the step rate, from the logged rows
    assert len(elapsed) >= 4 and elapsed == sorted(elapsed) and elapsed[0] > 0
    # Each variant is a round of its own; the Jacobi ones share one trajectory store, the synthetic one has its own.
    assert fixed.trajectories["kind"] == "jacobi" and fixed.trajectories["blocks"] == 6
    assert synthetic.trajectories["kind"] == "synthetic" and synthetic.trajectories["tokens_per_s"] > 0
    stores = {round_paths(variant_profile(p, v), p.model.path).trajectories.resolve() for v in variants.values()}
    assert len(stores) == 2
    assert all(Path(r.model, "config.json").is_file() for r in rows[1:])
    assert len({r.model for r in rows}) == 4
    assert "| each_visit_onpolicy |" in table(rows)


def test_a_draft_adapter_raises_tpf_and_keeps_the_base_text_by_construction(profile, tmp_path):
    """The draft-only LoRA variant: the base is frozen and verifies, so both question sets keep the base's greedy
    text, every answer, while TPF on the trained questions rises; the trained directory holds the input's weights
    unchanged beside the adapter, and a model that carries one is not trained whole by mistake. Training computes
    in bf16 (autocast, as on a GPU): the saved base is still the input's fp32 weights, bit for bit, not a bf16
    rounding of them, which would verify with other weights than the base it promises."""
    from safetensors.torch import load_file

    from jf_core.draft_adapter.adapter import FILE
    from jf_core.round.stages import stage_pack, stage_train, stage_trajectories

    p, trained, held = _setup(profile, tmp_path, 3)
    bf16 = p.model_copy(update={"model": p.model.model_copy(update={"dtype": "bfloat16"})})
    lora = {"steps": 40, "lr": 1e-2, "warmup_steps": 2, "batch_size": 2, "checkpoint_every": 1000,
            "mask": "clean_context", "state_pick": "each_visit", "draft_lora": {"rank": 8}}  # fmt: skip
    measure = Measure(trained=Questions(trained), held_out=Questions(held), block_size=8, max_new_tokens=16)
    base, drafted = run_experiment(
        bf16, p.model.path, {"draft_lora": {"training": lora}}, measure, collect=collect_in_process
    )
    for part in (drafted.trained, drafted.held_out):
        assert part.identical_to_base == 1.0 and part.identical_to_own_ar == 1.0
    assert drafted.trained.tpf > base.trained.tpf, table([base, drafted])
    kept = Path(drafted.model)
    assert (kept / FILE).is_file()
    written = load_file(str(kept / "model.safetensors"))
    given = load_file(str(next(Path(p.model.path).glob("*.safetensors"))))
    assert written.keys() == given.keys() and all(torch.equal(written[k], given[k]) for k in given)

    # The seed's progressive round on the adapter: round 2 collects its trajectories with round 1's model (the adapter
    # drafting) at another block size and trains on from it, on each block's first drafted position alone
    # (training.draft_span 1); measured at both sizes, with two blocks in flight (the adapter drafting the next block
    # on the chain of one still in flight) and in a named layout (a 1-slot chain beside prompt lookup), its text
    # still the base's.
    c1 = JFDecodeConfig(block_size=4, num_blocks=1, pool_size=0, draft_span=1, lookup=4)
    two = Measure(trained=Questions(trained), held_out=Questions(held), block_size=8, max_new_tokens=16,
                  more_block_sizes=(4,), multiblock=True, layouts=(("c1", c1),))  # fmt: skip
    spanned = {**lora, "draft_span": 1}
    progressive = {"r1": {"training": lora}, "r2": {"from": "r1", "training": spanned, "trajectory": {"block_size": 4}}}
    _, r1, r2 = run_experiment(bf16, p.model.path, progressive, two, collect=collect_in_process)
    assert r1.model == drafted.model  # the same round as above: read back, not trained again
    r2_paths = round_paths(variant_profile(bf16, {"training": spanned, "trajectory": {"block_size": 4}}), r1.model)
    assert r2.model == str(r2_paths.model) and (r2_paths.model / FILE).is_file()
    assert set(r2.held_out.tpf_by_block_size) == {"8", "4"} and r2.held_out.tpf == r2.held_out.tpf_by_block_size["8"]
    for part in (r2.trained, r2.held_out):
        assert part.identical_to_base == 1.0 and part.identical_to_own_ar == 1.0
    assert r2.trajectories["blocks"] > 0 and "| r2 | " in table([r1, r2]) and "(n4 " in table([r2])
    assert r2.held_out.tpf_multiblock >= 1.0 and ", K2 " in table([r2]) and measure.key() != two.key()
    assert r2.held_out.tpf_by_layout["c1"] >= 1.0 and ", c1 " in table([r2])
    assert r2.final["consistency_positions"] <= r2.trajectories["blocks"]  # one position a block, at most
    with pytest.raises(ValueError, match="'r0', which is not an earlier variant"):
        run_experiment(bf16, p.model.path, {"r2": {"from": "r0", "training": lora}}, two, collect=collect_in_process)

    whole = variant_profile(p, {"training": {**lora, "draft_lora": None}})
    paths = round_paths(whole, str(kept))
    data = stage_trajectories(whole, str(kept), paths, collect=collect_in_process)
    with pytest.raises(ValueError, match="carries a draft adapter"):
        stage_train(whole, str(kept), paths, stage_pack(whole, paths, data), progress=False)


def test_a_run_that_died_is_taken_up_where_it_stopped(profile, tmp_path):
    """The same call again goes on where a dead one stopped, by the stages' rule (`run_stage`; a training that dies
    between checkpoints resumes from the last one there: tests/jf_core/training/test_trainer.py): the input model's
    figures and the trajectories read back, not measured or collected again; a model made again is measured again;
    a finished run is read back whole. A variant is refused by name when it overrides what an experiment does not
    vary."""
    p, trained, held = _setup(profile, tmp_path, 2)
    measured = []

    class Dies(Exception):
        pass

    def dies_once_trained(tokens: list[int], row: dict) -> bool:
        if (paths.model / "done.json").is_file():  # the variant's model is measured: the process dies here
            raise Dies
        measured.append(row)
        return True

    variant = {"v": {"training": {"steps": 10, "checkpoint_every": 5, "lr": 3e-3, "warmup_steps": 1, "batch_size": 2}}}
    refs = ([{}] * 2, [{}] * 2)

    def run(score):
        measure = Measure(trained=Questions(trained, refs[0]), held_out=Questions(held, refs[1]), block_size=8,
                          max_new_tokens=16, score=score)  # fmt: skip
        return run_experiment(p, p.model.path, variant, measure, collect=collect_in_process)

    paths = round_paths(variant_profile(p, variant["v"]), p.model.path)
    with pytest.raises(Dies):
        run(dies_once_trained)
    first_data = (paths.trajectories / "done.json").read_text()
    assert (paths.model / "done.json").is_file()
    assert not paths.checkpoints.exists()  # a finished training removes its checkpoints
    shutil.rmtree(paths.model)  # as if it had died writing its model
    seen_base = len(measured)

    rows = run(lambda tokens, row: measured.append(row) is None)
    _, row = rows
    # The trained model's answers scored (2 methods, 2 sets of 2), the base's read back, not scored again.
    assert len(measured) == seen_base + 8
    assert (paths.trajectories / "done.json").read_text() == first_data  # the trajectories were not collected again
    assert row.trained.identical_to_own_ar == 1.0 and row.train_tokens > 0 and row.history[-1]["step"] == 9.0
    again = run(lambda tokens, row: measured.append(row) is None)
    assert len(measured) == seen_base + 8
    assert [r.summary() for r in again] == [r.summary() for r in rows]  # all read back

    with pytest.raises(ValueError, match=r"variant 'x'.*\['model'\]"):
        run_experiment(p, p.model.path, {"x": {"model": {"dtype": "bfloat16"}}},
                       Measure(Questions(trained), Questions(held), 8, 16), collect=collect_in_process)  # fmt: skip


def test_rows_written_before_variants_had_their_stages_read_back():
    """The JSON lines of earlier runs (docs/data/*.jsonl) parse as rows: the plots, fits and MLflow read both."""
    import json

    data = Path(__file__).resolve().parents[3] / "docs" / "data" / "cpu_lora_curve_1e6_2026-11-27.jsonl"
    rows = [ExperimentRow.model_validate(json.loads(line)) for line in data.read_text().splitlines() if line.strip()]
    assert rows[0].variant == "base" and rows[-1].train_tokens > 10**6


def test_a_variant_named_as_the_input_models_row_is_refused_before_any_work(profile, tmp_path):
    """`--variant 'base:{}'` trained the profile's default and printed it as a second "base" row, indistinguishable
    from the untrained input model's (seen 2026-12-02): refused by name before anything is measured or trained."""
    with pytest.raises(ValueError, match="may not be named 'base'"):
        run_experiment(profile, "unused", {"base": {}, "mlp": {}}, measure=None, collect=None)
    assert not (Path(profile.storage.runs_dir) / profile.name / "experiments").exists()
