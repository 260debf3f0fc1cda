"""bench/context_store_hits.py: how often a run's visits find their context kept, under the store's rule and under
the least-recently-seen eviction it replaced."""

from __future__ import annotations

import json
from dataclasses import asdict

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from jf_core.training.packing import PackedExample

SHAPE = {"layers": 2, "kv_heads": 1, "head_dim": 4, "hidden": 8,
         "dtypes": {"keys": "float32", "values": "bfloat16", "hidden": "float32"}}  # fmt: skip
ONE = 8 * (2 * 4 * 4 + 2 * 4 * 2 + 8 * 4)  # bytes of an 8-position context of SHAPE: 8 positions x 112 bytes


def _examples(count: int) -> list[PackedExample]:
    """`count` examples of equal context: a 4-token prompt and one block of 4 (8 positions)."""
    return [PackedExample(f"q{i}", [1, 2, 3, 4], 4, [[5, 9, 9, 9]], [[5, 6, 7, 8]], [4], [[[5, 9, 9, 9], [5, 6, 7, 8]]])
            for i in range(count)]  # fmt: skip


def test_a_context_is_the_size_the_base_pass_leaves_it():
    from bench.context_store_hits import shaped_context

    context = shaped_context(_examples(1)[0].context_length, **SHAPE)
    assert len(context) == 8 and context.nbytes == ONE and context.keys[0].dtype == torch.float32
    assert context.values[0].dtype == torch.bfloat16 and context.hidden.device.type == "meta"


def test_the_store_keeps_a_fixed_share_where_the_old_rule_thrashed():
    from bench.context_store_hits import replay

    examples = _examples(12)
    # Room for everything: both rules hit every visit after an example's first.
    roomy = replay(examples, 12 * ONE, 36, seed=0, shape=SHAPE)
    assert roomy["hits_kept"] == roomy["hits_least_recent_dropped"] == 36 - 12
    # Room for none: no hits.
    none = replay(examples, ONE - 1, 36, seed=0, shape=SHAPE)
    assert none["hits_kept"] == none["hits_least_recent_dropped"] == 0 and none["kept_examples"] == 0
    # Room for a third over three epochs: the first four kept hit once in each later epoch (8), where the old rule
    # keeps the last four visited and a new order reaches few of them before they are dropped.
    third = replay(examples, 4 * ONE, 36, seed=0, shape=SHAPE)
    assert third["kept_examples"] == 4 and third["hits_kept"] == 8
    assert third["hits_least_recent_dropped"] < third["hits_kept"]


def _packed(tmp_path) -> str:
    """Three examples written as a run's packed/examples.parquet (the stored fields; the extra copies are drawn)."""
    records = [{k: v for k, v in asdict(ex).items() if k != "extra_noisy"} for ex in _examples(3)]
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "examples.parquet")
    return str(tmp_path / "examples.parquet")


def test_it_reads_a_runs_packed_examples(tmp_path, capsys):
    from bench.context_store_hits import main

    out = tmp_path / "hits.json"
    main(["--packed", _packed(tmp_path), "--memory-mb", "1", "--steps", "3", "--grad-accum", "2", "--json", str(out)])
    rows = json.loads(out.read_text())
    assert rows["visits"] == 6 and rows["hits_kept"] == rows["hits_least_recent_dropped"] == 3
    assert "3 examples, 6 visits" in capsys.readouterr().out


def test_it_times_the_old_rules_eviction_on_real_mappings(tmp_path, capsys):
    from bench.context_store_hits import main

    out = tmp_path / "hits.json"
    main(["--packed", _packed(tmp_path), "--memory-mb", "1", "--steps", "3", "--churn", "5", "--json", str(out)])
    assert json.loads(out.read_text())["churn_ms_a_miss"] > 0
    assert "(8 positions, a full store)" in capsys.readouterr().out
