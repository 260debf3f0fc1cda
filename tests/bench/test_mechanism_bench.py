"""bench/mechanism.py's doors: a GPU round's timing rehearsal builds the model's shape with random weights from its
config and tokenizer alone; answers are scored against their own rows; a variant's shorthand is training's."""

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


def test_mechanism_answers_are_scored_against_their_own_rows(profile, tmp_path):
    """Accuracy beside TPF: each trained and held-out question's answer is scored against its own row of the
    prompt file (GSM8K: the final number), found by the prompt id the questions were loaded under."""
    import json

    from bench.mechanism import _scoring
    from jf_core.trajectory.prompts import held_out_source, load_prompts

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
                    tok, train, held) == ((None, None), None)  # fmt: skip
    # Questions written by prompts.number_variants have no reference: the trained set goes unscored, not misscored.
    grown = p.model_copy(update={"prompts": prompts.model_copy(update={"number_variants": 2})})
    variants = load_prompts(grown.prompts.model_copy(update={"limit": 6}), tok).items
    (train_refs, held_refs), _ = _scoring(grown, tok, variants, held)
    assert train_refs is None and len(held_refs) == 3
    # Held-out questions from a file without answers (chat prompts under a GSM8K profile): unscored, not a KeyError.
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps({"question": r["question"]}) + "\n" for r in rows))
    chat = p.model_copy(update={"evaluation": p.evaluation.model_copy(update={"source": str(tmp_path / "chat.jsonl")})})
    chat_held = load_prompts(held_out_source(chat.prompts, chat.evaluation.source, chat.evaluation.split), tok).items
    (train_refs, held_refs), correct = _scoring(chat, tok, train, chat_held[:3])
    assert len(train_refs) == 3 and held_refs is None and correct is not None


def test_a_variant_is_training_fields_or_sections():
    from bench.mechanism import sectioned

    assert sectioned({"lr": 1e-3}) == {"training": {"lr": 1e-3}}
    assert sectioned({"draft_lora": {"rank": 8}}) == {"training": {"draft_lora": {"rank": 8}}}
    both = {"training": {"lr": 1e-3}, "trajectory": {"kind": "synthetic"}}
    assert sectioned(both) == both and sectioned({}) == {"training": {}}
