"""The benchmark harness measures what it claims: behaviour only, never wall-clock thresholds."""

from __future__ import annotations

import json

from jf_core.evaluation.speed import bench, format_table, standard_methods, write_json
from tests.conftest import PAD, TINY_MODELS


def test_every_method_runs_and_greedy_methods_agree(tmp_path):
    model = TINY_MODELS["qwen2"]()
    prompts = [[5, 6, 7, 8, 9], [10, 11, 12], [13, 14, 15, 16], [40, 41]]
    methods = standard_methods(model, eos_token_id=2, pad_token_id=PAD, max_new_tokens=24, block_sizes=(8, 16))
    results = bench(methods, prompts, batch_size=2, warmup_prompts=1, scorer=lambda i, seq: len(seq) == 24)
    by_name = {r.method: r for r in results}
    assert list(by_name) == ["hf_generate", "ar", "jacobi_n8", "jacobi_n16", "hf_prompt_lookup"]
    for r in results:
        # every method is greedy and lossless, so all outputs equal HF greedy's
        assert r.identical_fraction == 1.0
        assert r.new_tokens == results[0].new_tokens
        assert r.accuracy == results[0].accuracy
        assert len(r.tpf_per_example) == len(prompts)
        assert r.tps > 0
    # the forward hook counts one prefill + one forward per further token for HF greedy
    assert by_name["hf_generate"].tpf == 1.0 and by_name["ar"].tpf == 1.0
    assert by_name["hf_generate"].speedup_vs_hf_generate == 1.0
    assert by_name["ar"].prefill_seconds is not None and by_name["hf_generate"].prefill_seconds is None
    assert "jacobi_n16" in format_table(results)
    write_json(results, tmp_path / "bench.json", {"note": "test"})
    data = json.loads((tmp_path / "bench.json").read_text())
    for key in ("tpf", "tps", "speedup_vs_hf_generate", "speedup_vs_ar", "identical_fraction", "accuracy"):
        assert key in data["methods"]["jacobi_n8"]
