"""The embedded model: the shipped weights are `jf bootstrap`'s default recipe, a bootstrap learns and makes a
directory that loads as the shipped one does, and the cache key names what trains a different model."""

from __future__ import annotations

import json
import math

from jf_core.threads import cpu_budget
from jf_core.toy.bootstrap import SHIPPED_DIR, BootstrapConfig, BootstrapReport, ensure_embedded_model


def test_the_shipped_weights_are_the_default_recipe_on_two_threads():
    """A changed recipe (task, model, training, seed) must ship new weights: the shipped report's key is the one the
    default config on 2 threads trains, and its accuracy is what the docs promise (1.000 on 500 held-out items)."""
    report = BootstrapReport.read(SHIPPED_DIR)
    assert report.key == BootstrapConfig(threads=2).key()
    assert report.accuracy == 1.0 and report.test_size == 500


def test_a_short_bootstrap_learns_and_loads_as_the_shipped_model_does(tmp_path):
    """`jf bootstrap` still makes the model from scratch: a few dozen steps lower the loss, and its directory holds
    the shipped one's files and loads through the same door, a Qwen2 of the shipped tokenizer."""
    from jf_core.models import load_model
    from jf_core.toy.model import ToyModelConfig
    from jf_core.training.trainer import TrainConfig

    cfg = BootstrapConfig(
        model=ToyModelConfig(hidden_size=32, num_hidden_layers=1, intermediate_size=64),
        train=TrainConfig(steps=40, lr=3e-3, warmup_steps=4, log_every=10),
        train_size=640, test_size=4, batch_size=16, threads=1,
    )  # fmt: skip
    out = ensure_embedded_model(cfg, home=tmp_path, progress=False)
    curve = BootstrapReport.read(out).loss_curve
    vocab = json.loads((out / "config.json").read_text())["vocab_size"]
    assert curve[0][1] > 0.9 * math.log(vocab), curve  # it starts from about a uniform guess over the vocabulary
    assert curve[-1][1] < 0.7 * curve[0][1], curve  # and learns: its loss falls well below that
    shipped = {p.name for p in SHIPPED_DIR.iterdir() if p.is_file()}
    assert shipped <= {p.name for p in out.iterdir()}, "a bootstrap makes every file the package ships"
    model, tok = load_model(str(out), dtype="float32")
    shipped_model, shipped_tok = load_model(str(SHIPPED_DIR), dtype="float32")
    assert type(model) is type(shipped_model) and tok.get_vocab() == shipped_tok.get_vocab()
    assert json.loads((out / "config.json").read_text())["vocab_size"] == shipped_model.config.vocab_size


def test_the_thread_count_is_part_of_the_key():
    """1 and 2 threads train models that differ in their last bits, so they must not share a cache entry."""
    assert BootstrapConfig(threads=1).key() != BootstrapConfig(threads=2).key()
    assert BootstrapConfig().key() == BootstrapConfig(threads=cpu_budget()).key()  # None: every CPU it may use
    assert BootstrapConfig().train_threads() == cpu_budget()


def test_a_bootstrap_reports_its_steps_to_a_caller_that_shows_no_bar(tmp_path, capsys):
    """A flow's task passes `on_log`: the training's logged rows reach it, and no terminal bar is drawn."""
    from jf_core.toy.model import ToyModelConfig
    from jf_core.training.trainer import TrainConfig

    cfg = BootstrapConfig(
        model=ToyModelConfig(hidden_size=16, num_hidden_layers=1, intermediate_size=32),
        train=TrainConfig(steps=4, lr=3e-3, warmup_steps=1, log_every=2),
        train_size=64, test_size=4, batch_size=8, threads=1,
    )  # fmt: skip
    rows = []
    out = ensure_embedded_model(cfg, home=tmp_path, progress=False, on_log=lambda step, row: rows.append(step))
    assert (out / "bootstrap.json").is_file() and rows == [0, 2, 3]  # every log_every steps, and the last
    assert "train:" not in capsys.readouterr().err
    assert ensure_embedded_model(cfg, home=tmp_path, on_log=lambda *_: rows.append("again")) == out  # cached
    assert "again" not in rows


HOLDER = """
import sys, time
from pathlib import Path
from jf_core.toy.bootstrap import exclusive
out = Path(sys.argv[1])
with exclusive(out):
    print("holding", flush=True)
    time.sleep(3)
    out.mkdir(parents=True)
    (out / "bootstrap.json").write_text("made by the first process")
"""


def test_a_second_process_waits_for_the_bootstrap_and_reuses_its_model(tmp_path, capsys):
    """Two processes need the same embedded model at once (a CI warm-up and the tests, two `jf run`s): the second
    waits for the first's lock and takes its model, instead of training the same one again."""
    import subprocess
    import sys
    import time

    from jf_core.toy.bootstrap import embedded_model_dir
    from jf_core.toy.model import ToyModelConfig
    from jf_core.training.trainer import TrainConfig

    cfg = BootstrapConfig(
        model=ToyModelConfig(hidden_size=16, num_hidden_layers=1, intermediate_size=32),
        train=TrainConfig(steps=2, lr=3e-3, warmup_steps=1), train_size=16, test_size=2, batch_size=8, threads=1,
    )  # fmt: skip
    out = embedded_model_dir(cfg, tmp_path)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "holding"
    started = time.monotonic()
    assert ensure_embedded_model(cfg, home=tmp_path, progress=True) == out
    assert time.monotonic() - started > 1.0 and holder.wait(timeout=30) == 0
    assert (out / "bootstrap.json").read_text() == "made by the first process"  # not trained a second time
    assert f"waiting for another process's bootstrap of {out}" in capsys.readouterr().out
