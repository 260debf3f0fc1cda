"""The GPU check: what a CUDA machine confirms about this project, in one run, in minutes, with no downloads.

    .venv/bin/python bench/gpu_check.py [--out DIR]                  # a machine with a CUDA GPU (< 10 minutes)
    .venv/bin/python bench/gpu_check.py --device cpu --smoke         # the same code on tiny shapes (CI runs it)

1. lossless: the architecture matrix (tests/jf_core/decoding/architectures.py) on the device in fp32, TF32 off:
   Jacobi, multi-block and recycling at batch 1 and 3, token for token against HF greedy generate.
2. numerics: on a random model shaped like Qwen2.5-0.5B, the identical fraction of Jacobi against AR in bf16,
   with the fp32 LM head, and in fp32, at batch 1 and 8; and what exactness costs (fp32 vs bf16 TPS).
3. flash-attention (when flash_attn imports): Jacobi and recycling on flash_attention_2 against SDPA, bf16: the
   identical fraction between them, the forwards per mask path (2D on flash, trees on SDPA), TPS.
4. training: the Jacobi Forcing loss of one packed batch with FlexAttention's BlockMask against SDPA's dense mask,
   in both packing layouts (training.packing blocks and spans), a backward pass each (passed on an H200 on
   2026-12-04: docs/development.md, "A GPU lease").
5. the cost of one forward at window widths 1, 16, 64, 128, 256 over a 512-token cache, on a Qwen2.5-0.5B-shaped
   model and a Qwen2.5-7B-shaped layer stack (4 layers): where a wider window stops being free.

6. adapter_speed (`--adapter-model DIR --prompts FILE`): a model with a trained draft adapter (the base verifies)
   against our AR (and AR timed again: the control row, the timer's spread) and HF generate at `--batches` (default
   1, 4 and 16), fp32 (exact): held-out TPF, tokens/s and x AR of Jacobi at each of `--block-sizes` and of Jacobi
   with prompt lookup at the largest, beside the untrained decoders a user would pick instead: HF's prompt lookup
   (batch 1) and, with `--base-model`, the untrained base's Jacobi with prompt lookup. Every output is checked
   against the base's greedy output (our AR: the adapter is unhooked outside a drafting forward); each batch size's
   rows are written as they finish (`adapter_speed.partial.json`), and where a Jacobi step's time goes (the forward
   against the host's work around it). Without a model (`--smoke`, CI) a random tiny model with a random adapter
   runs the same code. With `--tune`, each model's decode config is first tuned on the device (`jf tune`'s search,
   `--tune-grid`, default `GPU_TUNE_GRID`: wide windows, the adapter's chain, the round's draft corpus as a tree) on
   calibration questions taken after the timed ones, and timed as `tuned` and `base_tuned`: the rows a round's
   evaluation reports, with the layouts a GPU affords.
   `scripts/gpu/lease_adapter.sh` trains the adapter on GSM8K's train split and runs this on the test split.

Random weights: numerics on a random model are a worst case (near-tied argmaxes everywhere); the figures for a
trained checkpoint come from `jf eval` on it. Prints a markdown report and writes `gpu_check.json`.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jf_core.decoding import JacobiConfig, JFDecodeConfig, StopTokens, ar_decode  # noqa: E402
from jf_core.decoding.kv import KVState  # noqa: E402
from jf_core.evaluation.methods import hf_generate_decoder  # noqa: E402
from jf_core.evaluation.speed import first_divergence, run_interleaved, whole_batches  # noqa: E402
from jf_core.threads import choose_threads  # noqa: E402

QWEN_05B = dict(  # Qwen2.5-0.5B's shape
    vocab_size=151936,
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    tie_word_embeddings=True,
)
QWEN_7B_STACK = dict(  # Qwen2.5-7B's layer shape, 4 layers of its 28
    vocab_size=152064,
    hidden_size=3584,
    intermediate_size=18944,
    num_hidden_layers=4,
    num_attention_heads=28,
    num_key_value_heads=4,
    tie_word_embeddings=False,
)
SMOKE = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    tie_word_embeddings=True,
)
# The FlexAttention check's model: head_dim 64 like the real models the round trains (SmolLM2, Qwen2.5). On the
# H200 (2026-11-27, torch 2.11) FlexAttention's compile failed on SMOKE's head_dim 16 in fp32, while the round's own
# training of SmolLM2 (head_dim 64, bf16 autocast) ran.
FLEX = dict(SMOKE, hidden_size=256, num_attention_heads=4, num_key_value_heads=2)
STOP = StopTokens(None, 0)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def random_qwen2(shape: dict, device: torch.device, dtype: torch.dtype, attn: str = "sdpa") -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(**shape, max_position_embeddings=4096, attn_implementation=attn)
    with torch.device(device):
        model = Qwen2ForCausalLM(config)
    return model.to(dtype).eval()


def random_prompts(vocab: int, count: int, low: int = 16, high: int = 64, seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    sizes = torch.randint(low, high, (count,), generator=g).tolist()
    return [torch.randint(3, vocab, (s,), generator=g).tolist() for s in sizes]


def decoder(model, cfg):
    from jf_core.decoding import decode

    return lambda ps: decode(model, ps, cfg, stop=STOP)


def check_lossless(device: torch.device, smoke: bool) -> dict:
    from tests.jf_core.decoding.architectures import CONFIGS, DECODERS, NEW, PROMPTS, build, supports

    prompts, new, configs = PROMPTS, NEW, DECODERS
    archs = ["qwen2", "mistral-window", "gemma3-window"] if smoke else list(CONFIGS)
    rows, failures = {}, []
    for arch in archs:
        reference = hf_generate_decoder(build(arch, "eager").to(device), StopTokens(None, 0), new, batched=False)(
            prompts
        )
        for backend in ("sdpa", "eager"):
            if not supports(arch, backend):
                continue
            model = copy.deepcopy(build(arch, backend)).to(device)
            for name, cfg in configs.items():
                alone = [decoder(model, cfg)([p]).sequences[0] for p in prompts]
                together = decoder(model, cfg)(prompts).sequences
                ok = alone == reference.sequences == together
                rows[f"{arch}/{backend}/{name}"] = ok
                if not ok:
                    failures.append(f"{arch}/{backend}/{name}")
    return {"cases": len(rows), "identical": sum(rows.values()), "failures": failures}


def identity(model, prompts: list[list[int]], n: int, batch: int, new: int) -> tuple[float, float | None]:
    """Fraction of prompts where Jacobi at block size n equals AR (same batch size), and the median first
    divergence of the others."""
    ar, jac = [], []
    for i in range(0, len(prompts), batch):
        chunk = prompts[i : i + batch]
        ar += ar_decode(model, chunk, max_new_tokens=new, stop=STOP).sequences
        jac += decoder(model, JacobiConfig(block_size=n, max_new_tokens=new))(chunk).sequences
    diverged = [d for d in (first_divergence(a, b) for a, b in zip(ar, jac, strict=True)) if d is not None]
    median = statistics.median(diverged) if diverged else None
    return 1 - len(diverged) / len(prompts), median


def check_numerics(device: torch.device, shape: dict, smoke: bool) -> dict:
    from jf_core.layers.heads import upcast_lm_head

    prompts = random_prompts(shape["vocab_size"], 8 if smoke else 16)  # 32 ran past 3 minutes on an H200
    new = 32 if smoke else 128
    out = {}
    variants = {
        "bf16": lambda: random_qwen2(shape, device, torch.bfloat16),
        "bf16 + fp32 LM head": lambda: upcast_lm_head(random_qwen2(shape, device, torch.bfloat16)),
        "fp32": lambda: random_qwen2(shape, device, torch.float32),
    }
    models = {}
    for label, make in variants.items():
        models[label] = make()
        out[label] = {}
        for batch in (1, 8):
            frac, median = identity(models[label], prompts, 16, batch, new)
            out[label][f"batch {batch}"] = {"identical_fraction": frac, "median_first_divergence": median}
    # What exactness costs here: AR and Jacobi n=16 in fp32 against bf16, taking turns.
    speed_prompts = prompts[:4]
    methods = {}
    for label in ("bf16", "fp32"):
        m = models[label]
        methods[f"{label} ar"] = lambda ps, m=m: ar_decode(m, ps, max_new_tokens=new, stop=STOP)
        methods[f"{label} jacobi"] = decoder(m, JacobiConfig(block_size=16, max_new_tokens=new))
    timed = run_interleaved(methods, speed_prompts, 1, repeats=2, warmup_prompts=1)
    out["tps"] = {name: o.stats.tps for name, o in timed.items()}
    return out


def check_flash(device: torch.device, shape: dict) -> dict:
    import importlib.util

    if device.type != "cuda" or importlib.util.find_spec("flash_attn") is None:
        return {"skipped": "needs CUDA and the flash_attn package (pip install flash-attn --no-build-isolation)"}
    prompts = random_prompts(shape["vocab_size"], 8)
    paths: dict[str, int] = {}
    original = KVState._call

    def spy(self, tokens, positions, mask, path, **kw):
        paths[path] = paths.get(path, 0) + 1
        return original(self, tokens, positions, mask, path, **kw)

    KVState._call = spy
    try:
        out = {}
        cfgs = {
            "jacobi n=16": JacobiConfig(block_size=16, max_new_tokens=128),
            "recycling (pool 4)": JFDecodeConfig(block_size=16, num_blocks=2, pool_size=4, max_new_tokens=128),
        }
        sdpa = random_qwen2(shape, device, torch.bfloat16, "sdpa")
        flash = random_qwen2(shape, device, torch.bfloat16, "flash_attention_2")
        for label, cfg in cfgs.items():
            paths.clear()
            timed = run_interleaved(
                {"flash": decoder(flash, cfg), "sdpa": decoder(sdpa, cfg)}, prompts, 4, repeats=2, warmup_prompts=4
            )
            same = sum(a == b for a, b in zip(timed["flash"].sequences, timed["sdpa"].sequences, strict=True))
            out[label] = {
                "identical_flash_vs_sdpa": same / len(prompts),
                "tps_flash": timed["flash"].stats.tps,
                "tps_sdpa": timed["sdpa"].stats.tps,
                "forwards_per_mask_path": dict(paths),
            }
        return out
    finally:
        KVState._call = original


def check_flex_training(device: torch.device, smoke: bool) -> dict:
    if device.type != "cuda":
        return {"skipped": "FlexAttention training runs on CUDA only (on CPU it compiles for minutes)"}
    from types import SimpleNamespace

    from jf_core.training.jf_data import ROWS
    from jf_core.training.losses import JacobiForcingObjective, JFLossConfig
    from jf_core.training.noise import NoiseSchedule
    from jf_core.training.packing import collate, pack_records
    from jf_core.trajectory.collect import CollectConfig, collect
    from jf_core.trajectory.prompts import PromptItem

    model = random_qwen2(FLEX, device, torch.float32)
    tok = SimpleNamespace(eos_token_id=None, pad_token_id=0)
    items = [PromptItem(str(i), p) for i, p in enumerate(random_prompts(FLEX["vocab_size"], 8, 8, 24))]
    # As the round trains: sequences of a few hundred tokens, gradients on. On the H200 (2026-11-27, torch 2.11) the
    # first version of this check, 84-token sequences under no_grad, failed in Inductor's FlexAttention lowering
    # ("No choices to select") while the round's training ran. Both layouts (training.packing): the spans layout's
    # mask has a per-position anchor the blocks layout's lacks, and the SmolLM2 profile trains in spans.
    records = collect(model, tok, items, CollectConfig(block_size=8, max_new_tokens=192), model_hash="random").records
    packed, _ = pack_records(records, NoiseSchedule("random", window=4), 2048)
    out = {}
    for layout, variant in (("blocks", "shipped"), ("spans", "clean_context")):
        batch = {k: v.to(device) for k, v in collate(packed[:4], 0, variant, row=ROWS[layout]).items()}
        objective = JacobiForcingObjective(JFLossConfig(), variant)
        losses = {}
        for attn in ("sdpa", "flex_attention"):
            model.set_attn_implementation(attn)
            model.zero_grad()
            with torch.autocast(device.type, dtype=torch.bfloat16):  # as the trainer computes
                loss, losses[attn] = objective(model, batch)
            loss.backward()
        diff = {k: abs(losses["sdpa"][k] - losses["flex_attention"][k]) for k in ("loss", "consistency_loss")}
        out[layout] = {"losses": losses, "abs_difference": diff, "width": int(batch["input_ids"].shape[1])}
    return out


def forward_cost(device: torch.device, shape: dict, widths: list[int], context: int = 512) -> dict:
    """Median ms of one forward of a window of each width over a `context`-token KV cache (batch 1, bf16 on CUDA)."""
    from jf_core.evaluation.forward_cost import window_cost

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    return window_cost(random_qwen2(shape, device, dtype), widths, context=context, repeats=20, warmup=5)


ADAPTER_BATCHES = (1, 4, 16)


def adapter_prompts(tok, path: str, count: int) -> list[list[int]]:
    """The first `count` questions of a GSM8K-style JSONL file in the model's chat template (held-out: the test
    split's own file)."""
    from jf_core.trajectory.prompts import format_prompt

    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()][:count]
    return [tok(format_prompt(r["question"], tok), add_special_tokens=False)["input_ids"] for r in rows]


