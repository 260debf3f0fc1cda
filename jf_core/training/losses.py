"""Jacobi Forcing's losses from one forward pass over a packed batch.

- AR loss: cross entropy on every clean-block token (through EOS), each predicted from the clean token before it.
- Progressive consistency loss: self-distillation from the clean copy's logits (detached: the model is its own
  teacher) to the noisy copy's, from each block's first unconverged position on, with temperature tau
  (`consistency`): `kl`, KL(teacher || student), scaled by tau^2 to keep gradient size independent of tau: the same
  gradient as upstream's soft cross entropy, but 0 when noisy and clean agree; `tv`, the total variation
  1/2 sum |p - q| between the two distributions (bounded by 1, so a position the student is far from weighs no
  more than one it nearly has: SGLang's UNO trains its draft adapter so); `fixed_point`, cross entropy against the
  fixed point's tokens.
- Base KL (optional, `base_kl_weight`): KL(base || model) at the AR loss's positions, the base being a frozen copy
  of the input model run on the same packed batch. The AR loss keeps the argmax of the trained text; this keeps
  the whole next-token distribution there, near-ties included, which is what decides the text the model writes
  on questions it was not trained on.

Token-weighted: each term is a sum over its positions divided by a normaliser, by default the batch's own count of
those positions (a mean). The trainer passes the count over every micro-batch of the step on every worker instead,
so one step's loss is the same mean however the step is split into micro-batches and workers (upstream's mean of
per-worker means weighs a worker's tokens by how few it had; it also divides the consistency term by the number of
blocks, which makes its weight depend on answer length; we do neither).

Memory-lean: the LM head runs only on the positions a loss uses, `chunk` rows at a time, each chunk checkpointed
(its logits are recomputed in backward instead of kept), so peak memory grows with the chunk, not with vocabulary x
packed length; where no gradient reaches the head's weights (a draft adapter's frozen base), each chunk's gradient
is taken as it is computed instead (head.py, `chunked_sum`). The final hidden state is taken at the LM head's
input (head.py: a pre-hook that hands the model's own head call zero positions), so the forward still goes through
the whole wrapped model (DDP, FSDP2) and only the head moves out; the logits post-processing some architectures
apply after the head (Gemma2's final softcapping, Granite's scaling) is applied the same way, and
`check_lean_head` compares against the model's own logits once.

Why these in one module: the terms share the head's chunked rows, the per-position weights and the step's
normaliser, and the objective that runs them on a model (with the adapter's two passes) is their one caller.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch
import torch.nn.functional as F

from jf_core.decoding.backends import attention_implementation
from jf_core.draft_adapter.adapter import gated
from jf_core.layers.packed import switched_off
from jf_core.training import context_cache as two_passes
from jf_core.training.context_store import ContextStore
from jf_core.training.head import Batch, chunked_sum, frozen, head_fn, hidden_states_at_head, unwrap

if TYPE_CHECKING:
    from jf_core.training.config import JFTrainConfig


_switch = {"ar_cut": True}


def ar_term_kept() -> contextlib.AbstractContextManager:
    """The AR term computed meanwhile even where no gradient reaches it: what leaving it out saves is measured
    against it (bench/train_throughput.py)."""
    return switched_off(_switch, "ar_cut")


@dataclass(frozen=True)
class JFLossConfig:
    ar_weight: float = 1.0  # lambda
    consistency_weight: float = 1.0
    temperature: float = 1.0  # tau
    consistency: Literal["kl", "tv", "fixed_point"] = "kl"  # what pulls the noisy copy to the clean one
    mixed_ar_weight: float = 1.0  # weight of plain AR batches of ground-truth data, when mixed in
    chunk: int = 1024  # LM-head rows per checkpointed chunk
    base_kl_weight: float = 0.0  # KL(base || model) at the AR positions; needs the objective's `base` model

    def __post_init__(self) -> None:
        if self.consistency not in ("kl", "tv", "fixed_point"):
            raise ValueError(f"consistency must be kl, tv or fixed_point, got {self.consistency!r}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.ar_weight < 0 or self.consistency_weight < 0 or self.base_kl_weight < 0:
            raise ValueError("loss weights must be >= 0")
        if self.chunk < 1:
            raise ValueError(f"chunk must be >= 1, got {self.chunk}")


# ---- the LM head's rows, chunked (head.py takes the hidden states) ---------------------------------------------------


def _pick(hidden: torch.Tensor, index: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """hidden [B, L, H], index [B, K] positions, valid [B, K] -> the valid rows [N, H]."""
    rows = torch.gather(hidden, 1, index[..., None].expand(-1, -1, hidden.shape[-1]))
    return rows[valid]


def _cross_entropy_sum(
    hidden, head, index: torch.Tensor, targets: torch.Tensor, valid: torch.Tensor, chunk: int, weight=None
):
    """Summed cross entropy of the head's logits at `index`'s valid positions against `targets`, chunked; each
    position's term times its `weight` ([B, K], where given)."""
    return _weighed_sum(
        lambda rows, wanted: F.cross_entropy(head(rows), wanted, reduction="none"),
        (_pick(hidden, index, valid), targets[valid]),
        None if weight is None else weight[valid],
        chunk,
        frozen(head),
    )


