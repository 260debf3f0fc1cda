"""A draft-only LoRA drafts, the base verifies: Jacobi decoding of a model with a draft adapter is the base model's
greedy output token for token, whatever the adapter holds (jf_core/draft_adapter/)."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

from jf_core.decoding.ar import ar_decode
from jf_core.decoding.common import StopTokens
from jf_core.decoding.jacobi import JacobiConfig, JacobiDecoder, jacobi_decode
from jf_core.decoding.layout import Layout
from jf_core.decoding.multiblock import JFDecodeConfig, jf_decode
from jf_core.decoding.proposers import AdapterChain, Room
from jf_core.decoding.sampling import Sampling
from jf_core.draft_adapter.adapter import FILE, adapter_file, attach_draft_adapter, base_state_dict, gated
from jf_core.draft_adapter.config import DraftLora
from jf_core.layers import packed
from tests.conftest import PAD, VOCAB

STOP = StopTokens(2, PAD)


def _prompts(count: int = 3) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(3, VOCAB, (k,), generator=g).tolist() for k in (5, 9, 3, 7)[:count]]


def _with_random_adapter(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """A copy of `model` whose adapter is far from zero: its drafts are not the base's."""
    model = copy.deepcopy(model)
    adapter = attach_draft_adapter(model, DraftLora(rank=4))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for b in adapter.b.values():
            b.copy_(torch.randn(b.shape, generator=g) * 0.5)
    return model


@pytest.mark.parametrize("block_size", [2, 4, 16])
@pytest.mark.parametrize("batch_size", [1, 3])
def test_the_output_is_the_base_models_greedy_output_whatever_the_adapter_holds(tiny_model, block_size, batch_size):
    prompts = _prompts()
    expected = ar_decode(tiny_model, prompts, max_new_tokens=40, stop=STOP).sequences
    drafted = _with_random_adapter(tiny_model)
    got = []
    for first in range(0, len(prompts), batch_size):
        cfg = JacobiConfig(block_size=block_size, max_new_tokens=40)
        got += jacobi_decode(drafted, prompts[first : first + batch_size], cfg, stop=STOP).sequences
    assert got == expected
    # Hooked only while a gate is set: outside a drafting forward (AR, prefill) the model runs as the base does.
    assert not any(m._forward_hooks for m in drafted.modules())
    # The adapter does act where the gate is on: had the verifier run with it, the text would differ.
    with gated(drafted, torch.ones(1, 1)):
        assert ar_decode(drafted, prompts, max_new_tokens=40, stop=STOP).sequences != expected


@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("draft_span", [1, 3])
def test_a_shorter_draft_chain_keeps_the_base_models_greedy_output(tiny_model, block_size, draft_span):
    """The chain covers the first `draft_span` slots; the slots past it take the base's guesses. Either way a
    drafted token enters the text only where the base's own pick equals it."""
    prompts = _prompts()
    expected = ar_decode(tiny_model, prompts, max_new_tokens=40, stop=STOP).sequences
    cfg = JacobiConfig(block_size=block_size, max_new_tokens=40, draft_span=draft_span)
    assert jacobi_decode(_with_random_adapter(tiny_model), prompts, cfg, stop=STOP).sequences == expected


@pytest.mark.parametrize("config", [JacobiConfig(block_size=8), JFDecodeConfig(block_size=8, num_blocks=1, lookup=8)])
def test_a_config_that_leaves_the_adapter_out_decodes_as_the_input_model(tiny_model, config):
    """`adapter: false` (a tune's choice where the adapter's cycle does not pay): the model keeps its adapter and
    decodes as the input model does, forward for forward; with it on, the same config drafts differently."""
    prompts = _prompts()
    drafted = _with_random_adapter(tiny_model)
    cfg = replace(config, max_new_tokens=40)
    decoder = jf_decode if isinstance(cfg, JFDecodeConfig) else jacobi_decode
    runs, off = {}, replace(cfg, adapter=False)
    for name, model, c in [("base", tiny_model, cfg), ("off", drafted, off), ("on", drafted, cfg)]:
        widths, handle = _widths(model)
        runs[name] = (decoder(model, prompts, c, stop=STOP).sequences, widths)
        handle.remove()
    assert runs["off"][0] == runs["on"][0] == runs["base"][0]
    assert runs["off"][1] == runs["base"][1]  # the same forwards, each as wide
    assert runs["on"][1] != runs["base"][1]  # the chain's slots
    assert AdapterChain.from_config(drafted, replace(cfg, adapter=False)) is None
    assert "no-adapter" in replace(cfg, adapter=False).describe().split()


