"""The project's one training loop.

Bootstrap (plain AR) and Jacobi Forcing differ only in the `Objective` they plug in: the loop owns optimisation
(AdamW, warmup + cosine, accumulation, clipping), seeding, progress, the non-finite-loss guard and checkpoints.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch
from tqdm.auto import tqdm

from jf_core.checkpoint import save_checkpoint

Batch = dict[str, torch.Tensor]


class Objective(Protocol):
    def __call__(self, model: torch.nn.Module, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        """Return the scalar loss to minimise and the per-step metrics to log (floats)."""


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
) -> TrainResult:
    """Run `cfg.steps` optimizer steps. With `checkpoint_dir` and `checkpoint_every`, a checkpoint (weights,
    optimizer state, step) is written atomically every that many steps and at the end, and with `resume` a run
    restarts from the latest complete one: the data stream is fast-forwarded, so a resumed run reaches the same
    weights as an uninterrupted one."""
    torch.manual_seed(cfg.seed)
    device = next(model.parameters()).device
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
        latest = latest_checkpoint(checkpoint_dir)
        if latest is not None:
            first_step, history = _load_training_state(latest, model, optimizer)
            for _ in range(first_step * cfg.grad_accum):
                next(batches)
    start = time.perf_counter()
    bar = tqdm(range(first_step, cfg.steps), desc="train", disable=not progress, dynamic_ncols=True)
    for step in bar:
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, cfg)
        totals: dict[str, float] = {}
        for _ in range(cfg.grad_accum):
            batch = {k: v.to(device) for k, v in next(batches).items()}
            loss, metrics = objective(model, batch)
            if not torch.isfinite(loss):
                raise NonFiniteLossError(f"loss is {loss.item()} at step {step}; metrics: {metrics}")
            (loss / cfg.grad_accum).backward()
            for k, v in metrics.items():
                totals[k] = totals.get(k, 0.0) + v / cfg.grad_accum
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % cfg.log_every == 0 or step == cfg.steps - 1:
            row = {"step": float(step), "lr": optimizer.param_groups[0]["lr"], "grad_norm": float(grad_norm), **totals}
            history.append(row)
            bar.set_postfix({k: f"{v:.3g}" for k, v in totals.items()})
            if on_log is not None:
                on_log(step, row)
        done = step + 1
        if checkpoint_dir is not None and checkpoint_every and (done % checkpoint_every == 0 or done == cfg.steps):
            _save_training_state(checkpoint_dir, done, model, optimizer, history, save_model)
    model.eval()
    return TrainResult(steps=cfg.steps, seconds=time.perf_counter() - start, history=history)


def latest_checkpoint(checkpoint_dir: Path) -> Path | None:
    """The newest complete checkpoint (incomplete ones never have their final name: see `save_checkpoint`)."""
    done = sorted(p for p in Path(checkpoint_dir).glob("step-*") if (p / "trainer_state.json").is_file())
    return done[-1] if done else None


def _save_training_state(root: Path, step: int, model, optimizer, history, save_model) -> None:
    import json

    state = {"step": step, "history": history}
    extra = {"trainer_state.json": json.dumps(state)}
    target = Path(root) / f"step-{step:08d}"

    class _WithOptimizer:
        def save_pretrained(self, path, **kwargs):
            (save_model or (lambda p: model.save_pretrained(p, safe_serialization=True)))(Path(path))
            torch.save(optimizer.state_dict(), Path(path) / "optimizer.pt")

    save_checkpoint(_WithOptimizer(), target, extra_files=extra)


def _load_training_state(path: Path, model, optimizer) -> tuple[int, list[dict[str, float]]]:
    import json

    from safetensors.torch import load_file

    weights = load_file(str(path / "model.safetensors"))
    missing, unexpected = model.load_state_dict(weights, strict=False)
    # Tied embeddings are saved once; anything else missing means the checkpoint is not this model's.
    if unexpected or any("lm_head" not in k for k in missing):
        raise ValueError(f"checkpoint {path} does not match the model: missing {missing}, unexpected {unexpected}")
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True))
    state = json.loads((path / "trainer_state.json").read_text())
    return state["step"], state["history"]


def causal_lm_loss(model: torch.nn.Module, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
    """Plain next-token cross entropy; positions labelled -100 (prompt, padding) are ignored."""
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    logits = out.logits[:, :-1].float()
    labels = batch["labels"][:, 1:]
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1), ignore_index=-100)
    return loss, {"loss": loss.item()}