def _weighed_sum(per_row: Callable[..., torch.Tensor], tensors: tuple, weight, chunk: int, frozen_head: bool):
    """`chunked_sum` of `per_row`'s [N] terms over `tensors`' rows, each times its `weight` ([N], where given)."""
    if weight is None:
        return chunked_sum(lambda *rows: per_row(*rows).sum(), *tensors, chunk=chunk, frozen_head=frozen_head)
    return chunked_sum(
        lambda *rows: (per_row(*rows[:-1]) * rows[-1]).sum(), *tensors, weight, chunk=chunk, frozen_head=frozen_head
    )


# ---- the losses ------------------------------------------------------------------------------------------------


def loss_counts(batch: Batch, cfg: JFLossConfig) -> dict[str, float]:
    """Positions each loss term is averaged over: the step's normaliser sums these over micro-batches and workers.
    Where the batch weighs its consistency students (`cons_weight`), that term's count is their summed weight, so
    the term stays a weighted mean."""
    hard = cfg.consistency == "fixed_point"
    cons = batch["cons_valid"] & (batch["cons_hard"] != -100) if hard else batch["cons_valid"]
    weight = batch.get("cons_weight")
    count = int(cons.sum()) if weight is None else float(weight[cons].sum())
    return {"ar": int((batch["ar_tgt"] != -100).sum()), "consistency": count}


def jf_losses(
    hidden: torch.Tensor,
    head: Callable[[torch.Tensor], torch.Tensor],
    batch: Batch,
    cfg: JFLossConfig,
    norm: dict[str, float] | None = None,
    base: tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]] | None = None,
    ar_gradient: bool = True,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Both losses from the final hidden states; `norm` defaults to this batch's own counts (means). `base`: the
    frozen base model's final hidden states on the same batch and its head, for the base KL term. `ar_gradient`
    False: nothing trainable reaches the AR loss's positions (a draft adapter's clean copies are the frozen base's),
    so the term, whose gradient is zero, is not computed and not reported: its LM head over a third of the packed
    positions was a tenth of an adapter's step on a CPU for a figure that is the base's own and never moves."""
    local = loss_counts(batch, cfg)
    norm = norm or local
    ar_valid = batch["ar_tgt"] != -100
    ar = _cross_entropy_sum(hidden, head, batch["ar_src"], batch["ar_tgt"], ar_valid, cfg.chunk) if ar_gradient else (
        hidden.new_zeros((), dtype=torch.float32))  # fmt: skip
    valid, weight = batch["cons_valid"], batch.get("cons_weight")
    if cfg.consistency == "fixed_point":
        valid = valid & (batch["cons_hard"] != -100)
        cons = _cross_entropy_sum(hidden, head, batch["cons_student"], batch["cons_hard"], valid, cfg.chunk, weight)
    else:
        tau, tv = cfg.temperature, cfg.consistency == "tv"

        def divergence(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
            """Each row's divergence [N]."""
            log_teacher = F.log_softmax(head(teacher).detach() / tau, dim=-1)  # the model is its own fixed teacher
            log_student = F.log_softmax(head(student) / tau, dim=-1)
            if tv:
                return 0.5 * (log_student.exp() - log_teacher.exp()).abs().sum(dim=-1)
            return F.kl_div(log_student, log_teacher, log_target=True, reduction="none").sum(dim=-1) * tau * tau

        cons = _weighed_sum(
            divergence,
            (_pick(hidden, batch["cons_student"], valid), _pick(hidden, batch["cons_teacher"], valid).detach()),
            None if weight is None else weight[valid],
            cfg.chunk,
            frozen(head),
        )
    ar_mean = ar / max(norm["ar"], 1)
    cons_mean = cons / (norm["consistency"] or 1)  # a count, or a summed weight that may be below 1
    loss = cfg.ar_weight * ar_mean + cfg.consistency_weight * cons_mean
    extra = {}
    if cfg.base_kl_weight:
        if base is None:
            raise ValueError("base_kl_weight > 0 needs the base model's hidden states (the objective's `base`)")
        base_hidden, base_head = base

        def base_kl_sum(rows: torch.Tensor, base_rows: torch.Tensor) -> torch.Tensor:
            log_base = F.log_softmax(base_head(base_rows), dim=-1)
            return F.kl_div(F.log_softmax(head(rows), dim=-1), log_base, log_target=True, reduction="sum")

        base_kl = chunked_sum(
            base_kl_sum, _pick(hidden, batch["ar_src"], ar_valid), _pick(base_hidden, batch["ar_src"], ar_valid),
            chunk=cfg.chunk, frozen_head=frozen(head) and frozen(base_head),
        )  # fmt: skip
        base_kl_mean = base_kl / max(norm["ar"], 1)
        loss = loss + cfg.base_kl_weight * base_kl_mean
        extra = {"base_kl": float(base_kl_mean.detach()), "base_kl_sum": float(base_kl.detach())}
    ar_figures = {"ar_loss": float(ar_mean.detach()), "ar_loss_sum": float(ar.detach())} if ar_gradient else {}
    return loss, {
        **extra,
        **ar_figures,
        "loss": float(loss.detach()),
        "consistency_loss": float(cons_mean.detach()),
        # sums and counts: the trainer reduces these into the step's token-weighted means (`summarize`)
        "consistency_loss_sum": float(cons.detach()),
        "ar_positions": float(local["ar"]),
        "consistency_positions": float(local["consistency"]),
    }


