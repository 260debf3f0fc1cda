"""How the training loop runs: one process (`Parallel`), or one of many data-parallel workers (`Distributed`:
DDP or FSDP2 over torch.distributed). The loop (trainer.py) is the same; these say how a step's numbers are
reduced across workers, when gradients synchronise, how the gradient norm is taken, and how checkpoints are kept.

Checkpoints are directories `step-<N>` under the checkpoint root, written under a temporary name and renamed, so a
reader never sees half of one. One process: the weights training changes as safetensors (a draft adapter's own,
not the frozen base it drafts for: that is the run's input model, loaded before a resume) + the optimizer state.
Distributed: torch.distributed.checkpoint (each worker writes its own shards; a resumed run may even have another
worker count), plus `trainer_state.json` written by rank 0 last.

Launch (Ray Train does this in tasks/train_distributed.py; by hand for a quick look):

    torchrun --nproc_per_node=2 my_training_script.py     # gloo on CPU, NCCL on GPUs
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import torch

from jf_core.checksums import verify, write_manifest
from jf_core.layers.blocks import decoder_layers
from jf_core.model_dir import save_checkpoint

STATE = "trainer_state.json"
WEIGHTS = "model.safetensors"


def _frozen(model: torch.nn.Module) -> set[str]:
    """Every name of a parameter training leaves as it is (a draft adapter's base), tied names included."""
    return {n for n, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad}


def _trained_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's state without its frozen parameters, each shared tensor once (tied embeddings: the LM head is
    the embedding), on the CPU: what a checkpoint must hold to resume the run."""
    frozen = _frozen(model)
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, tensor in model.state_dict().items():
        storage = tensor.data_ptr() if tensor.numel() else id(tensor)  # empty tensors share address 0
        if name in frozen or storage in seen:
            continue
        seen.add(storage)
        out[name] = tensor.detach().cpu().contiguous()
    return out


def _complete(root: Path) -> list[Path]:
    """The complete checkpoints under `root`, oldest first (step numbers are zero-padded: names sort as steps)."""
    return sorted(p for p in Path(root).glob("step-*") if (p / STATE).is_file())


class Parallel:
    """One process: nothing to reduce, checkpoints as safetensors + optimizer state."""

    rank = 0
    world_size = 1
    uses_autocast = True  # bf16 compute by autocast (FSDP2 casts through its MixedPrecisionPolicy instead)

    def device(self, model: torch.nn.Module) -> torch.device:
        return next(model.parameters()).device

    def sum(self, values: dict[str, float]) -> dict[str, float]:
        """The sum of each value over workers (keys may differ between workers)."""
        return dict(values)

    @contextlib.contextmanager
    def no_sync(self, model: torch.nn.Module, *, last: bool) -> Iterator[None]:
        """Around a micro-batch's forward and backward: gradients synchronise on the step's last one only."""
        yield

    def clip_grad_norm(self, model: torch.nn.Module, max_norm: float) -> float:
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)

    def barrier(self) -> None:
        pass

    # -- checkpoints --------------------------------------------------------------------------------------------

    def latest_checkpoint(self, root: Path) -> Path | None:
        """The newest complete checkpoint (an incomplete one never has its final name)."""
        done = _complete(root)
        return done[-1] if done else None

    def prune_checkpoints(self, root: Path, keep: int) -> None:
        """All but the newest `keep` complete checkpoints deleted (one being written is not complete yet)."""
        for old in _complete(root)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)

    def save_checkpoint(
        self, root: Path, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer, history: list[dict]
    ) -> None:
        from safetensors.torch import save_file

        extra = {STATE: json.dumps({"step": step, "history": history})}
        weights = _trained_weights(model)

        class _WithOptimizer:
            def save_pretrained(self, path, **kwargs):
                save_file(weights, str(Path(path) / WEIGHTS))
                torch.save(optimizer.state_dict(), Path(path) / "optimizer.pt")

        save_checkpoint(_WithOptimizer(), Path(root) / f"step-{step:08d}", extra_files=extra)

    def load_checkpoint(
        self, path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer
    ) -> tuple[int, list[dict]]:
        from safetensors.torch import load_file

        verify(path)  # a corrupted checkpoint is refused by name, never resumed from
        weights = load_file(str(path / WEIGHTS))
        missing, unexpected = model.load_state_dict(weights, strict=False)
        # Frozen weights are the input model's and tied embeddings are saved once (a checkpoint written whole, before
        # checkpoints held the trained weights only, loads too); anything else missing means another model's.
        frozen = _frozen(model)
        if unexpected or any(k not in frozen and "lm_head" not in k for k in missing):
            raise ValueError(f"checkpoint {path} does not match the model: missing {missing}, unexpected {unexpected}")
        optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True))
        state = json.loads((path / STATE).read_text())
        return state["step"], state["history"]

    def full_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
        return {k: v.detach().cpu() for k, v in model.state_dict().items()}


class Distributed(Parallel):
    """A worker of a torch.distributed process group, training a DDP-wrapped or FSDP2-sharded model."""

    def __init__(self, strategy: str) -> None:
        import torch.distributed as dist

        if strategy not in ("ddp", "fsdp2"):
            raise ValueError(f"unknown distributed strategy {strategy!r}; expected ddp or fsdp2")
        if not dist.is_initialized():
            raise RuntimeError("Distributed needs an initialised torch.distributed process group")
        self.strategy = strategy
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.uses_autocast = strategy == "ddp"

    def sum(self, values: dict[str, float]) -> dict[str, float]:
        import torch.distributed as dist

        gathered: list[dict] = [{} for _ in range(self.world_size)]
        dist.all_gather_object(gathered, dict(values))
        out: dict[str, float] = {}
        for part in gathered:
            for k, v in part.items():
                out[k] = out.get(k, 0.0) + v
        return out

    @contextlib.contextmanager
    def no_sync(self, model: torch.nn.Module, *, last: bool) -> Iterator[None]:
        if self.strategy == "fsdp2":
            model.set_requires_gradient_sync(last)
            yield
        elif last:
            yield
        else:
            with model.no_sync():
                yield

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier()

    def save_checkpoint(self, root, step, model, optimizer, history) -> None:
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        root = Path(root)
        final = root / f"step-{step:08d}"
        tmp = root / f".step-{step:08d}.tmp"
        if self.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        dist.barrier()
        model_state, optim_state = get_state_dict(model, optimizer)
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(tmp))
        dist.barrier()  # every worker's shards are written
        if self.rank == 0:
            (tmp / STATE).write_text(json.dumps({"step": step, "history": history}))
            write_manifest(tmp)  # every worker's shards are on the shared storage by now
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
        dist.barrier()

    def load_checkpoint(self, path, model, optimizer) -> tuple[int, list[dict]]:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        verify(path)
        model_state, optim_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optim": optim_state}
        dcp.load(state, checkpoint_id=str(path))
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        saved = json.loads((Path(path) / STATE).read_text())
        return saved["step"], saved["history"]

    def full_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
        """The whole model's state on rank 0 (CPU), None elsewhere; every worker must call it (it gathers)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return state if self.rank == 0 else None


def shard_fsdp2(
    model: torch.nn.Module, compute_dtype: torch.dtype, activation_checkpointing: bool, cpu_offload: bool = False
) -> torch.nn.Module:
    """FSDP2: `fully_shard` each decoder layer, then the model; fp32 master weights (the model arrives in fp32),
    compute in `compute_dtype`, gradients reduced in fp32; with `cpu_offload` the fp32 masters, gradients and AdamW
    state live in host memory (the optimizer steps there). The root keeps its parameters (embeddings, final norm,
    LM head) unsharded from forward to backward, which the memory-lean loss relies on (it calls the head after the
    forward)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    if activation_checkpointing:
        enable_activation_checkpointing(model)
    policy = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    offload = CPUOffloadPolicy() if cpu_offload else OffloadPolicy()
    for layer in decoder_layers(model):
        fully_shard(layer, mp_policy=policy, offload_policy=offload)
    fully_shard(model, mp_policy=policy, offload_policy=offload, reshard_after_forward=False)
    return model


def enable_activation_checkpointing(model: torch.nn.Module) -> None:
    """Recompute each decoder layer's activations in backward (non-reentrant), through transformers' own switch."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
