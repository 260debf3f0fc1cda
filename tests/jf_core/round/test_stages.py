"""The stages of a round (jf_core/round/stages.py) and the one rule that decides whether each runs
(jf_core/round/results.py): a re-run reuses every stage, a stage made again makes the ones after it run again.
Round layout: rounds that differ in training alone share one trajectory store; anything shaping trajectories gives
a store of its own."""

from __future__ import annotations

import json
from dataclasses import replace
from functools import partial

from jf_core.config import JFTrainConfig, TuneConfig
from jf_core.evaluation.method import AR, TUNED, jacobi
from jf_core.round.paths import RoundPaths, round_paths
from tests.conftest import serving_prior


def test_rounds_share_trajectories_exactly_when_trajectories_would_be_equal(profile, tmp_path):
    p = profile.model_copy(update={"storage": profile.storage.model_copy(update={"runs_dir": str(tmp_path)})})
    a = round_paths(p, p.model.path)
    b = round_paths(p.model_copy(update={"training": JFTrainConfig(schedule="random")}), p.model.path)
    c = round_paths(p.model_copy(update={"trajectory": p.trajectory.model_copy(update={"seed": 1})}), p.model.path)
    assert a.root != b.root and a.trajectories.is_symlink() and b.trajectories.is_symlink()
    assert a.trajectories.resolve() == b.trajectories.resolve()  # training alone differs: one store
    assert c.trajectories.resolve() != a.trajectories.resolve()  # another seed: other trajectories
    (a.trajectories / "manifest.json").write_text("{}")
    assert (b.trajectories / "manifest.json").is_file()
    assert round_paths(p, p.model.path).trajectories.resolve() == a.trajectories.resolve()  # stable on re-entry
    cllm = JFTrainConfig(method="cllm", mask="clean_context")
    d = round_paths(p.model_copy(update={"training": cllm}), p.model.path)
    e = round_paths(p.model_copy(update={"training": JFTrainConfig(mask="clean_context")}), p.model.path)
    assert d.root != e.root and d.trajectories.resolve() == a.trajectories.resolve()  # the method alone: its own


def test_the_tune_stage_stores_the_decode_config_and_the_ar_crossover_in_the_model(profile, tmp_path):
    import json
    import shutil
    from dataclasses import asdict

    from jf_core.config import TuneConfig
    from jf_core.evaluation.tune import TuneSpace
    from jf_core.model_dir import model_fingerprint
    from jf_core.round.results import TuneResult
    from jf_core.round.stages import stage_tune

    model = tmp_path / "model"
    shutil.copytree(profile.model.path, model)
    before = model_fingerprint(model)
    tune = TuneConfig(
        enabled=True,
        prompts=2,
        grid={"block_size": [4], "num_blocks": [1, 2], "pool_size": [0], "spawn_ratio": [0.5], "seed_drafts": [False]},
        repeats=1,
        crossover_batch_sizes=[1, 2],
        max_new_tokens=6,  # tuned on shorter decodes than the evaluation's 12, stored at 12
    )
    p = profile.model_copy(
        update={"evaluation": profile.evaluation.model_copy(update={"tune": tune, "max_new_tokens": 12})}
    )
    lines: list[str] = []
    report = stage_tune(p, model, progress=lines.append)
    # How far it is while the grid runs (its configurations take turns batch by batch), then the crossover.
    grid = f"tuning {len(TuneSpace.of(tune).configs(6))} decode configs on 2 prompts: "
    assert any(line.startswith(f"{grid}batch 2/2 ") for line in lines), lines  # the last batch is always said
    assert [line for line in lines if line.startswith("crossover: batch ")][-1].startswith("crossover: batch 2:")
    block = json.loads((model / "config.json").read_text())["jacobi_forcing"]
    assert report.best.max_new_tokens == 6 and all(t.config.max_new_tokens == 6 for t in report.trials)
    assert block["decode"] == {**asdict(report.best), "max_new_tokens": 12}
    serving = report.serving.block()
    assert block["crossover"]["batch_sizes"] == [1, 2] and block == {**block, **serving}
    assert block["hardware"].startswith("CPU") and block["dtype"] == "float32"
    assert model_fingerprint(model) == before  # tuning says how to decode the model; it is the same model
    assert TuneResult.model_validate_json((model / "decode_tuning.json").read_text()) == report
    again: list[str] = []
    assert stage_tune(p, model, on_reuse=again.append) == report  # done once
    assert again == [f"reusing the tuned decode config at {model / 'decode_tuning.json'}"]


