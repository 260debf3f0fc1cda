"""`training.draft_lora`, the adapter's section of the training config, and the file a model directory keeps it
in: plain data, so that reading a profile or looking into a directory imports no torch (the adapter is adapter.py)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

FILE = "draft_adapter.safetensors"  # beside the base weights; rank, alpha and targets in its metadata
# Llama-family names (Qwen2, Llama, Mistral, SmolLM2, the embedded model): attention and MLP projections.
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class DraftLora(BaseModel):
    """`training.draft_lora`: the draft-only LoRA that trains instead of the model (absent: the whole model trains).
    UNO's ablation: all seven projections beat attention-only; alpha/r from 2 to 64 added 10%."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rank: int = Field(ge=1)
    alpha: float | None = Field(None, gt=0)  # None: alpha = rank (scale 1)
    targets: tuple[str, ...] = Field(TARGETS, min_length=1)  # projection names (Llama-family layers)
    # Only the model's last N decoder layers adapted (None: all): the layers below compute the base's states for the
    # draft slots too, and a decoding forward pays the adapter's products in N layers instead of every one.
    last_layers: int | None = Field(None, ge=1)
