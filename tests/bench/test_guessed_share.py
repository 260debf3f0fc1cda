"""bench/guessed_share.py: the share of a round's students at each depth that the text proposers already guess."""

from __future__ import annotations

import json
from dataclasses import asdict

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jf_core.training.packing import PackedExample


def test_it_counts_the_students_prompt_lookup_guesses_by_depth(tmp_path):
    from bench.guessed_share import main

    # The answer copies 40 41 42 43 from its prompt, then writes 9 10 11 12. Block 0's noisy copy departs at
    # offset 1: its root is 41, from which the lookup guesses 42 43 44 (the answer goes 42 43 9): depths 1 and 2
    # guessed, 3 not. Block 1's departs at 0: its root 9 was never seen before, so none of its three is.
    clean = [[40, 41, 42, 43], [9, 10, 11, 12]]
    noisy = [[40, 99, 98, 97], [99, 98, 97, 96]]
    ex = PackedExample(
        "q", [3, 40, 41, 42, 43, 44, 4], 4, noisy, clean, [4, 4], [[n, c] for n, c in zip(noisy, clean, strict=True)]
    )
    record = {k: v for k, v in asdict(ex).items() if k != "extra_noisy"}
    pq.write_table(pa.Table.from_pylist([record]), tmp_path / "examples.parquet")
    out = tmp_path / "share.json"
    main(["--packed", str(tmp_path / "examples.parquet"), "--span", "3", "--json", str(out)])
    rows = json.loads(out.read_text())
    assert rows["roots"] == 2
    assert {k: (v["students"], v["guessed"]) for k, v in rows["by_depth"].items()} == {
        "1": (2, pytest.approx(0.5)),
        "2": (2, pytest.approx(0.5)),
        "3": (2, 0.0),
    }
