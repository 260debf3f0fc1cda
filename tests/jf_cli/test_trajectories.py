"""`jf trajectories show|verify` on a store written without Ray."""

from __future__ import annotations

import pytest

from jf_cli.main import main
from jf_core.models import load_model
from jf_core.toy.task import make_split
from jf_core.trajectory.collect import CollectConfig, collect
from jf_core.trajectory.prompts import PromptItem
from jf_core.trajectory.store import TrajectoryStore, write_shard
from tests.jf_core.test_models import save_tiny


@pytest.fixture
def store_dir(tmp_path):
    save_tiny(tmp_path / "m")
    model, tok = load_model(str(tmp_path / "m"))
    prompts = [PromptItem(e.uid, tok(e.prompt)["input_ids"]) for e in make_split("train", 3)]
    result = collect(model, tok, prompts, CollectConfig(block_size=8, max_new_tokens=16), model_hash="h")
    return tmp_path, result.records


def write(root, records):
    store = TrajectoryStore(root / "t")
    store.commit(write_shard(root / "t", "k", records, {}, prompts=3, new_tokens=48, seconds=1.0))
    store.set_meta(model=str(root / "m"))
    return str(root / "t")


def test_show_and_verify(store_dir, capsys):
    root, records = store_dir
    out = write(root, records)
    assert main(["trajectories", "verify", out]) == 0
    assert "fixed points equal greedy AR output (float32) for 3/3 prompts" in capsys.readouterr().out
    assert main(["trajectories", "show", out, "--prompt-id", "train-1"]) == 0
    shown = capsys.readouterr().out
    assert "prompt train-1" in shown and "16/16 converged" not in shown and "8/8 converged" in shown
    assert "implied TPF" in shown


def test_verify_catches_a_wrong_fixed_point(store_dir, capsys):
    root, records = store_dir
    bad = dict(records[1])
    wrong = [(bad["fixed_point"][0])] + [(t + 1) % 200 for t in bad["fixed_point"][1:]]
    bad["states"] = [*bad["states"][:-1], wrong]
    bad["fixed_point"] = wrong
    out = write(root, [records[0], bad, *records[2:]])
    assert main(["trajectories", "verify", out]) == 1
    assert "for 2/3 prompts" in capsys.readouterr().out


def test_show_unknown_prompt_is_named(store_dir, capsys):
    root, records = store_dir
    out = write(root, records)
    with pytest.raises(SystemExit) as exc:
        main(["trajectories", "show", out, "--prompt-id", "nope"])
    assert exc.value.code == 2 and "no prompt 'nope'" in capsys.readouterr().err