def test_the_evaluations_headline_is_the_tuned_models_dispatched_decoding(profile, tmp_path):
    """Where the stored crossover says AR was faster (here: at every batch size), the headline row runs AR, as the
    server, `jf decode` and the registry's model do: its speed is what a consumer gets, never below AR by design."""
    import shutil

    from jf_core.decoding.multiblock import JFDecodeConfig
    from jf_core.model_dir import save_decode_config, update_block
    from jf_core.round.stages import stage_evaluate

    model = tmp_path / "model"
    shutil.copytree(profile.model.path, model)
    save_decode_config(model, JFDecodeConfig(block_size=4, num_blocks=1, pool_size=0, max_new_tokens=24))
    evaluation = profile.evaluation.model_copy(
        update={"num_prompts": 2, "speed_prompts": 2, "repeats": 1, "block_sizes": [4], "max_new_tokens": 24}
    )
    p = profile.model_copy(
        update={"evaluation": evaluation, "storage": profile.storage.model_copy(update={"runs_dir": str(tmp_path)})}
    )
    tuned = stage_evaluate(p, str(model)).headline
    assert tuned.method == TUNED and tuned.tpf > 1.0  # no crossover stored: Jacobi at every batch size
    update_block(model, **serving_prior(ar_above_batch=0).block())
    dispatched = stage_evaluate(p, str(model), reuse=False)
    assert dispatched.headline_method == TUNED and dispatched.headline.tpf == 1.0  # AR, forward for forward
    assert dispatched.row(jacobi(4)).tpf == tuned.tpf
    # A crossover between the passes' batch sizes: AR in the quality pass's batches of 2, Jacobi in the speed pass's
    # batch of 1. The row's TPF is the one its speed was measured with, never AR's TPF beside Jacobi's speed.
    update_block(model, **serving_prior(ar_above_batch=1).block())
    split = p.model_copy(
        update={
            "evaluation": evaluation.model_copy(update={"batch_size": 2, "speed_batch_size": 1, "speed_prompts": 1})
        }
    )
    between = stage_evaluate(split, str(model), reuse=False)
    assert between.row(TUNED).tpf > 1.0 and between.row(AR).tpf == 1.0
    assert between.row(TUNED).identical_fraction == 1.0  # its outputs still checked in the quality pass


def test_an_evaluation_runs_at_its_own_thread_count_and_gives_the_callers_back(profile, tmp_path):
    import torch

    from jf_core.round.stages import stage_evaluate

    evaluation = profile.evaluation.model_copy(
        update={"num_prompts": 2, "speed_prompts": 1, "repeats": 1, "block_sizes": [4], "max_new_tokens": 8}
    )
    p = profile.model_copy(
        update={
            "evaluation": evaluation,
            "compute": profile.compute.model_copy(update={"threads": 1}),
            "storage": profile.storage.model_copy(update={"runs_dir": str(tmp_path)}),
        }
    )
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        result = stage_evaluate(p, p.model.path)
        assert result.torch_threads == 1  # the evaluation's own count, for every method's turn
        assert torch.get_num_threads() == 2  # and the worker's next task starts from the caller's
        again = stage_evaluate(p, p.model.path)  # the cached evaluation, read back as the same type
        assert again.model_dump_json() == result.model_dump_json() and again.model == p.model.path
    finally:
        torch.set_num_threads(before)


