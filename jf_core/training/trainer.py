"""The project's one training loop.

Bootstrap (plain AR) and Jacobi Forcing differ only in the `Objective` they plug in; one process, DDP and FSDP2
differ only in the `Parallel` they pass (jf_core/training/parallel.py). The loop owns optimisation (AdamW, warmup +
cosine, accumulation, clipping), seeding, progress, the non-finite-loss guard and checkpoints.

- **Token-weighted steps.** Every objective (`Objective`) averages each loss term over the positions of the
  whole step (every micro-batch, every worker): the counts are summed (and all-reduced) before the first
  micro-batch runs, so a step is the same mean however it is split. Gradient averaging across workers is undone by
  scaling each worker's loss by the world size.
- **Mixed precision.** The weights the optimizer steps are fp32, always (AdamW on bf16 weights rounds most small
  updates away: at lr 1e-5, 15% of weights changed at all in 20 steps against 100% in fp32). Compute runs in
  `compute_dtype` under autocast (one process, DDP) or FSDP2's MixedPrecisionPolicy (bf16 compute, fp32 reduce).
- **Hooks.** What happens every N steps (a TPF probe, an on-policy refresh, a checkpoint) is a `Hook` with its
  `Every`, run after the step in the order given; a checkpoint hook restores the run before the first step.

Why 350 lines in one module: the loop, its config, its result, its hooks and the plain AR objective are what a
newcomer reads to find where a step happens and what it returns.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch
from pydantic import BaseModel, ConfigDict
from tqdm.auto import tqdm

from jf_core.onednn import size_primitive_cache
from jf_core.threads import ThreadGovernor, ThreadRecord
from jf_core.training.config import JFTrainConfig
from jf_core.training.parallel import Parallel

Batch = dict[str, torch.Tensor]


class Objective(Protocol):
    """A loss, token-weighted over the whole step: `counts(batch)` gives each loss term's positions in a
    micro-batch; the loop sums them over the step's micro-batches (and workers) into `norm` before the first one runs,
    so a step is the same mean however it is split; `summarize(totals)` turns the step's summed metrics into the
    logged ones."""

    def counts(self, batch: Batch) -> dict[str, int]: ...

    def __call__(
        self, model: torch.nn.Module, batch: Batch, norm: dict[str, float]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The scalar loss to minimise (this micro-batch's sums over `norm`) and its metrics to sum (floats)."""
        ...

    def summarize(self, totals: dict[str, float]) -> dict[str, float]: ...


class NonFiniteLossError(RuntimeError):
    pass


_PROFILE = JFTrainConfig.model_fields  # the profile's defaults are the loop's: one place for each


@dataclass
class TrainConfig:
    steps: int
    lr: float
    warmup_steps: int
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.95)
    grad_accum: int = _PROFILE["grad_accum"].default
    grad_clip: float = _PROFILE["grad_clip"].default
    seed: int = _PROFILE["seed"].default
    log_every: int = 10
    compute_dtype: torch.dtype = torch.float32  # autocast dtype when not float32 (one process and DDP)

    @classmethod
    def of(cls, t: JFTrainConfig, *, log_every: int = 10, compute_dtype: str = "float32") -> TrainConfig:
        """The loop of the profile's training section; `compute_dtype` as the round resolved it (training.compute_dtype,
        or the model's dtype: "auto" meaning fp32 on CPU and bf16 on CUDA)."""
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


class TrainSummary(BaseModel):
    """A training run's result: what the loop returns, what the round's driver completes with where it ran
    (jf_core/round/training.py, the same on every worker), and what the training stage keeps as the model
    directory's marker (jf_core/round/results.py `TrainResult`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    steps: int
    train_seconds: float
    model_in: str | None = None  # set by the round's driver
    strategy: str = "single"
    workers: int = 1
    # What its matmuls ran in (TrainConfig.compute_dtype: training.compute_dtype as the round resolved it, `auto`
    # measured); None in a record written before it was kept.
    compute_dtype: str | None = None
    resumed_from_step: int = 0  # the step a checkpoint put the run at (0: from the start)
    threads: ThreadRecord = ThreadRecord()  # the counts this run used (jf_core/threads.py), for its params
    history: list[dict[str, int | float]] = []  # the loss curve: a row per logged step, and the hooks' figures


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warmup to `lr`, then cosine decay to `lr * min_lr_ratio` at the last step."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps - 1)
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * cosine)


# -- hooks: what the loop does every N steps ------------------------------------------------------------------------


@dataclass(frozen=True)
class Every:
    """When a hook runs: after every `steps` optimizer steps (0: never), and after the last step when `at_end`."""

    steps: int
    at_end: bool = True

    def due(self, done: int, total: int) -> bool:
        if not self.steps:
            return False
        return self.at_end if done == total else done % self.steps == 0


@dataclass
class Loop:
    """The loop's state, as a hook sees it. `step`: optimizer steps done."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    parallel: Parallel
    batches: Iterator[Batch]
    cfg: TrainConfig
    history: list[dict[str, float]] = field(default_factory=list)
    step: int = 0

    def __post_init__(self) -> None:
        self.device = self.parallel.device(self.model)  # once: the step below runs thousands of times

    def autocast(self) -> contextlib.AbstractContextManager:
        """The compute dtype's autocast where the strategy uses one (one process, DDP), else nothing."""
        if self.cfg.compute_dtype != torch.float32 and self.parallel.uses_autocast:
            return torch.autocast(self.device.type, dtype=self.cfg.compute_dtype)
        return contextlib.nullcontext()