def _widths(model: torch.nn.Module) -> tuple[list[int], object]:
    widths: list[int] = []
    handle = model.register_forward_pre_hook(
        lambda _m, _a, kw: widths.append(kw["input_ids"].shape[1]), with_kwargs=True
    )
    return widths, handle


def test_a_forward_carries_the_window_and_only_the_draft_slots_that_are_read(tiny_model):
    """A full window of n runs n + (n - 2) tokens: the draft of the window's last slot would be read only if the
    whole window were accepted, and then the next token is the base's bonus. With `draft_span` d: n + d."""
    drafted = _with_random_adapter(tiny_model)
    prompt = _prompts(1)
    for span, extra in ((0, 6), (3, 3)):
        widths, handle = _widths(drafted)
        try:
            jacobi_decode(drafted, prompt, JacobiConfig(block_size=8, max_new_tokens=8, draft_span=span), stop=STOP)
        finally:
            handle.remove()
        assert widths[1] == 8 + extra  # [0] is the prefill


class _FullChain(AdapterChain):
    """The chain as it was: a copy of every window slot after the root (2n - 1 tokens)."""

    def extend(self, seq, lay: Layout, room: Room) -> Layout:
        main = lay.branches[0]
        if len(main) == 1:
            return lay
        start = len(lay.tokens)
        tokens = lay.tokens + [lay.tokens[i] for i in main[1:]]
        return Layout(tokens, lay.branches, [[main[0], *range(start, start + len(main) - 1)]])


@pytest.mark.parametrize("block_size", [3, 8])
def test_the_dropped_draft_slot_was_never_read(tiny_model, block_size):
    """Against the full 2n - 1 chain: the same text in the same forwards, sequence by sequence."""
    drafted = _with_random_adapter(tiny_model, seed=1)
    prompts, cfg = _prompts(), JacobiConfig(block_size=block_size, max_new_tokens=40)
    ours = jacobi_decode(drafted, prompts, cfg, stop=STOP)
    decoder = JacobiDecoder(drafted, cfg, stop=STOP)
    assert [type(p) for p in decoder.proposers] == [AdapterChain]  # the model keeps an adapter: it drafts
    decoder.proposers = [_FullChain()]
    full = decoder.decode(prompts)
    assert ours.sequences == full.sequences
    assert [s.accepted for s in ours.stats.sequences] == [s.accepted for s in full.stats.sequences]


def test_with_no_gate_the_model_is_the_base_exactly(tiny_model):
    drafted = _with_random_adapter(tiny_model)
    ids = torch.tensor(_prompts(1))
    with torch.no_grad():
        assert torch.equal(drafted(input_ids=ids).logits, tiny_model(input_ids=ids).logits)
        gate = torch.zeros(ids.shape)
        gate[0, -1] = 1.0
        with gated(drafted, gate):
            on = drafted(input_ids=ids).logits
        base = tiny_model(input_ids=ids).logits
    assert torch.equal(on[0, :-1], base[0, :-1])  # causal: only the gated last position changes
    assert not torch.allclose(on[0, -1], base[0, -1])


def test_a_zero_adapter_drafts_what_the_base_would(tiny_model):
    """A fresh adapter (B = 0) adds nothing: the draft chain's guesses are the base's argmax, so the run takes the
    same forwards as plain Jacobi on the base."""
    prompts = _prompts()
    cfg = JacobiConfig(block_size=8, max_new_tokens=40)
    plain = jacobi_decode(tiny_model, prompts, cfg, stop=STOP)
    drafted = copy.deepcopy(tiny_model)
    attach_draft_adapter(drafted, DraftLora(rank=4))
    out = jacobi_decode(drafted, prompts, cfg, stop=STOP)
    assert out.sequences == plain.sequences
    assert [s.forwards for s in out.stats.sequences] == [s.forwards for s in plain.stats.sequences]


