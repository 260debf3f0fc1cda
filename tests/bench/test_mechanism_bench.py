"""bench/mechanism.py's model doors: a GPU round's timing rehearsal builds the model's shape with random weights from
its config and tokenizer alone."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from bench.mechanism import _random_weights
from jf_core.models import load_model


def test_random_weights_need_only_config_and_tokenizer(profile, tmp_path):
    source = Path(profile.model.path)
    shape = tmp_path / "shape"
    shape.mkdir()
    for f in source.iterdir():
        if not f.name.endswith(".safetensors") and f.name != "checksums.sha256":
            shutil.copy(f, shape / f.name)
    out = _random_weights(str(shape))
    assert _random_weights(str(shape)) == out  # built once, beside the shape
    real, _ = load_model(str(source))
    rand, tok = load_model(out)
    assert rand.config.to_dict()["num_hidden_layers"] == real.config.num_hidden_layers
    shapes = {k: v.shape for k, v in real.state_dict().items()}
    assert {k: v.shape for k, v in rand.state_dict().items()} == shapes
    assert torch.isfinite(torch.cat([v.flatten().float() for v in rand.state_dict().values()])).all()
    assert (Path(out) / "checksums.sha256").is_file() and not list(shape.glob("*.safetensors"))
    assert tok.eos_token_id is not None


def test_tpf_against_tokens_puts_each_probe_at_its_training_tokens():
    """The curve's x axis: a probe after k steps of a run of S steps and T packed tokens sits at k*T/S tokens."""
    from jf_core.evaluation.plots import tpf_against_tokens

    history = [{"step": 0.0, "loss": 3.0}, {"step": 1.0, "probe_tpf_n16": 1.1}, {"step": 3.0, "probe_tpf_n16": 1.4}]
    fig = tpf_against_tokens([{"variant": "both", "train_tokens": 4000, "history": history}])
    (line,) = fig.axes[0].get_lines()
    assert list(line.get_xdata()) == [2000.0, 4000.0] and list(line.get_ydata()) == [1.1, 1.4]
    assert fig.axes[0].get_xscale() == "log"
    assert tpf_against_tokens([{"variant": "x", "train_tokens": 10, "history": history[:1]}]) is None