class Hook(Protocol):
    when: Every

    def start(self, loop: Loop) -> None:
        """Before the first step (a checkpoint restores the run here)."""

    def __call__(self, loop: Loop) -> dict[str, float] | None:
        """When due: figures to merge into this step's history row, or None."""


@dataclass
class Probe:
    """Figures of the model in eval mode, merged into that step's history row: a TPF probe (every N steps and after
    the last), or an on-policy refresh, which may also change the data the batches are drawn from (those changes
    live in memory only: a resumed run starts again from the packed data). One process only: a measurement on one
    worker of a sharded model would wait forever for the others."""

    measure: Callable[[torch.nn.Module], dict[str, float]]
    when: Every

    def start(self, loop: Loop) -> None:
        if loop.parallel.world_size > 1:
            raise ValueError("a training probe runs in one process only (it decodes with the whole model)")

    def __call__(self, loop: Loop) -> dict[str, float]:
        loop.model.eval()
        try:
            return self.measure(loop.model)
        finally:
            loop.model.train()


@dataclass
class Checkpoints:
    """Weights, optimizer state, step and history under `directory`, written atomically when due; with `resume`,
    a run restarts from the latest complete one, its data stream fast-forwarded, so it reaches the same weights as
    an uninterrupted run. `keep`: the newest complete checkpoints kept, older ones deleted once a new one is complete
    (None: all)."""

    directory: Path
    when: Every
    resume: bool = True
    keep: int | None = None

    def start(self, loop: Loop) -> None:
        found = loop.parallel.latest_checkpoint(self.directory) if self.resume else None
        if found is not None:
            loop.step, loop.history = loop.parallel.load_checkpoint(found, loop.model, loop.optimizer)
            for _ in range(loop.step * loop.cfg.grad_accum):
                next(loop.batches)

    def __call__(self, loop: Loop) -> None:
        loop.parallel.save_checkpoint(self.directory, loop.step, loop.model, loop.optimizer, loop.history)
        if self.keep is not None and loop.parallel.rank == 0:  # every worker's save is complete by now
            loop.parallel.prune_checkpoints(self.directory, self.keep)


# -- the loop -------------------------------------------------------------------------------------------------------


def train(
    model: torch.nn.Module,
    batches: Iterator[Batch],
    objective: Objective,
    cfg: TrainConfig,
    *,
    hooks: Sequence[Hook] = (),
    on_log: Callable[[int, dict[str, float]], None] | None = None,
    progress: bool = True,
    parallel: Parallel | None = None,
    threads: ThreadGovernor | None = None,
) -> TrainSummary:
    """Run `cfg.steps` optimizer steps; after each, the `hooks` that are due, in the order given (a probe before
    the checkpoint that keeps its row). `threads`: a governor that sets torch's CPU threads to the CPUs other
    processes leave free, re-measured while the run goes (jf_core/threads.py); without one the count is left alone.
    `on_log(step, row)`: every logged row and every hook's figures."""
    size_primitive_cache()  # where no entry point did, and no bf16 product has run yet (jf_core/onednn.py)
    loop = Loop(model, _optimizer(model, cfg), parallel or Parallel(), batches, cfg)
    torch.manual_seed(cfg.seed)
    model.train()
    for hook in hooks:
        hook.start(loop)
    first_step = loop.step
    if threads is not None:
        threads.start(first_step)
    # Packed tokens trained on so far, counted from the batches (a layout's rows differ in length from visit to
    # visit), carried across a resume by the history rows the checkpoints keep.
    seen = next((row["tokens_seen"] for row in reversed(loop.history) if "tokens_seen" in row), 0.0)
    start = time.perf_counter()
    bar = tqdm(
        range(first_step, cfg.steps),
        desc="train",
        disable=not (progress and loop.parallel.rank == 0),
        dynamic_ncols=True,
    )
    for step in bar:
        if threads is not None:
            threads.tick(step)
        step_metrics, grad_norm = _step(loop, objective, step)
        seen += step_metrics.pop("packed_tokens")
        loop.step = step + 1
        due = [hook for hook in hooks if hook.when.due(loop.step, cfg.steps)]
        if step % cfg.log_every == 0 or step == cfg.steps - 1:
            row = {"step": float(step), "lr": loop.optimizer.param_groups[0]["lr"], "grad_norm": grad_norm}
            # Seconds since this process began training (a resumed run counts from its resume): the step rate.
            row.update(step_metrics, elapsed_s=time.perf_counter() - start, tokens_seen=seen)
            loop.history.append(row)
            bar.set_postfix({k: f"{v:.3g}" for k, v in step_metrics.items()})
            if on_log is not None:
                on_log(step, row)
        elif due:  # a checkpoint keeps the count as of its step
            loop.history.append({"step": float(step), "tokens_seen": seen})
        for hook in due:
            if (figures := hook(loop)) is not None:
                if not loop.history or loop.history[-1]["step"] != float(step):
                    loop.history.append({"step": float(step)})
                loop.history[-1].update(figures)
                if not bar.disable:  # a probe's figures in the log as they come, not only in the final rows
                    bar.write(f"step {step + 1}: " + ", ".join(f"{k} {v:.4g}" for k, v in figures.items()))
                if on_log is not None:
                    on_log(step, {"step": float(step), **figures})
    model.eval()
    return TrainSummary(
        steps=cfg.steps,
        train_seconds=time.perf_counter() - start,
        history=loop.history,
        resumed_from_step=first_step,
        compute_dtype=str(cfg.compute_dtype).removeprefix("torch."),
        threads=threads.record() if threads is not None else ThreadRecord(),
    )


