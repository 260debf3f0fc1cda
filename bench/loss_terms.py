"""A draft adapter's training micro-step (forward, losses, backward) as it ran before four cuts and after each: the
AR loss term left out where no gradient reaches it, then the frozen base's products in the compute dtype from a copy
cast once (the context pass's too, which ran in packed fp32), then the projections of one input grouped (a layer's
q, k, v and gate, up: one product of the frozen weights and one of the adapter's As and Bs each, with autograd;
jf_core/layers/siblings.py), then each loss chunk's gradient taken as the chunk is computed instead of the chunk
checkpointed (jf_core/training/head.py, `_GradientNow`: the LM head's products a chunk halved); the sides taking
turns on the same packed batches in one process.

    .venv/bin/python bench/loss_terms.py --profile smollm2-135m --packed RUN/packed/examples.parquet \
        --batches 6 --repeats 3

`--packed`: a round's packed examples (`$JF_HOME/runs/<profile>/<run>/packed/examples.parquet`), trained as the
profile trains them (its adapter, mask, layout, noisy copies, drafted span, compute dtype and two-pass forward);
`--kept`: with the profile's store of contexts, each computed on its example's first visit and read after (a long
run's later visits), so the sides time the step beside its context pass. For a draft adapter the AR loss's
positions are the frozen base's (no gradient reaches them: `jf_core/training/losses.py`, `ar_gradient`), and the
base's weights never change (`jf_core/layers/packed.py`, `CastWeight`). The adapter's gradients are checked the
same with the AR term and without, bit for bit, and their cosines (cast once against before, grouped against cast
once) printed. Run it alone: a neighbour's
time slices land in whichever side runs.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from jf_core.config import load_profile, parse_overrides
from jf_core.draft_adapter.adapter import for_training
from jf_core.layers.packed import uncached_casts, unpacked
from jf_core.layers.siblings import ungrouped
from jf_core.model_ref import resolve_model
from jf_core.models import load_model
from jf_core.training import context_cache as two_passes
from jf_core.training.context_store import ContextStore
from jf_core.training.head import checkpointed_heads, head_fn
from jf_core.training.jf_data import jf_batches, read_packed_share
from jf_core.training.losses import JacobiForcingObjective, jf_losses, training_attention
from jf_core.training.noise import NoiseSchedule
from jf_core.training.precision import resolve_compute_dtype


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="smollm2-135m")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    ap.add_argument("--packed", required=True, help="a round's packed examples (Parquet)")
    ap.add_argument("--batches", type=int, default=6, help="packed batches, each timed both ways per repeat")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kept", action="store_true", help="each context kept after its first visit (the store)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    profile = load_profile(args.profile, **parse_overrides(args.set))
    t = profile.training
    if t.draft_lora is None:
        raise SystemExit(f"{args.profile}: training.draft_lora is unset; this bench measures a draft adapter's step")
    device = torch.device("cpu")
    model, tok = load_model(
        resolve_model(profile.model.path), dtype="float32", device="cpu", attn_implementation=training_attention(device)
    )
    for_training(model, t.draft_lora)
    compute = resolve_compute_dtype(t.compute_dtype, torch.float32, device, model.config.hidden_size)
    objective = JacobiForcingObjective.of(t)
    examples = read_packed_share(args.packed, 0, 1)
    redraw = NoiseSchedule.of(t) if t.state_pick == "each_visit" else None
    stream = jf_batches(
        examples, t.batch_size, tok.pad_token_id, seed=t.seed, variant=t.mask, redraw=redraw,
        copies=t.noisy_copies, span=t.draft_span, packing=t.packing,
    )  # fmt: skip
    # --kept: the contexts the profile's store keeps, each computed on its example's first visit here (the first
    # touch below) and read after, as a long run's later visits read them; the sides then time what follows.
    store = ContextStore(t.context_memory_mb * 2**20) if args.kept and t.context_memory_mb else None
    if args.kept and store is None:
        raise SystemExit(f"{args.profile}: --kept needs training.context_memory_mb")
    batches = [next(stream) for _ in range(args.batches)]
    trainable = [p for p in model.parameters() if p.requires_grad]

    def step(batch, side: str) -> list[torch.Tensor]:
        ar_gradient, cached, grouped, now = SIDES[side]
        model.zero_grad(set_to_none=True)
        with (
            contextlib.nullcontext() if cached else uncached_casts(),
            contextlib.nullcontext() if grouped else ungrouped(),
            contextlib.nullcontext() if now else checkpointed_heads(),
        ):
            with torch.autocast("cpu", dtype=compute, enabled=compute != torch.float32):
                hidden, _ = two_passes.forward(model, batch, store)
                loss, _ = jf_losses(hidden, head_fn(model), batch, objective.cfg, ar_gradient=ar_gradient)
            loss.backward()
        return [p.grad.clone() for p in trainable]

    print(f"{len(batches)} batches of {t.batch_size}, {sum(int(b['input_ids'].numel()) for b in batches)} positions "
          f"in all; compute {compute}; {args.threads} threads")  # fmt: skip
    for batch in batches[1:] if store else ():  # first touch: each context computed once, as shipped, and kept
        step(batch, list(SIDES)[-1])
    for batch in batches[:1]:  # first touch; the gradients the same with the AR term and without, bit for bit
        assert two_passes.applies(model, batch), "the profile's batches do not take the two-pass forward"
        grads = {side: torch.cat([g.flatten() for g in step(batch, side)]) for side in SIDES}
        assert torch.equal(grads["before"], grads["ar_left_out"]), "leaving the AR term out changed the gradients"
        # The context pass in the compute dtype: gradients as close as bf16 gets to fp32's; grouped and the
        # gradient taken now: the compute dtype's rounding.
        for new, old in (("cast_once", "before"), ("grouped", "cast_once"), ("gradient_now", "grouped")):
            cosine = torch.nn.functional.cosine_similarity(grads[old].double(), grads[new].double(), dim=0)
            print(f"the adapter's gradients, {new} against {old}: cosine {float(cosine):.6f}")
    seconds: dict[str, list[float]] = {side: [] for side in SIDES}
    names = list(SIDES)
    for r in range(args.repeats):
        for i, batch in enumerate(batches):
            k = (r * len(batches) + i) % len(names)
            for side in names[k:] + names[:k]:  # each side first as often
                start = time.perf_counter()
                step(batch, side)
                seconds[side].append(time.perf_counter() - start)
    # Against the machine's own limit: the step's counted FLOPs over its time, beside what one matmul of the
    # model's shape reaches here in the same dtype.
    peak = matmul_gflops(model.config.hidden_size, model.config.intermediate_size, compute)
    before = statistics.mean(seconds[names[0]])
    for side in names:
        # Counted with every product on F.linear (torch's counter does not see oneDNN's packed products).
        with unpacked(), FlopCounterMode(display=False) as counter:
            for batch in batches:
                step(batch, side)
        flops = counter.get_total_flops() / len(batches)
        mean = statistics.mean(seconds[side])
        rate = flops / mean / 1e9
        print(f"{side:12s} {mean:.3f} s a micro-step (median {statistics.median(seconds[side]):.3f}), "
              f"{before / mean:.3f}x the tokens a second of {names[0]}; {flops / 1e9:.1f} GFLOP, {rate:.0f} GFLOP/s, "
              f"{rate / peak:.2f} of a {peak:.0f} GFLOP/s matmul of the model's shape")  # fmt: skip


# (the AR term computed, frozen weights cast once, one input's projections grouped, the loss chunks' gradient taken
# as they are computed): as training ran before the changes and after each.
SIDES = {
    "before": (True, False, False, False),
    "ar_left_out": (False, False, False, False),
    "cast_once": (False, True, False, False),
    "grouped": (False, True, True, False),
    "gradient_now": (False, True, True, True),
}


def matmul_gflops(hidden: int, intermediate: int, dtype: torch.dtype, rows: int = 512, repeats: int = 20) -> float:
    """GFLOP/s of [rows, hidden] x [hidden, intermediate] in `dtype` on this machine, best of `repeats`."""
    a, b = torch.randn(rows, hidden, dtype=dtype), torch.randn(hidden, intermediate, dtype=dtype)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * rows * hidden * intermediate / best / 1e9


if __name__ == "__main__":
    main()