def test_the_train_stage_probes_tpf_against_steps_into_its_history_and_plot(profile, tmp_path):
    """`training.tpf_probe_every`: the round's training records TPF on calibration prompts as it goes (rows of the
    history, hence MLflow metrics per step), the round's figures plot it, and the round's key ignores the probe
    (it reads the model, it does not change it)."""
    from jacobi_forcing.tasks.trajectories import generate_trajectories
    from jf_core.decoding.proposers.suffix import SuffixIndex, load_corpus
    from jf_core.evaluation.plots import tpf_during_training
    from jf_core.round.paths import RoundPaths, round_dir
    from jf_core.round.stages import stage_pack, stage_train, stage_trajectories
    from jf_core.trajectory.store import TrajectoryStore

    wide = 2 * profile.trajectory.block_size  # a second width beside the round's (n = 16 and 32 on SmolLM2)
    training = JFTrainConfig(
        steps=4, warmup_steps=1, batch_size=2, tpf_probe_every=2, tpf_probe_prompts=2, tpf_probe_block_sizes=[wide]
    )
    p = profile.model_copy(update={"training": training})
    unprobed = profile.model_copy(
        update={"training": training.model_copy(update={"tpf_probe_every": None, "tpf_probe_block_sizes": []})}
    )
    assert round_dir(p, p.model.path) == round_dir(unprobed, p.model.path)
    kept = p.model_copy(update={"training": training.model_copy(update={"keep_checkpoints": 5})})
    assert round_dir(kept, p.model.path) == round_dir(p, p.model.path)  # how many checkpoints stay is not the model
    paths = RoundPaths(tmp_path / "round")
    collect = partial(generate_trajectories, progress=False)
    packed = stage_pack(p, paths, stage_trajectories(p, p.model.path, paths, collect=collect))
    history = stage_train(p, p.model.path, paths, packed, progress=False).history
    # The round's greedy answers are kept beside the model as its draft corpus (training.draft_corpus).
    answers = TrajectoryStore(paths.trajectories).answers()
    assert answers and load_corpus(paths.model).tokens.tolist() == SuffixIndex.of(answers).tokens.tolist()
    n = p.trajectory.block_size
    probed = [row for row in history if f"probe_tpf_n{n}" in row]
    assert [row["step"] for row in probed] == [1.0, 3.0] and all(row[f"probe_tpf_n{n}"] >= 1 for row in probed)
    assert all(row[f"probe_tpf_n{wide}"] >= 1 for row in probed)
    assert tpf_during_training(history) is not None
    assert tpf_during_training([row for row in history if row not in probed]) is None


def test_a_rerun_reuses_every_stage_and_a_stage_made_again_remakes_the_ones_after_it(profile, tmp_path):
    """Each stage's marker holds its result and the stamps of the markers it was made from: a re-run reuses every
    stage (the stamps stay); a removed marker, or one another version of the code wrote, makes that stage and every
    stage after it run again, and none before it."""
    from jacobi_forcing.tasks.trajectories import generate_trajectories
    from jf_core.model_dir import DECODE_TUNING, DONE
    from jf_core.round.stages import stage_pack, stage_train, stage_trajectories, stage_tune

    tune = TuneConfig(
        enabled=True,
        prompts=2,
        grid={"block_size": [4], "num_blocks": [1], "pool_size": [0], "seed_drafts": [False]},
        repeats=1,
        crossover_batch_sizes=[],
    )
    p = profile.model_copy(
        update={
            "training": JFTrainConfig(steps=2, warmup_steps=1, batch_size=2, checkpoint_every=1000),
            "evaluation": profile.evaluation.model_copy(update={"tune": tune, "max_new_tokens": 8}),
        }
    )
    paths, model = RoundPaths(tmp_path / "round"), p.model.path
    collect = partial(generate_trajectories, progress=False)
    stages = ("trajectories", "packed", "model", "tune")
    markers = dict(zip(stages, (paths.trajectories / DONE, paths.packed / DONE, paths.model / DONE), strict=False))
    markers["tune"] = paths.model / DECODE_TUNING

    def run_round() -> dict[str, str]:
        """Every stage in order, as the flow chains them; the stamp of each stage's result."""
        traj = stage_trajectories(p, model, paths, collect=collect)
        packed = stage_pack(p, paths, traj)
        trained = stage_train(p, model, paths, packed, progress=False)
        tuned = stage_tune(p, paths.model, trained)
        return dict(zip(stages, (r.stamp for r in (traj, packed, trained, tuned)), strict=True))

    def made_again(before: dict[str, str], after: dict[str, str]) -> list[str]:
        return [s for s in stages if before[s] != after[s]]

    first = run_round()
    # Each stage's result carries its work's wall time, and a reused stage the time of the run that made it.
    made = {s: json.loads(m.read_text()) for s, m in markers.items()}
    assert all(made[s]["seconds"] > 0 for s in stages), {s: made[s]["seconds"] for s in stages}
    assert made_again(first, run_round()) == []  # a re-run reuses every stage
    assert all(json.loads(m.read_text())["seconds"] == made[s]["seconds"] for s, m in markers.items())
    markers["packed"].unlink()  # one stage's marker gone: it and the stages after it run again
    second = run_round()
    assert made_again(first, second) == ["packed", "model", "tune"]
    markers["tune"].unlink()  # the last stage alone
    third = run_round()
    assert made_again(second, third) == ["tune"]
    data = json.loads(markers["model"].read_text())  # a marker another version wrote: that stage and the rest
    markers["model"].write_text(json.dumps({**data, "field_of_another_version": 1}))
    assert made_again(third, run_round()) == ["model", "tune"]