def test_mechanism_rows_go_to_mlflow_with_the_curve_by_step(profile, tmp_path, monkeypatch):
    """`--mlflow` (or `--from-json FILE --mlflow` for rows a GPU machine wrote): a run per row in a real MLflow
    store, its figures as metrics, its probes as a curve by step with the packed tokens at each, the plot attached."""
    from mlflow.tracking import MlflowClient

    from bench.mechanism import log_to_mlflow

    monkeypatch.setenv("JF_HOME", str(tmp_path / "home"))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    p = profile.model_copy(update={"registry": profile.registry.model_copy(update={"tracking_uri": uri})})
    figures = {"tpf": 1.3, "identical_to_own_ar": 1.0, "identical_to_base": 0.5, "repetition": 0.2, "mean_length": 9}
    history = [{"step": 0.0, "loss": 3.0}, {"step": 1.0, "probe_tpf_n16": 1.1}, {"step": 3.0, "probe_tpf_n16": 1.4}]
    row = {"variant": "both", "overrides": {"mask": "clean_context"}, "trained": figures, "held_out": figures,
           "train_seconds": 5.0, "train_tokens": 4000, "history": history}  # fmt: skip
    plot = tmp_path / "curve.png"
    plot.write_bytes(b"png")
    (run_id,) = log_to_mlflow(p, [row], plot, source="test")
    client = MlflowClient(uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["jf.kind"] == "mechanism"
    assert run.data.params["mask"] == '"clean_context"' and run.data.metrics["held_out.tpf"] == 1.3
    curve = client.get_metric_history(run_id, "probe_tpf_n16")
    assert [(m.step, m.value) for m in curve] == [(1, 1.1), (3, 1.4)]
    assert [m.value for m in client.get_metric_history(run_id, "probe_tokens")] == [2000.0, 4000.0]
    assert [a.path for a in client.list_artifacts(run_id)] == ["curve.png"]


def test_mechanism_answers_are_scored_against_their_own_rows(profile, tmp_path):
    """Accuracy beside TPF: each trained and held-out question's answer is scored against its own row of the
    prompt file (GSM8K: the final number), found by the prompt id the questions were loaded under."""
    import json

    from bench.mechanism import _scoring
    from jf_core.trajectory.prompts import load_prompts

    rows = [{"question": f"What is {i} plus 2?", "answer": f"{i} + 2 = {i + 2}\n#### {i + 2}"} for i in range(40)]
    (tmp_path / "q.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    prompts = profile.prompts.model_copy(
        update={
            "source": str(tmp_path / "q.jsonl"),
            "text_field": "question",
            "hash_splits": {"train": 0.5, "test": 0.5},
        }
    )
    p = profile.model_copy(
        update={"prompts": prompts, "evaluation": profile.evaluation.model_copy(update={"benchmark": "gsm8k"})}
    )
    _, tok = load_model(profile.model.path)
    train = load_prompts(prompts.model_copy(update={"split": "train", "limit": 3}), tok).items
    held = load_prompts(prompts.model_copy(update={"split": "test", "limit": 3}), tok).items
    (train_refs, held_refs), correct = _scoring(p, tok, train, held)
    assert (
        len(train_refs) == 3
        and len(held_refs) == 3
        and not {r["question"] for r in train_refs} & {r["question"] for r in held_refs}
    )
    for row in train_refs + held_refs:
        n = int(row["answer"].rsplit("#### ", 1)[1])
        assert correct(tok(f"The answer is {n}.")["input_ids"], row)
        assert not correct(tok(f"The answer is {n + 1}.")["input_ids"], row)
    assert _scoring(p.model_copy(update={"evaluation": p.evaluation.model_copy(update={"benchmark": "humaneval"})}),
                    tok, train, held) == (None, None)  # fmt: skip
    # Questions written by prompts.number_variants have no reference: the trained set goes unscored, not misscored.
    grown = p.model_copy(update={"prompts": prompts.model_copy(update={"number_variants": 2})})
    variants = load_prompts(grown.prompts.model_copy(update={"limit": 6}), tok).items
    (train_refs, held_refs), _ = _scoring(grown, tok, variants, held)
    assert train_refs is None and len(held_refs) == 3


def test_the_curves_fits_name_the_budget_for_each_target_beside_what_a_probe_measured():
    """`--from-json FILE` prints each probed curve fitted in both forms: the tokens to TPF 1.5 and 2.0 with an
    interval, beside the first probe that measured them (the fits are jf_core/evaluation/growth.py's)."""
    from bench.mechanism import format_growth, growth

    history = [{"step": float(s - 1), "probe_tpf_n16": 1.0 + 0.5 * s / 8} for s in range(1, 9)]  # 1 per 8e3 tokens
    fits = growth([{"variant": "v", "train_tokens": 8000, "history": history}])
    assert [(f["probe"], f["form"]) for f in fits] == [("probe_tpf_n16", "log10"), ("probe_tpf_n16", "linear")]
    line = fits[1]
    assert line["r2"] > 0.999 and abs(line["slope"] - 62.5) < 1e-6  # 0.5 TPF per 8e3 tokens, per 1e6
    assert line["measured_1.5"] == 8000 and line["measured_2.0"] is None
    estimate, low, high = line["tpf_2.0"]
    assert abs(estimate - 16000) < 1e-3 and low <= estimate <= high
    assert "| v | n16 | linear |" in format_growth(fits)
    assert growth([{"variant": "v", "train_tokens": 8000, "history": history[:2]}]) == []  # 2 probes: no fit
