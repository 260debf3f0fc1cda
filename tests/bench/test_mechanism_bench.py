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