def step_breakdown(
    model, prompts: list[list[int]], cfg: JacobiConfig, device: torch.device, stop: StopTokens, method: str
) -> dict:
    """Where a Jacobi decode's time goes: the model's forwards (timed with a sync on each side) against the
    whole decode; the rest is the host's work between forwards (layouts, masks, verification, syncs)."""
    from jf_core.decoding import decode

    spent: list[float] = []
    started: list[float] = []

    def before(*_):
        sync(device)
        started.append(time.perf_counter())

    def after(*_):
        sync(device)
        spent.append(time.perf_counter() - started.pop())

    handles = [model.register_forward_pre_hook(before), model.register_forward_hook(after)]
    try:
        sync(device)
        t0 = time.perf_counter()
        out = decode(model, prompts, cfg, stop=stop, decoder=method)
        sync(device)
        total = time.perf_counter() - t0
    finally:
        for h in handles:
            h.remove()
    forwards = len(spent)
    return {
        "forwards": forwards,
        "ms_per_step": 1000 * total / max(forwards, 1),
        "forward_share": sum(spent) / total if total else float("nan"),
        "tpf": out.stats.tpf,
    }


def check_adapter_speed(
    device: torch.device,
    smoke: bool,
    model_dir: str | None,
    prompts_file: str | None,
    num_prompts: int,
    *,
    base_dir: str | None = None,
    batches: tuple[int, ...] = ADAPTER_BATCHES,
    sizes: tuple[int, ...] = (8, 16, 32),
    max_new_tokens: int = 256,
    tune_grid: dict[str, list] | None = None,
    tune_prompts: int = 4,
    save: Callable[[dict], None] | None = None,
) -> dict:
    """The adapter model's decoders against our AR (and its AR-against-AR control row: the timer's bias and spread),
    HF generate, HF prompt lookup (batch 1: HF's is one prompt at a time) and, with `base_dir`, the untrained base's
    Jacobi with prompt lookup: the untrained decoders a user would pick instead. With `tune_grid`, each model's
    config tuned here on `tune_prompts` other questions is timed too (`tuned`, `base_tuned`). Each batch size's rows
    are `save`d as they finish: a lease cut short keeps what it timed."""
    from jf_core.draft_adapter.adapter import attach_draft_adapter, draft_adapter
    from jf_core.draft_adapter.config import DraftLora
    from jf_core.evaluation.evaluate import with_control
    from jf_core.evaluation.method import HF_GENERATE, HF_PROMPT_LOOKUP
    from jf_core.evaluation.methods import build_methods
    from jf_core.evaluation.speed import bench

    stop, base = STOP, None
    if model_dir is None:
        model = random_qwen2(SMOKE, device, torch.float32)
        adapter = attach_draft_adapter(model, DraftLora(rank=4))
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for b in adapter.b.values():
                b.copy_((torch.randn(b.shape, generator=g) * 0.5).to(b.device))
        base = random_qwen2(SMOKE, device, torch.float32)  # the same seed: the adapter model's base
        prompts, new, sizes = random_prompts(SMOKE["vocab_size"], 4 + 1), 16, (4, 8)
        prompts, calibration = prompts[:4], prompts[4:]
    else:
        from jf_core.models import load_model, stop_tokens

        model, tok = load_model(model_dir, dtype="float32", device=str(device))
        if draft_adapter(model) is None:
            raise ValueError(f"--adapter-model {model_dir} keeps no draft adapter (draft_adapter.safetensors)")
        if prompts_file is None:
            raise ValueError("--adapter-model needs --prompts (a GSM8K-style JSONL file)")
        if base_dir is not None:
            base = load_model(base_dir, dtype="float32", device=str(device))[0]
            if draft_adapter(base) is not None:
                raise ValueError(f"--base-model {base_dir} keeps a draft adapter: name the untrained model")
        stop = stop_tokens(model, tok)
        timed_count = max(num_prompts, *batches)
        prompts, new = adapter_prompts(tok, prompts_file, timed_count + tune_prompts), max_new_tokens
        prompts, calibration = prompts[:timed_count], prompts[timed_count:]  # tuned on questions never timed
    largest = sizes[-1:]
    out: dict = {"block_sizes": list(sizes), "prompts": len(prompts), "max_new_tokens": new}
    tuned = {}
    if tune_grid is not None:
        t0 = time.perf_counter()
        tokens = min(new, 64)  # the profile's tune's answer length: on a lease the tune's minutes are the timing's
        tuned = {
            tag: tuned_config(m, calibration, stop, tune_grid, tokens) for tag, m in (("", model), ("base", base)) if m
        }
        out["tuned"] = {tag or "adapter model": cfg.describe() for tag, cfg in tuned.items()}
        out["tune_seconds"] = time.perf_counter() - t0
        print(f"tuned in {out['tune_seconds']:.0f} s: {out['tuned']}", flush=True)
    built = build_methods(model, stop, new, block_sizes=sizes, lookup_sizes=largest, tuned=tuned.get(""))
    untrained = (
        build_methods(base, stop, new, ar=False, lookup_sizes=largest, model_tag="base", tuned=tuned.get("base"))
        if base
        else {}
    )
    for batch in batches if not smoke else (1, 4):
        methods = {HF_GENERATE: hf_generate_decoder(model, stop, new)}
        if batch == 1:  # HF's prompt lookup decodes one prompt at a time
            lookup = hf_generate_decoder(model, stop, new, batched=False, prompt_lookup_num_tokens=10)
            methods[HF_PROMPT_LOOKUP] = lookup
        methods |= with_control(built) | untrained
        timed = whole_batches(prompts[: max(num_prompts, batch)], batch)
        # A warm-up of two prompts warms every code path; a whole batch of them would double a large batch's cost.
        rows = bench(methods, timed, batch_size=batch, warmup_prompts=min(batch, 2))
        out[f"batch {batch}"] = {
            r.name: {
                "tpf": r.tpf,
                "tps": r.tps,
                "x_ar": r.speedup_vs_ar,
                "x_hf": r.speedup_vs_hf_generate,
                "identical_to_base": r.identical_fraction,
                "prompts": len(timed),
            }
            for r in rows
        }
        if save is not None:
            save(out)
    cfg = JacobiConfig(block_size=sizes[len(sizes) // 2], max_new_tokens=new)
    out["step_breakdown"] = {
        f"{method}, n={cfg.block_size}, batch 1": step_breakdown(model, prompts[:2], cfg, device, stop, method)
        for method in ("ar", "jacobi")
    }
    return out


# What `--tune` searches on a GPU, where a forward of 16-256 tokens costs about one of a token (the forward_cost
# section; an H200 measured 1.16-1.20x, docs/development.md): full-width windows of 16 and 32, the adapter's chain of
# 1 or 3, prompt lookup, and the round's corpus as suffix drafts in a tree of 10 or 32 tokens, with no slot budget
# (the CPU's budget prices slots a GPU gives away). A model without an adapter or a corpus gets the grid's rest.
GPU_TUNE_GRID = {
    "block_size": [16, 32],
    "num_blocks": [1],
    "pool_size": [0],
    "adaptive_width": [False],
    "draft_span": [1, 3],
    "lookup": [16],
    "suffix": [16],
    "suffix_tree": [10, 32],
    "max_slots": [0],
}


def tuned_config(model, prompts: list[list[int]], stop: StopTokens, grid: dict[str, list], max_new_tokens: int):
    """The fastest config of `grid` for `model` on `prompts` at batch 1, every config taking turns (`jf tune`'s
    search; each field of `grid` replaces the profile default's)."""
    from jf_core.evaluation.tune import TuneSpace, tune

    space = TuneSpace({name: tuple(values) for name, values in grid.items()})
    best, _ = tune(model, prompts, stop=stop, max_new_tokens=max_new_tokens, space=space)
    return best


def report(results: dict) -> str:
    lines = [f"# GPU check on {results['device_name']}", ""]
    failed = {k: v["error"] for k, v in results.items() if isinstance(v, dict) and "error" in v}
    for name, error in failed.items():
        lines += [f"**{name}: failed**: {error.splitlines()[0] if error else ''}", ""]
    ran = {name for name, value in results.items() if isinstance(value, dict) and name not in failed}
    if "lossless" in ran:
        lossless = results["lossless"]
        lines.append(f"**Lossless (fp32, TF32 off)**: {lossless['identical']}/{lossless['cases']} cases identical")
        lines += [f"- differs: {f}" for f in lossless["failures"]]
    if "numerics" in ran:
        lines += ["", "**Numerics** (random Qwen2.5-0.5B shape, Jacobi n=16 vs AR, identical fraction):", ""]
        lines += ["| weights | batch 1 | batch 8 |", "|---|---|---|"]
        for label, row in results["numerics"].items():
            if label == "tps":
                continue
            cells = [f"{row[b]['identical_fraction']:.3f}" for b in ("batch 1", "batch 8")]
            lines.append(f"| {label} | {' | '.join(cells)} |")
        tps = results["numerics"]["tps"]
        ar_cost, jacobi_cost = tps["fp32 ar"] / tps["bf16 ar"], tps["fp32 jacobi"] / tps["bf16 jacobi"]
        lines.append(f"\nExactness costs: fp32 runs AR at {ar_cost:.2f}x and Jacobi at {jacobi_cost:.2f}x bf16's TPS.")
    if "flash" in ran:
        lines += ["", f"**flash-attention**: {json.dumps(results['flash'])}"]
    if "flex_training" in ran:
        lines += ["", f"**FlexAttention training**: {json.dumps(results['flex_training'])}", ""]
    if "forward_cost" in ran:
        for name, cost in results["forward_cost"].items():
            ratios = ", ".join(f"w={w}: {r:.2f}x" for w, r in cost["ratio_to_width_1"].items())
            knee = cost["widest_within_1.5x"]
            lines.append(f"**Forward cost, {name}** (vs width 1): {ratios}; widest within 1.5x: {knee}")
    if "adapter_speed" in ran:
        found = results["adapter_speed"]
        lines += [
            "",
            f"**Draft adapter against AR** ({found['prompts']} prompts, {found['max_new_tokens']} tokens, fp32):",
        ]
        lines += [
            "",
            "| batch | method | TPF | tokens/s | x our AR | x HF generate | = base's greedy |",
            "|---|---|---|---|---|---|---|",
        ]
        for key, rows in found.items():
            if key.startswith("batch "):
                for method, r in rows.items():
                    lines.append(f"| {key[6:]} | {method} | {r['tpf']:.2f} | {r['tps']:.1f} | {r['x_ar']:.2f} | "
                                 f"{r['x_hf']:.2f} | {r['identical_to_base']:.3f} |")  # fmt: skip
        for tag, cfg in found.get("tuned", {}).items():
            lines.append(f"- tuned here for the {tag}: {cfg}")
        for label, b in found["step_breakdown"].items():
            lines.append(f"- {label}: {b['ms_per_step']:.2f} ms a step, the forward {b['forward_share']:.0%} of it")
    lines.append(f"\nTotal {results['seconds']:.0f} s.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes: checks that the script works")
    parser.add_argument("--out", default="gpu-check")
    parser.add_argument(
        "--only", default="", help="comma-separated sections to run (default all): a lease too short for all of them"
    )
    parser.add_argument("--adapter-model", help="adapter_speed: a model directory with a trained draft adapter")
    parser.add_argument("--prompts", help="adapter_speed: a GSM8K-style JSONL file (held-out questions)")
    parser.add_argument("--num-prompts", type=int, default=32, help="adapter_speed: questions timed at each batch")
    parser.add_argument("--base-model", help="adapter_speed: the untrained model, for its Jacobi + prompt lookup rows")
    parser.add_argument("--batches", default="1,4,16", help="adapter_speed: batch sizes, in the order timed")
    parser.add_argument("--block-sizes", default="8,16,32", help="adapter_speed: Jacobi's n (lookup at the largest)")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="adapter_speed: tokens per answer")
    parser.add_argument(
        "--tune", action="store_true", help="adapter_speed: also time each model's config tuned here (tuned rows)"
    )
    parser.add_argument("--tune-grid", type=json.loads, help="adapter_speed: the grid --tune searches (JSON)")
    parser.add_argument("--tune-prompts", type=int, default=4, help="adapter_speed: calibration questions for --tune")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            sys.exit("no CUDA device: run with --device cpu --smoke to check the script itself")
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 for the lossless check
        torch.backends.cudnn.allow_tf32 = False
    else:
        # The CPUs free now, one count for the whole run (its speed rows take turns): torch's default of one thread a
        # core, beside other work (the test suite's other workers), waited on descheduled threads at every op's
        # barrier: the smoke run took 57 s beside one busy process on 2 threads, 19 s on 1.
        torch.set_num_threads(choose_threads())
    started = time.perf_counter()
    small = SMOKE if args.smoke else QWEN_05B
    widths = [1, 4, 16] if args.smoke else [1, 16, 64, 128, 256]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sections = {
        "lossless": lambda: check_lossless(device, args.smoke),
        "flex_training": lambda: check_flex_training(device, args.smoke),
        "flash": lambda: check_flash(device, small),
        "forward_cost": lambda: {
            "qwen2.5-0.5b shape": forward_cost(device, small, widths),
            "qwen2.5-7b layer stack (4 layers)": forward_cost(device, SMOKE if args.smoke else QWEN_7B_STACK, widths),
        },
        "adapter_speed": lambda: check_adapter_speed(
            device,
            args.smoke,
            args.adapter_model,
            args.prompts,
            args.num_prompts,
            base_dir=args.base_model,
            batches=tuple(int(b) for b in args.batches.split(",")),
            sizes=tuple(int(n) for n in args.block_sizes.split(",")),
            max_new_tokens=args.max_new_tokens,
            tune_grid=(args.tune_grid or GPU_TUNE_GRID) if args.tune else None,
            tune_prompts=args.tune_prompts,
            save=lambda partial: (out / "adapter_speed.partial.json").write_text(json.dumps(partial, indent=2)),
        ),
        "numerics": lambda: check_numerics(device, small, args.smoke),  # the longest: last
    }
    if args.adapter_model is None and not args.smoke:
        del sections["adapter_speed"]  # it times a trained adapter: only when one is given
    if args.only:
        wanted = args.only.split(",")
        if unknown := sorted(set(wanted) - set(sections)):
            parser.error(f"--only: no section {', '.join(unknown)} (sections: {', '.join(sections)})")
        sections = {name: run for name, run in sections.items() if name in wanted}
    results = {
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
    }
    for name, run in sections.items():
        try:
            results[name] = run()
        except Exception as err:  # one section's failure is a finding; the others still run
            results[name] = {"error": f"{type(err).__name__}: {str(err)[:2000]}"}
        except KeyboardInterrupt:  # a lease's time limit (timeout --signal=INT): what was measured is written
            results[name] = {"error": "interrupted: the time limit (adapter_speed keeps its finished batches)"}
            break
        results[f"{name}_done_s"] = time.perf_counter() - started
        # Written after every section: a run cut short by its machine's time limit still leaves what it measured.
        (out / "gpu_check.json").write_text(json.dumps(results, indent=2, default=str))
        print(f"{name}: done at {results[f'{name}_done_s']:.0f} s", flush=True)
    results["seconds"] = time.perf_counter() - started
    (out / "gpu_check.json").write_text(json.dumps(results, indent=2, default=str))
    text = report(results)
    (out / "gpu_check.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