@pytest.mark.parametrize(
    "config",
    [
        JFDecodeConfig(block_size=4, num_blocks=2, pool_size=0, max_new_tokens=40),  # multi-block
        JFDecodeConfig(block_size=4, num_blocks=1, pool_size=4, seed_drafts=True, max_new_tokens=40),  # recycling
        JFDecodeConfig(block_size=8, seed_drafts=True, max_new_tokens=40),  # both
        # Prompt lookup's branch beside the adapter's chain (a span of 2: the chain and the branch both cut short).
        JFDecodeConfig(block_size=8, num_blocks=1, pool_size=0, lookup=8, draft_span=2, max_new_tokens=40),
    ],
    ids=["multiblock", "recycling", "both", "lookup"],
)
def test_multi_block_and_recycling_draft_with_the_adapter_losslessly(tiny_model, config):
    prompts = _prompts()
    expected = ar_decode(tiny_model, prompts, max_new_tokens=40, stop=STOP).sequences
    assert jf_decode(_with_random_adapter(tiny_model), prompts, config, stop=STOP).sequences == expected


def test_sampling_with_an_adapter_is_the_base_models_sample(tiny_model):
    """The base verifies each slot's pick under the request's noise; the adapter's picks are only guesses."""
    prompts, seeds, sampling = _prompts(), [11, 12, 13], Sampling(temperature=0.8, top_k=40)
    expected = ar_decode(tiny_model, prompts, max_new_tokens=40, stop=STOP, sampling=sampling, seeds=seeds)
    cfg = JacobiConfig(block_size=8, max_new_tokens=40)
    got = jacobi_decode(_with_random_adapter(tiny_model), prompts, cfg, stop=STOP, sampling=sampling, seeds=seeds)
    assert got.sequences == expected.sequences


@pytest.mark.skipif(not packed.AVAILABLE, reason="oneDNN's packed ops are pinned to another torch here")
def test_a_packed_model_drafts_with_the_adapters_tensors_after_they_are_replaced(tiny_model):
    """The fused path keeps its As and Bs as its products read them; `.to()` that puts new tensors in the
    parameters' place (torch's overwrite-on-conversion), or a write in place between forwards (an optimizer step
    before a TPF probe), must not leave it drafting with the old ones."""
    model = copy.deepcopy(tiny_model)
    packed.pack_linears(model, min_bytes=0)
    adapter = attach_draft_adapter(model, DraftLora(rank=2))
    ids = torch.tensor([[5, 9, 3, 7]])
    gate = torch.tensor([[0.0, 1.0, 1.0, 1.0]])

    def drafted_logits():
        with torch.no_grad(), gated(model, gate):
            return model(input_ids=ids).logits

    drafted_logits()  # the fused path's lookups made
    previous = torch.__future__.get_overwrite_module_params_on_conversion()
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    try:
        model.double().float()  # new Parameter objects over new storage, the same values
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(previous)
    with torch.no_grad():
        for b in adapter.b.values():
            b.copy_(torch.randn(b.shape) * 3.0)  # the new tensors only
    want = copy.deepcopy(tiny_model)  # the same weights (the round trip is exact), nothing looked up yet
    packed.pack_linears(want, min_bytes=0)
    attach_draft_adapter(want, DraftLora(rank=2)).load_state_dict(adapter.state_dict())
    with torch.no_grad(), gated(want, gate):
        expected = want(input_ids=ids).logits
    torch.testing.assert_close(drafted_logits(), expected)
    with torch.no_grad():
        for a in adapter.a.values():
            a.mul_(-2.0)  # in place: the same tensors, new values
    fresh = copy.deepcopy(tiny_model)
    packed.pack_linears(fresh, min_bytes=0)
    attach_draft_adapter(fresh, DraftLora(rank=2)).load_state_dict(adapter.state_dict())
    with torch.no_grad(), gated(fresh, gate):
        expected = fresh(input_ids=ids).logits
    torch.testing.assert_close(drafted_logits(), expected)


