"""`jf bench serve`'s load test on the embedded model, small: one Serve hosts /auto, /jacobi and /ar; each level's
requests all get exactly one complete answer, the three methods' texts agree, the table reports every row with the
batches each server decoded, and `check` names a lost request or a disagreement."""

from __future__ import annotations

from dataclasses import replace

import pytest

from jacobi_forcing.infra.serve_app import ServeOptions
from jacobi_forcing.infra.serve_bench import bench_serve, check, format_table
from jf_core.toy.task import make_split

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_the_load_test_drives_three_methods_and_checks_every_answer(embedded):
    model, _ = embedded
    options = ServeOptions(model_path=model.name_or_path, name="bench", max_batch=4, max_tokens_limit=256)
    prompts = [e.prompt for e in make_split("test", 6)]
    results = bench_serve(options, prompts, clients=[1, 4], requests_per_level=8, max_tokens=48, progress=lambda _: 0)
    assert [(r.clients, r.mode) for r in results] == [(c, m) for c in (1, 4) for m in ("auto", "jacobi", "ar")]
    assert all(r.completed == r.requests == 8 and r.tokens > 0 for r in results)
    assert check(results) == []
    by = {(r.clients, r.mode): r for r in results}
    assert by[(1, "jacobi")].texts == by[(1, "ar")].texts == by[(1, "auto")].texts
    # Two runs per level (warm-up + 1) of 8 requests: the forced servers decoded only their own way.
    assert by[(1, "jacobi")].batches == {"jacobi": 16, "ar": 0} and by[(1, "ar")].batches == {"jacobi": 0, "ar": 16}
    assert 4 <= sum(by[(4, "auto")].batches.values()) < 16  # batched: fewer batches than requests
    table = format_table(results)
    assert table.count("\n") == 2 + len(results) - 1 and "| 4 | ar |" in table

    lost = [replace(results[0], completed=7), *results[1:]]
    assert check(lost) == ["auto at 1 clients: 1 lost"]
    wrong = [replace(r, texts=["x", *r.texts[1:]]) if r.mode == "jacobi" else r for r in results]
    assert check(wrong) == [
        "jacobi at 1 clients: texts differ from AR's",
        "jacobi at 4 clients: texts differ from AR's",
    ]
