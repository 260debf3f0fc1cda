"""The project's one training loop.

Bootstrap (plain AR) and Jacobi Forcing differ only in the `Objective` they plug in; one process, DDP and FSDP2
differ only in the `Parallel` they pass (jf_core/training/parallel.py). The loop owns optimisation (AdamW, warmup +
cosine, accumulation, clipping), seeding, progress, the non-finite-loss guard and checkpoints.

- **Token-weighted steps.** An objective with `counts(batch)` averages each loss term over the positions of the
  whole step (every micro-batch, every worker): the counts are summed (and all-reduced) before the first
  micro-batch runs, so a step is the same mean however it is split. Gradient averaging across workers is undone by
  scaling each worker's loss by the world size.
- **Mixed precision.** The weights the optimizer steps are fp32, always (AdamW on bf16 weights rounds most small
  updates away: at lr 1e-5, 15% of weights changed at all in 20 steps against 100% in fp32). Compute runs in
  `compute_dtype` under autocast (one process, DDP) or FSDP2's MixedPrecisionPolicy (bf16 compute, fp32 reduce).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch
from tqdm.auto import tqdm

from jf_core.threads import ThreadGovernor, ThreadRecord
from jf_core.training.parallel import Parallel

if TYPE_CHECKING:
    from jf_core.training.config import JFTrainConfig

Batch = dict[str, torch.Tensor]


class Objective(Protocol):
    def __call__(self, model: torch.nn.Module, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        """Return the scalar loss to minimise and the per-step metrics to log (floats). Objectives that also have
        `counts(batch)`, `summarize(totals)` and take `norm` are token-weighted over the step (see above)."""


class NonFiniteLossError(RuntimeError):
    pass


@dataclass
class TrainConfig:
    steps: int = 1000
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 50
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.95)
    grad_accum: int = 1
    grad_clip: float = 1.0
    seed: int = 0
    log_every: int = 10
    compute_dtype: torch.dtype = torch.float32  # autocast dtype when not float32 (one process and DDP)

    @classmethod
    def of(cls, t: JFTrainConfig, *, log_every: int = 10, compute_dtype: str = "float32") -> TrainConfig:
        """The loop of the profile's training section; `compute_dtype` is the model's (a profile's model.dtype,
        "auto" meaning fp32 on CPU and bf16 on CUDA)."""
        return cls(
            compute_dtype=getattr(torch, compute_dtype),
            steps=t.steps,
            lr=t.lr,
            warmup_steps=t.warmup_steps,
            grad_accum=t.grad_accum,
            grad_clip=t.grad_clip,
            seed=t.seed,
            log_every=log_every,
        )

    def __post_init__(self) -> None:
        for name in ("steps", "grad_accum", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"TrainConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.lr <= 0:
            raise ValueError(f"TrainConfig.lr must be > 0, got {self.lr}")
        if not 0 <= self.warmup_steps < self.steps:
            raise ValueError(f"TrainConfig.warmup_steps must be in [0, steps), got {self.warmup_steps}")


@dataclass
class TrainResult:
    steps: int
    seconds: float
    history: list[dict[str, float]] = field(default_factory=list)
    resumed_from: int = 0  # the step a checkpoint put the run at (0: from the start)
    threads: ThreadRecord = field(default_factory=ThreadRecord)  # the counts this run used, for its params


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warmup to `lr`, then cosine decay to `lr * min_lr_ratio` at the last step."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps - 1)
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * cosine)


def train(
    model: torch.nn.Module,
    batches: Iterator[Batch],
    objective: Objective,
    cfg: TrainConfig,
    *,
    on_log: Callable[[int, dict[str, float]], None] | None = None,
    checkpoint_dir: Path | None = None,
    checkpoint_every: int = 0,
    resume: bool = True,
    progress: bool = True,
    save_model: Callable[[Path], None] | None = None,
    parallel: Parallel | None = None,
    threads: ThreadGovernor | None = None,
    probe: Callable[[torch.nn.Module], dict[str, float]] | None = None,
    probe_every: int = 0,
    refresh: Callable[[torch.nn.Module], dict[str, float]] | None = None,
    refresh_every: int = 0,
) -> TrainResult:
    """Run `cfg.steps` optimizer steps. With `checkpoint_dir` and `checkpoint_every`, a checkpoint (weights,
    optimizer state, step) is written atomically every that many steps and at the end, and with `resume` a run
    restarts from the latest complete one: the data stream is fast-forwarded, so a resumed run reaches the same
    weights as an uninterrupted one.

    `threads`: a governor that sets torch's CPU threads to the CPUs other processes leave free, re-measured while
    the run goes (jf_core/threads.py). Without one, the count is left as it is.

    `probe`: measured on the model (in eval mode) every `probe_every` steps and after the last, its figures merged
    into that step's history row (e.g. the TPF the model reaches so far: metrics per step in MLflow, a plot). One
    process only: a probe on one worker of a sharded model would wait forever for the others.

    `refresh`: called the same way every `refresh_every` steps (not after the last), but it may change the data the
    batches are drawn from (on-policy states, jf_core/training/onpolicy.py). Such changes live in memory only: a
    run resumed from a checkpoint starts again from the packed data."""
    parallel = parallel or Parallel()
    torch.manual_seed(cfg.seed)
    params = [p for p in model.parameters() if p.requires_grad]
    low = sorted({str(p.dtype) for p in params if p.dtype != torch.float32})
    if low:
        raise ValueError(
            f"the optimizer would step {', '.join(low)} weights: train fp32 master weights and compute in "
            "bf16 (TrainConfig.compute_dtype, or FSDP2's MixedPrecisionPolicy)"
        )
    device = parallel.device(model)
    decay = [p for n, p in model.named_parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.requires_grad and p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=cfg.betas,
    )
    model.train()
    history: list[dict[str, float]] = []
    first_step = 0
    if checkpoint_dir is not None and resume:
        found = parallel.latest_checkpoint(checkpoint_dir)
        if found is not None:
            first_step, history = parallel.load_checkpoint(found, model, optimizer)
            for _ in range(first_step * cfg.grad_accum):
                next(batches)
    counted = hasattr(objective, "counts")
    autocast = (
        torch.autocast(device.type, dtype=cfg.compute_dtype)
        if cfg.compute_dtype != torch.float32 and parallel.uses_autocast
        else contextlib.nullcontext()
    )
    if threads is not None:
        threads.start(first_step)
    start = time.perf_counter()
    show = progress and parallel.rank == 0
    bar = tqdm(range(first_step, cfg.steps), desc="train", disable=not show, dynamic_ncols=True)
    for step in bar:
        if threads is not None:
            threads.tick(step)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, cfg)
        micro = [{k: v.to(device) for k, v in next(batches).items()} for _ in range(cfg.grad_accum)]
        norm = None
        if counted:  # the step's positions per loss term, over every micro-batch and worker
            norm = {}
            for batch in micro:
                for k, v in objective.counts(batch).items():
                    norm[k] = norm.get(k, 0) + v
            norm = parallel.sum(norm)
        totals: dict[str, float] = {}
        for i, batch in enumerate(micro):
            with parallel.no_sync(model, last=i == len(micro) - 1):
                with autocast:
                    loss, metrics = objective(model, batch, norm) if counted else objective(model, batch)
                # Workers' gradients are averaged: a token-weighted loss undoes that by the world size.
                (loss * parallel.world_size if counted else loss / cfg.grad_accum).backward()
            for k, v in {**metrics, "_loss": float(loss.detach())}.items():
                totals[k] = totals.get(k, 0.0) + v
        totals = parallel.sum(totals)
        if not math.isfinite(totals["_loss"]):
            raise NonFiniteLossError(f"loss is {totals['_loss']} at step {step}; metrics: {totals}")
        if counted:
            step_metrics = objective.summarize(totals)
        else:  # mean of the micro-batches' (and workers') own means
            step_metrics = {k: v / (cfg.grad_accum * parallel.world_size) for k, v in totals.items() if k != "_loss"}
        grad_norm = parallel.clip_grad_norm(model, cfg.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % cfg.log_every == 0 or step == cfg.steps - 1:
            row = {"step": float(step), "lr": optimizer.param_groups[0]["lr"], "grad_norm": grad_norm, **step_metrics}
            # Seconds since this process began training (a resumed run counts from its resume): the step rate.
            row["elapsed_s"] = time.perf_counter() - start
            history.append(row)
            bar.set_postfix({k: f"{v:.3g}" for k, v in step_metrics.items()})
            if on_log is not None:
                on_log(step, row)
        done = step + 1
        hooks = [
            (probe, probe is not None and probe_every and (done % probe_every == 0 or done == cfg.steps)),
            (refresh, refresh is not None and refresh_every and done % refresh_every == 0 and done < cfg.steps),
        ]
        for hook, due in hooks:
            if not due:
                continue
            if parallel.world_size > 1:
                raise ValueError("a training probe runs in one process only (it decodes with the whole model)")
            model.eval()
            measured = hook(model)
            model.train()
            if not history or history[-1]["step"] != float(step):
                history.append({"step": float(step)})
            history[-1].update(measured)
            if on_log is not None:
                on_log(step, {"step": float(step), **measured})
        if checkpoint_dir is not None and checkpoint_every and (done % checkpoint_every == 0 or done == cfg.steps):
            parallel.save_checkpoint(checkpoint_dir, done, model, optimizer, history, save_model)
    model.eval()
    return TrainResult(
        steps=cfg.steps,
        seconds=time.perf_counter() - start,
        history=history,
        resumed_from=first_step,
        threads=threads.record() if threads is not None else ThreadRecord(),
    )


def causal_lm_loss(
    model: torch.nn.Module, batch: Batch, norm: dict[str, float] | None = None
) -> tuple[torch.Tensor, dict[str, float]]:
    """Plain next-token cross entropy; positions labelled -100 (prompt, padding) are ignored. Token-weighted over
    `norm["lm"]` positions (default: this batch's)."""
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    logits = out.logits[:, :-1].float()
    labels = batch["labels"][:, 1:]
    total = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.size(-1)), labels.reshape(-1), ignore_index=-100, reduction="sum"
    )
    count = int((labels != -100).sum())
    loss = total / max((norm or {"lm": count})["lm"], 1)
    total_value = float(total.detach())
    return loss, {"loss": total_value / max(count, 1), "lm_loss_sum": total_value, "lm_positions": float(count)}


def _lm_counts(batch: Batch) -> dict[str, int]:
    return {"lm": int((batch["labels"][:, 1:] != -100).sum())}


def _lm_summary(totals: dict[str, float]) -> dict[str, float]:
    return {"loss": totals["lm_loss_sum"] / max(totals["lm_positions"], 1.0)}


causal_lm_loss.counts = _lm_counts  # type: ignore[attr-defined]
causal_lm_loss.summarize = _lm_summary  # type: ignore[attr-defined]