def _optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW over the trainable weights, which must be fp32 masters; no decay on biases and norms."""
    params = [p for p in model.parameters() if p.requires_grad]
    low = sorted({str(p.dtype) for p in params if p.dtype != torch.float32})
    if low:
        raise ValueError(
            f"the optimizer would step {', '.join(low)} weights: train fp32 master weights and compute in "
            "bf16 (TrainConfig.compute_dtype, or FSDP2's MixedPrecisionPolicy)"
        )
    decay = [p for n, p in model.named_parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.requires_grad and p.ndim < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=cfg.betas,
    )


def _step(loop: Loop, objective: Objective, step: int) -> tuple[dict[str, float], float]:
    """One optimizer step over `grad_accum` micro-batches: (the step's metrics, the gradient norm before clipping)."""
    cfg, parallel, model, device = loop.cfg, loop.parallel, loop.model, loop.device
    for group in loop.optimizer.param_groups:
        group["lr"] = lr_at(step, cfg)
    micro = [{k: v.to(device) for k, v in next(loop.batches).items()} for _ in range(cfg.grad_accum)]
    norm: dict[str, float] = {}  # the step's positions per loss term, over every micro-batch and worker
    for batch in micro:
        for k, v in objective.counts(batch).items():
            norm[k] = norm.get(k, 0) + v
    norm = parallel.sum(norm)
    # What the step trained on, padding left out (a batch's `packed_tokens`; plain AR batches count none).
    totals: dict[str, float] = {"packed_tokens": float(sum(int(b.get("packed_tokens", 0)) for b in micro))}
    for i, batch in enumerate(micro):
        with parallel.no_sync(model, last=i == len(micro) - 1):
            with loop.autocast():
                loss, metrics = objective(model, batch, norm)
            # Workers' gradients are averaged: a token-weighted loss undoes that by the world size.
            (loss * parallel.world_size).backward()
        for k, v in {**metrics, "_loss": float(loss.detach())}.items():
            totals[k] = totals.get(k, 0.0) + v
    totals = parallel.sum(totals)
    if not math.isfinite(totals["_loss"]):
        raise NonFiniteLossError(f"loss is {totals['_loss']} at step {step}; metrics: {totals}")
    grad_norm = parallel.clip_grad_norm(model, cfg.grad_clip)
    loop.optimizer.step()
    loop.optimizer.zero_grad(set_to_none=True)
    return {**objective.summarize(totals), "packed_tokens": totals["packed_tokens"]}, grad_norm


class CausalLMLoss:
    """Plain next-token cross entropy (the bootstrap's objective, and Jacobi Forcing's mixed-in AR batches);
    positions labelled -100 (prompt, padding) are ignored. Token-weighted over `norm["lm"]` positions (default: this
    batch's)."""

    def counts(self, batch: Batch) -> dict[str, int]:
        return {"lm": int((batch["labels"][:, 1:] != -100).sum())}

    def __call__(
        self, model: torch.nn.Module, batch: Batch, norm: dict[str, float] | None = None
    ) -> tuple[torch.Tensor, dict[str, float]]:
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

    def summarize(self, totals: dict[str, float]) -> dict[str, float]:
        return {"loss": totals["lm_loss_sum"] / max(totals["lm_positions"], 1.0)}


causal_lm_loss = CausalLMLoss()