def test_training_computes_in_its_compute_dtype_and_writes_the_models(profile, tmp_path):
    """`training.compute_dtype: bfloat16` under an fp32 model: training's matmuls run in bf16 (autocast), while the
    model directory keeps the model's fp32 weights (the decoders stay exact). Unset ("model") it stays out of the
    round's key, so rounds trained before it existed keep theirs. `auto` trains in whichever of the two it measured
    faster here, and the stage's record says which."""
    import torch
    from safetensors.torch import load_file

    from jf_core.round.collection import collect_in_process
    from jf_core.round.paths import training_identity
    from jf_core.round.stages import stage_pack, stage_train, stage_trajectories

    storage = profile.storage.model_copy(update={"runs_dir": str(tmp_path)})
    training = JFTrainConfig(steps=2, warmup_steps=1, batch_size=2, checkpoint_every=100)
    p = profile.model_copy(update={"training": training, "storage": storage})
    bf16 = p.model_copy(update={"training": training.model_copy(update={"compute_dtype": "bfloat16"})})
    assert "compute_dtype" not in training_identity(p) and training_identity(bf16)["compute_dtype"] == "bfloat16"
    assert round_paths(p, p.model.path).root != round_paths(bf16, p.model.path).root

    def trained_in(prof) -> tuple[set, dict, str]:
        seen: set = set()

        def record(module, _args, output):
            if isinstance(module, torch.nn.Linear) and torch.is_grad_enabled():  # training's forward, not probes'
                seen.add(output.dtype)

        paths = round_paths(prof, prof.model.path)
        packed = stage_pack(prof, paths, stage_trajectories(prof, prof.model.path, paths, collect=collect_in_process))
        handle = torch.nn.modules.module.register_module_forward_hook(record)
        try:
            result = stage_train(prof, prof.model.path, paths, packed, progress=False)
        finally:
            handle.remove()
        return seen, load_file(str(paths.model / "model.safetensors")), result.compute_dtype

    seen, weights, ran = trained_in(bf16)
    assert seen == {torch.bfloat16} and ran == "bfloat16"
    assert {w.dtype for w in weights.values()} == {torch.float32}
    seen, weights, ran = trained_in(p)
    assert seen == {torch.float32} and ran == "float32" and {w.dtype for w in weights.values()} == {torch.float32}
    auto = p.model_copy(update={"training": training.model_copy(update={"compute_dtype": "auto"})})
    seen, weights, ran = trained_in(auto)
    assert ran in ("float32", "bfloat16") and seen == {getattr(torch, ran)}
    assert {w.dtype for w in weights.values()} == {torch.float32}


