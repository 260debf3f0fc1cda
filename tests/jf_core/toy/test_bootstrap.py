"""The embedded model's cache key: what trains a different model names a different directory."""

from __future__ import annotations

from jf_core.threads import cpu_budget
from jf_core.toy.bootstrap import BootstrapConfig, ensure_embedded_model


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