def test_a_forward_with_no_chain_runs_the_base_without_the_adapters_products(tiny_model):
    """A layout without a chain (a one-slot window) sets no gate: a gate of zeros would still compute every delta."""
    drafted = _with_random_adapter(tiny_model)
    adapter = drafted.jf_draft_adapter
    chain = AdapterChain()
    with chain.acting(drafted, [Layout([5], [[0]]), Layout([7], [[0]])], 1, "cpu"):
        assert adapter.gate is None
    with chain.acting(drafted, [Layout([5], [[0]]), Layout([7, 6, 6], [[0, 1]], [[0, 2]])], 3, "cpu"):
        assert adapter.gate.tolist() == [[0.0, 0.0, 0.0], [0.0, 0.0, 1.0]]


def test_an_adapter_attaches_once(tiny_model):
    with pytest.raises(ValueError, match="already has a draft adapter"):
        attach_draft_adapter(_with_random_adapter(tiny_model), DraftLora(rank=2))


def test_an_adapter_on_the_last_layers_only_adds_there_and_keeps_the_base_models_output(tiny_model, tmp_path):
    """`draft_lora.last_layers`: the adapter's products only in the model's last N decoder layers (a cheaper
    drafting forward); the layers below give the draft slots the base's states, and the output stays the base's."""
    from jf_core.draft_adapter.adapter import DraftAdapter, load_draft_adapter

    model = copy.deepcopy(tiny_model)
    depth = len(model.model.layers)
    adapter = attach_draft_adapter(model, DraftLora(rank=4, last_layers=1))
    assert {key.split("__")[2] for key in adapter.a} == {str(depth - 1)}
    assert len(adapter.a) == 7 and adapter.metadata()["last_layers"] == "1"
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for b in adapter.b.values():
            b.copy_(torch.randn(b.shape, generator=g) * 0.5)
    # Below its layers the adapter changes nothing, even gated everywhere: the last layer's input is the base's.
    ids = torch.tensor([_prompts(1)[0]])
    seen = {}
    hook = model.model.layers[-1].register_forward_pre_hook(lambda _m, args: seen.setdefault(len(seen), args[0]))
    with torch.no_grad():
        model(ids)
        with gated(model, torch.ones(1, ids.shape[1])):
            drafted_logits = model(ids).logits
    hook.remove()
    assert torch.equal(seen[0], seen[1])
    assert not torch.equal(drafted_logits, tiny_model(ids).logits)
    prompts = _prompts()
    expected = ar_decode(tiny_model, prompts, max_new_tokens=40, stop=STOP).sequences
    cfg = JacobiConfig(block_size=8, max_new_tokens=40)
    assert jacobi_decode(model, prompts, cfg, stop=STOP).sequences == expected
    # Saved and loaded, the adapter is on the same layers.
    from safetensors.torch import save_file

    tensors, meta = adapter_file(adapter)
    save_file(tensors, str(tmp_path / FILE), metadata=meta)
    loaded = load_draft_adapter(copy.deepcopy(tiny_model), tmp_path)
    assert isinstance(loaded, DraftAdapter) and loaded.last_layers == 1 and set(loaded.a) == set(adapter.a)
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        DraftLora(rank=4, last_layers=0)


def test_a_model_directory_keeps_its_adapter_beside_the_base_weights(embedded, tmp_path):
    """save_model_dir writes the adapter file inside the atomic write; load_model attaches it; the weight files hold
    the base alone (they load as the base without the adapter)."""
    from jf_core.model_dir import save_model_dir
    from jf_core.models import ModelLoadError, load_model, stop_tokens

    base, tok = embedded
    drafted = _with_random_adapter(base)
    adapter = drafted.jf_draft_adapter
    save_model_dir(drafted, tmp_path / "m", tokenizer=tok, state_dict=base_state_dict(drafted),
                   extra_tensors={FILE: adapter_file(adapter)})  # fmt: skip
    loaded, _ = load_model(str(tmp_path / "m"))
    assert loaded.jf_draft_adapter.rank == 4
    for key, value in adapter.state_dict().items():
        assert torch.equal(loaded.jf_draft_adapter.state_dict()[key], value)
    stop = stop_tokens(base, tok)
    prompts = [tok("12+34=")["input_ids"], tok("7*8=")["input_ids"]]
    cfg = JacobiConfig(block_size=8, max_new_tokens=24)
    assert (
        jacobi_decode(loaded, prompts, cfg, stop=stop).sequences
        == ar_decode(base, prompts, max_new_tokens=24, stop=stop).sequences
    )

    (tmp_path / "m" / FILE).unlink()  # the weights alone are the base
    (tmp_path / "m" / "checksums.sha256").unlink()
    plain, _ = load_model(str(tmp_path / "m"))
    assert not hasattr(plain, "jf_draft_adapter")
    assert all(torch.equal(v, base.state_dict()[k]) for k, v in plain.state_dict().items())

    from safetensors.torch import save_file

    save_file({"a.x": torch.zeros(1)}, str(tmp_path / "m" / FILE))  # no rank in its metadata
    with pytest.raises(ModelLoadError, match=f"{FILE}: no rank/alpha"):
        load_model(str(tmp_path / "m"))