def check_lean_head(model: torch.nn.Module, batch: Batch, variant: str = "shipped", atol: float = 1e-3) -> None:
    """Once per training run, on the plain model (before DDP or FSDP2 wraps it: a no-grad forward through an FSDP2
    model would leave its root unsharded): the logits the lean loss computes equal the model's own.

    Raises ValueError naming the architecture when they do not (post-processing after the head that `head_fn`
    does not know): `training.lean_loss: false` trains on the model's own full logits instead."""
    inner = unwrap(model)
    sample = {k: v[:1] for k, v in batch.items() if isinstance(v, torch.Tensor) and v.dim() >= 1}
    kwargs = _forward_kwargs(model, sample, variant)
    with torch.no_grad():
        full = inner(**kwargs).logits.float()
        with hidden_states_at_head(inner) as captured:
            inner(**kwargs)
        lean = head_fn(inner)(captured["hidden"][0])
    if not torch.allclose(full[0], lean, atol=atol, rtol=1e-3):
        raise ValueError(
            f"{type(inner).__name__} post-processes its logits in a way the memory-lean loss does not reproduce "
            f"(max difference {(full[0] - lean).abs().max():.3g}); set training.lean_loss: false"
        )


def _forward_kwargs(model: torch.nn.Module, batch: Batch, variant: str) -> dict:
    mask = batch.get("attention_mask")
    if attention_implementation(unwrap(model)) == "flex_attention":
        mask = flex_block_mask(
            batch["layout_kind"], batch["layout_block"], variant, batch.get("layout_copy"), batch.get("layout_anchor")
        )
    return {"input_ids": batch["input_ids"], "position_ids": batch["position_ids"], "attention_mask": mask}


