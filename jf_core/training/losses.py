"""Jacobi Forcing's losses from one forward pass over a packed batch.

- AR loss: cross entropy on every clean-block token (through EOS), each predicted from the clean token before it.
- Progressive consistency loss: self-distillation from the clean copy's logits (detached: the model is its own
  teacher) to the noisy copy's, from each block's first unconverged position on, with temperature tau (scaled by
  tau^2 to keep gradient size independent of tau). Written as KL(teacher || student): the same gradient as
  upstream's soft cross entropy, but 0 when noisy and clean agree. `hard_targets` uses cross entropy against the
  fixed-point tokens instead.
Both are means over their positions in the batch (upstream also divides the consistency term by the number of
blocks, which makes its weight depend on answer length; we do not).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class JFLossConfig:
    ar_weight: float = 1.0  # lambda
    consistency_weight: float = 1.0
    temperature: float = 1.0  # tau
    hard_targets: bool = False
    mixed_ar_weight: float = 1.0  # weight of plain AR batches of ground-truth data, when mixed in

    def __post_init__(self) -> None:
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.ar_weight < 0 or self.consistency_weight < 0:
            raise ValueError("loss weights must be >= 0")


def _gather(logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return torch.gather(logits, 1, index[..., None].expand(-1, -1, logits.shape[-1]))


def jf_losses(
    logits: torch.Tensor, batch: dict[str, torch.Tensor], cfg: JFLossConfig
) -> tuple[torch.Tensor, dict[str, float]]:
    logits = logits.float()
    ar_logits = _gather(logits, batch["ar_src"])
    ar = F.cross_entropy(ar_logits.reshape(-1, ar_logits.shape[-1]), batch["ar_tgt"].reshape(-1), ignore_index=-100)
    valid = batch["cons_valid"]
    student = _gather(logits, batch["cons_student"])[valid]
    if cfg.hard_targets:
        target = batch["cons_hard"][valid]
        keep = target != -100
        cons = F.cross_entropy(student[keep], target[keep]) if bool(keep.any()) else logits.sum() * 0.0
    elif len(student):
        teacher = _gather(logits, batch["cons_teacher"])[valid].detach()
        tau = cfg.temperature
        p_teacher = F.log_softmax(teacher / tau, dim=-1)
        p_student = F.log_softmax(student / tau, dim=-1)
        cons = F.kl_div(p_student, p_teacher, log_target=True, reduction="batchmean") * tau * tau
    else:
        cons = logits.sum() * 0.0
    loss = cfg.ar_weight * ar + cfg.consistency_weight * cons
    return loss, {
        "loss": loss.item(),
        "ar_loss": ar.item(),
        "consistency_loss": cons.item(),
        "consistency_positions": float(valid.sum()),
    }


class JacobiForcingObjective:
    """The trainer's objective: one forward over a packed batch with its noise-aware mask. Plain AR batches of
    ground-truth data (those with `labels`) are scored with the ordinary causal LM loss."""

    def __init__(self, cfg: JFLossConfig, mask_variant: str = "shipped") -> None:
        self.cfg = cfg
        self.mask_variant = mask_variant

    def __call__(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        if "labels" in batch:
            from jf_core.training.trainer import causal_lm_loss

            loss, metrics = causal_lm_loss(model, batch)
            return self.cfg.mixed_ar_weight * loss, {"mixed_ar_loss": metrics["loss"]}
        mask = batch["attention_mask"]
        config = getattr(model, "module", model).config
        if getattr(config, "_attn_implementation", None) == "flex_attention":
            mask = flex_block_mask(batch["layout_kind"], batch["layout_block"], self.mask_variant)
        logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], attention_mask=mask).logits
        return jf_losses(logits, batch, self.cfg)


def flex_block_mask(kind: torch.Tensor, block: torch.Tensor, variant: str):
    """The noise-aware mask as a FlexAttention BlockMask: on GPUs it skips fully masked tiles instead of
    materialising B x L x L."""
    from torch.nn.attention.flex_attention import create_block_mask

    from jf_core.training.mask import mask_mod

    batch, width = kind.shape
    return create_block_mask(
        mask_mod(kind, block, variant), B=batch, H=None, Q_LEN=width, KV_LEN=width, device=kind.device
    )


def training_attention(device: torch.device) -> str:
    """Attention backend for training with the noise-aware mask: FlexAttention on CUDA (flash-attention takes no
    custom masks), SDPA elsewhere."""
    if device.type == "cuda":
        try:
            import torch.nn.attention.flex_attention  # noqa: F401

            return "flex_attention"
        except ImportError:
            return "sdpa"
    return "sdpa"