# Who reaches the adapter, and for what: its one seam (jf_core/draft_adapter/__init__.py). A new caller is a test
# failure until it is listed here with what it needs, so the adapter's knowledge does not spread unnoticed.
SEAM = {
    "jf_core/training/config.py": "the profile's `training.draft_lora` section (DraftLora)",
    "jf_core/training/packing.py": "the training gate, from the one rule (drafted_slots -> draft_gate)",
    "jf_core/training/spans.py": "the spans layout's gate, from the same rule (drafted_slots)",
    "jf_core/training/losses.py": "the training forward, gated",
    "jf_core/training/context_cache.py": "the training forward in two passes, its second gated",
    "jf_core/round/training.py": "what trains (for_training) and what a directory keeps (directory_parts)",
    "jf_core/models.py": "loading (load_draft_adapter)",
    "jf_core/planning.py": "the projections a rank-r adapter adds to (target_projections)",
    "jf_core/decoding/proposers/adapter_chain.py": "decoding's proposer: the adapter's chain, gated by the same rule",
    "jf_core/evaluation/tune.py": "an adapter model's tune grid has the chain's span",
    "jf_core/evaluation/forward_cost.py": "`jf bench forward --gated`: a forward with the adapter acting, timed",
    "jf_core/evaluation/anchors.py": "an adapter model's evaluation times its decoding without the adapter",
    "jf_core/evaluation/evaluate.py": "an evaluation records whether its model keeps an adapter (adapter_left_out)",
    "jf_vllm/launch.py": "the file's name: vLLM does not run the adapter, and says so",
    "bench/gpu_check.py": "a random adapter for the GPU check's timing",
    "bench/loss_terms.py": "the profile's adapter on the base (for_training), its training step timed",
}


def test_the_adapter_is_reached_through_its_seam():
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    callers = set()
    for pkg in ("jf_core", "tasks", "flows", "jf_cli", "infra", "bench", "jf_vllm"):
        for path in (root / pkg).rglob("*.py"):
            where = path.relative_to(root).as_posix()
            if where.startswith("jf_core/draft_adapter/"):
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("jf_core.draft_adapter"):
                    callers.add(where)
    assert callers == set(SEAM), {"unlisted": callers - set(SEAM), "no longer calling": set(SEAM) - callers}


def test_decoding_and_training_gate_by_one_rule():
    """The decoder's chain and training's noisy block: the root (slot 0) is the base's, the adapter acts from the
    first drafted slot on, on exactly the slots `draft_gate` is given."""
    from jf_core.decoding.layout import Layout
    from jf_core.draft_adapter.adapter import draft_gate, drafted_slots

    assert list(drafted_slots(range(10, 14))) == [11, 12, 13]
    assert list(drafted_slots(range(10, 14), first_drafted=0)) == [11, 12, 13]  # the root never
    assert list(drafted_slots(range(10, 14), first_drafted=2)) == [12, 13]
    lay = AdapterChain().extend(None, Layout([5, 6, 7, 8], [[0, 1, 2, 3]]), Room(run=4, window=4, block_left=4))
    assert lay.tokens == [5, 6, 7, 8, 6, 7] and lay.drafts == [[0, 4, 5]]  # 2n - 2 tokens
    assert draft_gate([drafted_slots(lay.drafts[0])], 6).tolist() == [[0, 0, 0, 0, 1, 1]]