def test_the_tpf_probe_reads_the_held_out_questions_where_asked(profile, tmp_path):
    """`training.tpf_probe_questions: held_out`: the probe's prompts are the evaluation's own file where it names one
    (GSM8K's test split beside its train split), its development half (the probe's curve decides recipes), rendered
    like the training prompts; by default the calibration split's."""
    from jf_core.models import load_model
    from jf_core.round.training import probe_prompts
    from jf_core.toy.task import make_split
    from jf_core.trajectory.prompts import held_out_slice

    _, tok = load_model(profile.model.path)
    rows = [{"id": e.uid, "prompt": e.prompt} for e in make_split("test", 16)]
    (tmp_path / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    training = JFTrainConfig(tpf_probe_prompts=4, tpf_probe_questions="held_out")
    evaluation = profile.evaluation.model_copy(update={"source": str(tmp_path / "test.jsonl")})
    held = probe_prompts(profile.model_copy(update={"training": training, "evaluation": evaluation}), tok)
    development = [r for r in rows if held_out_slice(r["prompt"]) == "development"]
    assert len(development) < len(rows)
    assert sorted(held) == sorted(tok(r["prompt"])["input_ids"] for r in development[:4])
    calibration = probe_prompts(profile.model_copy(update={"training": JFTrainConfig(tpf_probe_prompts=4)}), tok)
    assert len(calibration) == 4 and not set(map(tuple, calibration)) & set(map(tuple, held))


def test_a_trained_models_evaluation_carries_its_input_models_untrained_anchors(profile, tmp_path):
    """Issue 69: beside the trained model's rows, in the same run, its input model decoded by HF prompt lookup and
    by our decoder with the config the same tune found on it (tuned once, outside the input model's directory),
    each checked against the input model's own greedy AR (here the two models' texts differ, so anchors compared
    with the trained model's AR would fail the fp32 check)."""
    from jf_core.decoding import ar_decode
    from jf_core.evaluation.evaluate import eval_set
    from jf_core.evaluation.method import ANCHOR_KINDS, AR_CONTROL, UNTRAINED, Method
    from jf_core.model_dir import model_fingerprint
    from jf_core.models import load_model, stop_tokens
    from jf_core.round.paths import eval_path, untrained_tune_path
    from jf_core.round.stages import stage_evaluate, stage_tune_untrained, untrained_anchors
    from jf_core.toy.bootstrap import embedded_model
    from jf_core.trajectory.prompts import PromptFormat

    # The "trained" model: the embedded default (the same tokenizer; trained weights, so its greedy texts differ
    # from the random base's, which repeats the prompt's last token).
    trained = embedded_model()
    _, tok = load_model(profile.model.path, dtype="float32")
    other, _ = load_model(str(trained), dtype="float32")
    tune = TuneConfig(
        enabled=True,
        prompts=2,
        grid={"block_size": [4], "num_blocks": [1, 2], "pool_size": [0], "seed_drafts": [False]},
        repeats=1,
        crossover_batch_sizes=[1, 2],
    )
    evaluation = profile.evaluation.model_copy(
        update={"num_prompts": 3, "speed_prompts": 2, "repeats": 1, "block_sizes": [4], "max_new_tokens": 12}
    )
    p = profile.model_copy(
        update={
            "evaluation": evaluation.model_copy(update={"tune": tune}),
            "storage": profile.storage.model_copy(update={"runs_dir": str(tmp_path / "runs")}),
        }
    )
    base, before = p.model.path, model_fingerprint(p.model.path)
    base_m, _ = load_model(base, dtype="float32")
    found = stage_tune_untrained(p, base)
    assert untrained_tune_path(p, base).is_file() and model_fingerprint(base) == before  # the base is not written
    again: list[str] = []
    assert stage_tune_untrained(p, base, on_reuse=again.append) == found  # tuned once
    assert again and again[0].startswith(f"reusing the untrained tune of {base}")
    anchors = untrained_anchors(p, base, found)
    assert anchors.tuned.block_size == 4 and anchors.tuned.max_new_tokens == 12
    result = stage_evaluate(p, str(trained), untrained=anchors)
    rows = {r.name for r in result.rows() if r.method.model == UNTRAINED}
    assert rows == {"base_ar", "base_hf_prompt_lookup", "base_tuned"}
    assert all(r.identical_fraction == 1.0 for r in result.rows())  # each against its own model's AR
    prompts = eval_set(p.evaluation, tok, PromptFormat.of(p.prompts), part="confirmation").prompts
    texts = [ar_decode(m, prompts, max_new_tokens=12, stop=stop_tokens(m, tok)).sequences for m in (base_m, other)]
    assert texts[0] != texts[1]  # so an anchor compared with the trained model's AR would have failed
    assert result.row(Method("ar", model=UNTRAINED)).tpf == 1.0
    best = max((result.row(Method(k, model=UNTRAINED)) for k in ANCHOR_KINDS), key=lambda r: r.tps)
    assert result.best_untrained == best and result.speedup_vs_untrained == result.headline.tps / best.tps
    assert result.metrics()["speedup_vs_untrained"] == result.speedup_vs_untrained
    # How far the ratio could land on other prompts: a paired bootstrap over the batches both rows decoded, kept
    # through the evaluation's JSON, logged and printed with the ratio.
    low, high = result.versus().interval
    assert low <= high and len(result.headline.batch_seconds) == len(best.batch_seconds) == 2
    assert (result.metrics()["speedup_vs_untrained_low"], result.metrics()["speedup_vs_untrained_high"]) == (low, high)
    assert type(result).model_validate(result.model_dump(mode="json")).versus().interval == (low, high)
    assert f"{low:.2f}-{high:.2f} over resampled prompts (95%)" in result.versus().line(None)
    # The spread: the widest AR-against-AR pair of the run: the control, the input model's AR (same shapes), and its
    # tuned row where the tune's crossover sent every batch to AR (the random base accepts next to nothing).
    tuned = result.row(Method("tuned", model=UNTRAINED))
    pairs = [result.row(AR_CONTROL), result.row(Method("ar", model=UNTRAINED))]
    pairs += [tuned] if tuned.ar_share == 1.0 else []
    assert result.timing_spread == max(abs(r.speedup_vs_ar - 1.0) for r in pairs)
    # Kept apart from the same model's evaluation without anchors (another measurement, another file).
    assert eval_path(p, str(trained)) != eval_path(p, str(trained), {"anchors": "x"})
    plain = stage_evaluate(p, str(trained))
    assert plain.best_untrained is None and plain.speedup_vs_untrained is None
    off = p.model_copy(update={"evaluation": p.evaluation.model_copy(update={"untrained": False})})
    assert stage_tune_untrained(off, base) is None and untrained_anchors(off, base, found) is None


def test_the_input_models_evaluation_is_read_from_the_trained_models_where_its_one_pass_scores_the_rows(
    profile, tmp_path
):
    """Issue 70 (a round mostly training): where the trained model's evaluation scores every row in one pass at one
    block size, its untrained rows carry the input model's plain Jacobi too, and the input model's evaluation is
    read from them: the same accuracy, TPF, headline, decode config and output statistics as an evaluation of the
    input model of its own, its speedups against its own AR. Where the speed pass is a pass of its own (the anchors
    unscored), there is no such row and nothing to read: the input model is evaluated apart."""
    from jf_core.evaluation.anchors import Untrained
    from jf_core.evaluation.gate import decode_key
    from jf_core.evaluation.method import UNTRAINED
    from jf_core.round.stages import stage_evaluate
    from jf_core.toy.bootstrap import embedded_model

    trained, base = str(embedded_model()), profile.model.path
    one_pass = profile.evaluation.model_copy(
        update={
            "num_prompts": 3,
            "speed_prompts": 3,
            "batch_size": 1,
            "speed_batch_size": 1,
            "repeats": 1,
            "block_sizes": [4],
            "max_new_tokens": 12,
        }
    )
    p = profile.model_copy(
        update={
            "evaluation": one_pass,
            "storage": profile.storage.model_copy(update={"runs_dir": str(tmp_path / "runs")}),
        }
    )
    assert p.evaluation.reads_input_model
    result = stage_evaluate(p, trained, untrained=Untrained(base))
    assert result.row(jacobi(4, UNTRAINED)).accuracy is not None
    found, own = result.input_evaluation(), stage_evaluate(p, base)
    assert found is not None and found.model is None and found.eval_seconds == 0.0
    assert set(found.methods) == {AR.label, jacobi(4).label} and found.headline_method == own.headline_method
    assert (found.accuracy, found.tpf) == (own.accuracy, own.tpf)
    assert found.headline.output_stats == own.headline.output_stats  # what the gate's degeneracy checks read
    assert found.headline.first_divergence == own.headline.first_divergence
    assert decode_key(found.decode_config) == decode_key(own.decode_config)
    base_ar = result.row(AR.of(UNTRAINED)).tps
    assert found.row(AR).speedup_vs_ar == 1.0 and found.headline.tps == result.row(jacobi(4, UNTRAINED)).tps
    assert found.headline.speedup_vs_ar == result.row(jacobi(4, UNTRAINED)).tps / base_ar
    # A speed pass of its own: the anchors are timed, not scored, so the input model is evaluated apart.
    apart = p.model_copy(update={"evaluation": one_pass.model_copy(update={"speed_prompts": 2})})
    assert not apart.evaluation.reads_input_model
    timed = stage_evaluate(apart, trained, untrained=Untrained(base))
    assert jacobi(4, UNTRAINED).label not in timed.methods and timed.input_evaluation() is None
    two_sizes = p.model_copy(update={"evaluation": one_pass.model_copy(update={"block_sizes": [4, 8]})})
    assert not two_sizes.evaluation.reads_input_model  # the input model's n would be chosen on calibration prompts


def test_an_adapter_models_evaluation_times_its_decoding_without_the_adapter(profile, tmp_path):
    """Issue 69: a round's model keeps a draft adapter and a corpus made from the same trajectories, so "is it the
    training?" needs the same decoding without the adapter, timed in the same run: the input model with the trained
    model's corpus and tuned config (`no_adapter_tuned`), every output the input model's greedy text. The headline
    over it is `speedup_vs_no_adapter`; a model without an adapter gets no such row."""
    import torch

    from jf_core.decoding import JFDecodeConfig, ar_decode, decode
    from jf_core.decoding.proposers.suffix import save_corpus
    from jf_core.draft_adapter.adapter import FILE, adapter_file, attach_draft_adapter, base_state_dict
    from jf_core.draft_adapter.config import DraftLora
    from jf_core.evaluation.anchors import Untrained
    from jf_core.evaluation.evaluate import eval_set, evaluate_profile
    from jf_core.evaluation.method import NO_ADAPTER
    from jf_core.evaluation.results import Evaluation, adapter_part
    from jf_core.model_dir import save_model_dir
    from jf_core.models import load_model, stop_tokens
    from jf_core.toy.bootstrap import embedded_model
    from jf_core.trajectory.prompts import PromptFormat

    base = str(embedded_model())
    model, tok = load_model(base, dtype="float32")
    stop = stop_tokens(model, tok)
    evaluation = profile.evaluation.model_copy(
        update={"num_prompts": 3, "speed_prompts": 3, "repeats": 1, "block_sizes": [4], "max_new_tokens": 12}
    )
    p = profile.model_copy(update={"evaluation": evaluation})
    prompts = eval_set(p.evaluation, tok, PromptFormat.of(p.prompts), part="confirmation").prompts
    answers = ar_decode(model, prompts, max_new_tokens=12, stop=stop).sequences
    adapter = attach_draft_adapter(model, DraftLora(rank=4))
    with torch.no_grad():  # drafts of its own (the base still verifies each)
        for b in adapter.b.values():
            b.normal_(0, 0.5, generator=torch.Generator().manual_seed(0))
    drafted = tmp_path / "drafted"
    save_model_dir(model, drafted, tokenizer=tok, state_dict=base_state_dict(model),
                   extra_tensors={FILE: adapter_file(adapter)})  # fmt: skip
    save_corpus(answers, drafted)  # as a round keeps its trajectories' greedy answers
    config = JFDecodeConfig(block_size=4, num_blocks=1, pool_size=0, suffix=4, max_new_tokens=12)
    result = evaluate_profile(str(drafted), p, untrained=Untrained(base), tuning=(config, None))
    row = result.row(TUNED.of(NO_ADAPTER))
    assert row.name == "no_adapter_tuned" and row.identical_fraction == 1.0
    assert result.headline.identical_fraction == 1.0
    assert result.speedup_vs_no_adapter == result.headline.tps / row.tps
    assert result.metrics()["speedup_vs_no_adapter"] == result.speedup_vs_no_adapter
    assert result.draft_adapter and not result.adapter_left_out and result.metrics()["adapter_in_headline"] == 1.0
    assert adapter_part(result.speedup_vs_no_adapter, result.adapter_left_out).startswith(
        f"{result.speedup_vs_no_adapter:.2f}x the same decoding without its draft adapter"
    )
    assert row not in result.untrained_rows  # the corpus is the round's: not what a user has without one
    # It drafts from the trained model's corpus (the input model keeps none): more tokens a forward than without.
    plain, _ = load_model(base, dtype="float32")
    without = decode(plain, prompts, config, stop=stop)
    assert row.tpf > without.stats.tpf, (row.tpf, without.stats.tpf)
    alone = evaluate_profile(base, p, untrained=Untrained(base), tuning=(config, None))
    assert alone.speedup_vs_no_adapter is None and not [r for r in alone.rows() if r.method.model == NO_ADAPTER]
    assert not alone.draft_adapter and "adapter_in_headline" not in alone.metrics()
    assert adapter_part(alone.speedup_vs_no_adapter, alone.adapter_left_out) == ""
    # A tuned config that leaves the adapter out decodes as the row would: the same decoding is not timed twice.
    left_out = evaluate_profile(
        str(drafted), p, untrained=Untrained(base), tuning=(replace(config, adapter=False), None)
    )
    assert left_out.speedup_vs_no_adapter is None and not [r for r in left_out.rows() if r.method.model == NO_ADAPTER]
    # ...and the report says that the adapter was left out, so the speed is not read as its training's.
    assert left_out.adapter_left_out and left_out.metrics()["adapter_in_headline"] == 0.0
    assert "leaves the draft adapter out" in adapter_part(left_out.speedup_vs_no_adapter, left_out.adapter_left_out)
    assert Evaluation.model_validate_json(left_out.model_dump_json()).adapter_left_out  # the round's cached JSON


def test_an_evaluation_in_a_fresh_process_measures_what_it_measures_here(profile, tmp_path):
    """`evaluation.fresh_process` moves the timed work into a new process (a process that has trained times
    drafters slow: jf_core/round/fresh.py); what it measures besides time, and the progress it says, are the same."""
    from jf_core.round.stages import stage_evaluate

    evaluation = profile.evaluation.model_copy(
        update={"num_prompts": 2, "speed_prompts": 1, "repeats": 1, "block_sizes": [4], "max_new_tokens": 8}
    )
    runs = profile.storage.model_copy(update={"runs_dir": str(tmp_path)})
    results, said = {}, {}
    for fresh in (True, False):
        p = profile.model_copy(
            update={"evaluation": evaluation.model_copy(update={"fresh_process": fresh}), "storage": runs}
        )
        said[fresh] = []
        results[fresh] = stage_evaluate(p, p.model.path, progress=said[fresh].append)
    here, there = results[False], results[True]
    assert there.accuracy == here.accuracy and there.tpf == here.tpf
    assert {k: (m.tpf, m.identical_fraction) for k, m in there.methods.items()} == {
        k: (m.tpf, m.identical_fraction) for k, m in here.methods.items()
    }
    assert len(said[True]) == len(said[False]) > 0


def test_a_round_weighs_the_students_its_text_proposers_guess(profile, tmp_path):
    """`training.guessed_weight` < 1 reaches the round's batches (jf_core/round/training.py): from the same draws
    and batches, the first step's consistency count is the students' summed weight, below the unweighted count,
    and the field joins the round's key only where it is set."""
    from jf_core.draft_adapter.config import DraftLora
    from jf_core.round.collection import collect_in_process
    from jf_core.round.paths import training_identity
    from jf_core.round.stages import stage_pack, stage_train, stage_trajectories

    storage = profile.storage.model_copy(update={"runs_dir": str(tmp_path)})
    training = JFTrainConfig(
        steps=1, warmup_steps=0, batch_size=2, checkpoint_every=100, draft_lora=DraftLora(rank=2, alpha=4),
        packing="spans", mask="clean_context", draft_span=3, state_pick="each_visit",
    )  # fmt: skip
    plain = profile.model_copy(update={"training": training, "storage": storage})
    weighed = plain.model_copy(update={"training": training.model_copy(update={"guessed_weight": 0.25})})
    assert "guessed_weight" not in training_identity(plain) and training_identity(weighed)["guessed_weight"] == 0.25

    def first_step(prof) -> dict:
        paths = round_paths(prof, prof.model.path)
        packed = stage_pack(prof, paths, stage_trajectories(prof, prof.model.path, paths, collect=collect_in_process))
        return stage_train(prof, prof.model.path, paths, packed, progress=False).history[0]

    want, got = first_step(plain), first_step(weighed)
    # Each student weighs 1 or 0.25: the sum lies between a quarter of the count and the count.
    assert 0.25 * want["consistency_positions"] <= got["consistency_positions"] < want["consistency_positions"]