class JacobiForcingObjective:
    """The trainer's objective: one forward over a packed batch with its noise-aware mask, the losses from its
    hidden states (memory-lean by default). Plain AR batches of ground-truth data (those with `labels`) are scored
    with the ordinary causal LM loss."""

    def __init__(
        self,
        cfg: JFLossConfig,
        mask_variant: str = "shipped",
        lean: bool = True,
        base: torch.nn.Module | None = None,
        context_cache: bool = True,
        context_memory_mb: int = 0,
    ) -> None:
        if cfg.base_kl_weight and base is None:
            raise ValueError("base_kl_weight > 0 needs the frozen base model (JacobiForcingObjective's `base`)")
        self.cfg = cfg
        self.mask_variant = mask_variant
        self.lean = lean
        self.context_cache = context_cache  # a draft adapter's context once, without autograd (context_cache.py)
        self.store = ContextStore(context_memory_mb * 2**20) if context_memory_mb else None  # kept between visits
        self.base = base.requires_grad_(False).eval() if base is not None else None

    @classmethod
    def of(cls, t: JFTrainConfig, base: torch.nn.Module | None = None) -> JacobiForcingObjective:
        """The profile's training section's loss; `base`: the frozen input model that `base_kl_weight` compares
        against (needed when it is > 0)."""
        loss = JFLossConfig(
            ar_weight=t.ar_weight,
            consistency_weight=t.consistency_weight,
            temperature=t.temperature,
            consistency=t.consistency,
            chunk=t.loss_chunk,
            base_kl_weight=t.base_kl_weight,
        )
        passes = {"context_cache": t.context_cache, "context_memory_mb": t.context_memory_mb}
        return cls(loss, t.mask, lean=t.lean_loss, base=base, **passes)

    def summarize(self, totals: dict[str, float]) -> dict[str, float]:
        """A step's metrics from its summed per-batch metrics (all micro-batches, all workers): token-weighted."""
        ar = totals.get("ar_loss_sum", 0.0) / max(totals.get("ar_positions", 0.0), 1.0)
        cons = totals.get("consistency_loss_sum", 0.0) / (totals.get("consistency_positions", 0.0) or 1.0)
        out = {
            "loss": self.cfg.ar_weight * ar + self.cfg.consistency_weight * cons,
            "consistency_loss": cons,
            "consistency_positions": totals.get("consistency_positions", 0.0),
        }
        if "ar_loss_sum" in totals:  # absent where no gradient reached it (`jf_losses`' ar_gradient)
            out["ar_loss"] = ar
        if "base_kl_sum" in totals:
            out["base_kl"] = totals["base_kl_sum"] / max(totals.get("ar_positions", 0.0), 1.0)
            out["loss"] += self.cfg.base_kl_weight * out["base_kl"]
        if totals.get("lm_positions"):
            out["mixed_ar_loss"] = totals["lm_loss_sum"] / totals["lm_positions"]
        return out | (self.store.figures() if self.store is not None else {})

    def counts(self, batch: Batch) -> dict[str, int]:
        if "labels" in batch:
            from jf_core.training.trainer import causal_lm_loss

            return causal_lm_loss.counts(batch)
        return loss_counts(batch, self.cfg)

    def __call__(
        self, model: torch.nn.Module, batch: Batch, norm: dict[str, float] | None = None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        if "labels" in batch:
            from jf_core.training.trainer import causal_lm_loss

            loss, metrics = causal_lm_loss(model, batch, norm)
            return self.cfg.mixed_ar_weight * loss, metrics
        kwargs = _forward_kwargs(model, batch, self.mask_variant)
        base = None
        if self.cfg.base_kl_weight:
            with torch.no_grad():
                if self.lean:
                    with hidden_states_at_head(self.base) as seen:
                        self.base(**kwargs)
                    base = (seen["hidden"], head_fn(self.base))
                else:
                    base = (self.base(**kwargs).logits.float(), lambda rows: rows)
        # A draft adapter acts on the drafted positions only: the base computes the context, the clean copies
        # (the teacher) and the AR loss's positions, so only the consistency term reaches the adapter.
        if self.lean and self.context_cache and two_passes.applies(model, batch):
            # The AR loss's positions (the clean copies) depend on no drafted position under either mask: no
            # gradient reaches them, so that term is left out (jf_losses' ar_gradient).
            hidden, dependent = two_passes.forward(model, batch, self.store)
            ar_rows = dependent.gather(1, batch["ar_src"])[batch["ar_tgt"] != -100]
            ar_gradient = bool(ar_rows.any()) or not _switch["ar_cut"]
            return jf_losses(hidden, head_fn(model), batch, self.cfg, norm, base, ar_gradient=ar_gradient)
        with gated(model, batch.get("draft_gate")):
            if self.lean:
                with hidden_states_at_head(model) as captured:
                    model(**kwargs)
                return jf_losses(captured["hidden"], head_fn(model), batch, self.cfg, norm, base)
            logits = model(**kwargs).logits.float()
        return jf_losses(logits, lambda rows: rows, batch, self.cfg, norm, base)


def flex_block_mask(
    kind: torch.Tensor,
    block: torch.Tensor,
    variant: str,
    copy: torch.Tensor | None = None,
    anchor: torch.Tensor | None = None,
):
    """The noise-aware mask as a FlexAttention BlockMask: on GPUs it skips fully masked tiles instead of
    materialising B x L x L. The builder is compiled once and reused for every batch of a shape."""
    from torch.nn.attention.flex_attention import create_block_mask

    from jf_core.training.mask import mask_mod

    batch, width = kind.shape
    return create_block_mask(
        mask_mod(kind, block, variant, copy, anchor),
        B=batch,
        H=None,
        Q_LEN=width,
        KV_LEN=width,
        device=kind.device,
        _compile=True,
    )


def training_attention(device: torch.device, choice: str = "auto") -> str:
    """Attention backend for training with the noise-aware mask (`training.attention`): `auto` is FlexAttention on
    CUDA (flash-attention takes no custom masks), SDPA elsewhere; `sdpa` or `flex_attention` as named."""
    if choice != "auto":
        return choice
    if device.type == "cuda":
        try:
            import torch.nn.attention.flex_attention  # noqa: F401

            return "flex_attention"
        except ImportError:
            return "sdpa"
    return "sdpa"
