"""`jf eval`, `jf bench decode` and `jf tune` on a profile: its benchmark and prompt source, not the toy task's."""

from __future__ import annotations

import json

import pytest
import yaml

from jf_cli.main import main
from tests.conftest import serving_prior

pytestmark = pytest.mark.timeout(600)


@pytest.fixture()
def profile_yaml(profile, tmp_path):
    # 12 questions: 7 in the confirmation half `jf eval` and `jf bench decode` read, 5 in the development half.
    rows = [{"question": f"What is {i} + 2?", "answer": f"#### {i + 2}"} for i in range(12)]
    (tmp_path / "gsm8k.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = profile.model_dump(mode="json")
    data["evaluation"].update(
        benchmark="gsm8k",
        source=str(tmp_path / "gsm8k.jsonl"),
        template="Q: {question} A:",
        max_new_tokens=12,
        repeats=1,
        tune={"prompts": 3},
    )
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_eval_uses_the_profiles_benchmark(profile_yaml, tmp_path, capsys):
    out = tmp_path / "eval.json"
    code = main(["eval", "--profile", profile_yaml, "--limit", "4", "--block-sizes", "4", "8", "--json", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "gsm8k: accuracy" in printed and "chosen on calibration prompts" in printed
    data = json.loads(out.read_text())
    assert data["meta"]["result"]["items"] == 4
    assert set(data["methods"]) == {"ar", "ar_control", "jacobi_n4", "jacobi_n8"}
    assert all(m["identical_fraction"] == 1.0 for m in data["methods"].values())


def test_eval_holds_a_trained_model_to_its_input_models_untrained_decoding(profile, profile_yaml, tmp_path, capsys):
    """`--untrained-from`: the round's evaluation of a trained model, its input model's anchors timed beside it, each
    checked against that model's own AR (the two models' texts differ here)."""
    from jf_core.toy.bootstrap import embedded_model

    out = tmp_path / "eval.json"
    argv = ["eval", "--profile", profile_yaml, "--model", str(embedded_model()), "--untrained-from", profile.model.path]
    argv += ["--limit", "4", "--block-sizes", "4", "--batch-size", "1"]  # one pass: the input model's rows scored
    assert main([*argv, "--json", str(out)]) == 0
    assert "the best untrained decoding of the input model (base_" in capsys.readouterr().out
    methods = json.loads(out.read_text())["methods"]
    assert {"ar", "base_ar", "base_hf_prompt_lookup", "base_jacobi_n4"} <= set(methods)
    assert all(m["identical_fraction"] == 1.0 for m in methods.values())


def test_bench_decode_adds_hf_rows_on_the_profiles_prompts(profile_yaml, tmp_path, capsys):
    out = tmp_path / "bench"
    argv = ["bench", "decode", "--profile", profile_yaml, "--num-prompts", "3", "--repeats", "1"]
    assert main([*argv, "--block-sizes", "4", "--batch-size", "2", "--out", str(out)]) == 0
    data = json.loads((out / "bench.json").read_text())
    assert set(data["methods"]) == {"ar", "ar_control", "jacobi_n4", "hf_generate", "hf_prompt_lookup"}
    assert data["meta"]["benchmark"] == "gsm8k" and data["meta"]["batch_size"] == 2
    assert data["methods"]["hf_generate"]["identical_fraction"] == 1.0  # plain greedy, like our AR
    assert (out / "bench.md").is_file() and "hf_prompt_lookup" in capsys.readouterr().out


def test_bench_decode_per_batch_size_with_a_sampling_jf_model(profile, profile_yaml, tmp_path, capsys):
    """`--batch-sizes`: one table and folder per size; the JF rows sample (`--temperature`) and stay identical to
    their own AR sampler; the autotuned row runs AR above the model's stored crossover."""
    import shutil

    from jf_core.decoding.multiblock import JFDecodeConfig
    from jf_core.model_dir import save_decode_config, update_block

    jf = tmp_path / "jf"
    shutil.copytree(profile.model.path, jf)
    save_decode_config(jf, JFDecodeConfig(block_size=4, num_blocks=2, pool_size=2, max_new_tokens=12))
    update_block(jf, **serving_prior(ar_above_batch=1).block())
    out = tmp_path / "bench"
    argv = ["bench", "decode", "--profile", profile_yaml, "--num-prompts", "4", "--repeats", "1", "--block-sizes", "4"]
    argv += ["--jf-model", str(jf), "--temperature", "2", "--top-k", "20", "--batch-sizes", "1", "2", "--out", str(out)]
    argv += ["--min-seconds", "0.05"]  # runs until each method has 50 ms timed: these batches take a few ms
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "## batch size 1" in printed and "## batch size 2" in printed
    one, two = (json.loads((out / f"batch{b}" / "bench.json").read_text()) for b in (1, 2))
    assert one["meta"]["batch_size"] == 1 and two["meta"]["jf_sampling"]["temperature"] == 2.0
    assert one["meta"]["min_timed_seconds"] == 0.05 and one["meta"]["repeats"] == 1
    for data in (one, two):
        jf_rows = {k: v for k, v in data["methods"].items() if k.startswith("jf_")}
        assert "jf_autotuned" in jf_rows and all(m["identical_fraction"] == 1.0 for m in jf_rows.values())
    assert two["methods"]["jf_autotuned"]["tpf"] == two["methods"]["jf_ar"]["tpf"]  # batch 2 > the crossover: AR
    # The trained model's dispatched row against the base's best untrained decoder, in the same run (the profile
    # does not tune, so the base's anchor is HF prompt lookup alone).
    x = one["methods"]["jf_autotuned"]["tps"] / one["methods"]["hf_prompt_lookup"]["tps"]
    assert one["meta"]["best_untrained"] == "hf_prompt_lookup" and one["meta"]["speedup_vs_untrained"] == x
    line = f"jf_autotuned: {x:.2f}x the best untrained decoding of the input model (hf_prompt_lookup; "
    assert line in printed and " over resampled prompts (95%))" in printed.split(line)[1].splitlines()[0]
    assert (out / "speed_against_batch_size.png").stat().st_size > 1000  # the batch sizes' one figure


def test_bench_decode_temperature_needs_a_jf_model(profile_yaml, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["bench", "decode", "--profile", profile_yaml, "--temperature", "1"])
    assert exc.value.code == 2 and "--temperature applies to the --jf-model rows" in capsys.readouterr().err


def test_tune_saves_a_decode_config_from_calibration_prompts(profile, profile_yaml, tmp_path, capsys):
    import shutil

    model = tmp_path / "model"
    shutil.copytree(profile.model.path, model)
    argv = ["tune", "--model", str(model), "--profile", profile_yaml, "--num-prompts", "2", "--repeats", "1"]
    space = ["--grid", "block_size=4", "--grid", "num_blocks=1,2", "--grid", "pool_size=0", "--grid", "spawn_ratio=0.5"]
    space += ["--grid", "adaptive_width=false,true", "--grid", "width_scale=2", "--grid", "width_margin=1"]
    crossover = ["--crossover-batch-sizes", "1", "2"]
    assert main([*argv, *space, "--grid", "seed_drafts=false", "--max-new-tokens", "12", *crossover]) == 0
    block = json.loads((model / "config.json").read_text())["jacobi_forcing"]
    saved = block["decode"]
    assert saved["block_size"] == 4 and saved["num_blocks"] in (1, 2)
    assert not (model / "decode_config.json").exists()  # one place for the decode config: the model's config.json
    # The crossover: AR and the winner taking turns at each batch size, stored with the hardware it ran on.
    assert block["crossover"]["batch_sizes"] == [1, 2] and len(block["crossover"]["speedup_vs_ar"]) == 2
    assert block["hardware"].startswith("CPU") and block["dtype"] == "float32"
    assert block["break_even_tpf"] > 0
    assert "crossover (Jacobi TPS / AR TPS): b1 " in capsys.readouterr().out
    report = json.loads((model / "decode_tuning.json").read_text())
    assert report["calibration_prompts"] == 2 and len(report["trials"]) == 4  # K x (full width, adaptive 2x+1)
    widths = {
        (t["config"]["adaptive_width"], t["config"]["width_scale"], t["config"]["width_margin"])
        for t in report["trials"]
    }
    assert widths == {(False, 1.5, 4), (True, 2.0, 1)}


def test_tune_names_a_grid_field_the_decode_config_does_not_have(profile, profile_yaml, tmp_path, capsys):
    import shutil

    model = tmp_path / "model"
    shutil.copytree(profile.model.path, model)
    with pytest.raises(SystemExit) as exc:
        main(["tune", "--model", str(model), "--profile", profile_yaml, "--grid", "blok_size=4"])
    assert exc.value.code == 2 and "unknown decode config field(s) blok_size" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["tune", "--model", str(model), "--grid", "block_size"])
    assert exc.value.code == 2 and "expected FIELD=V1,V2" in capsys.readouterr().err
