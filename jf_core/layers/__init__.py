"""The model's layers as decoding runs them, in one room: whatever replaces or extends a loaded model's own modules
for speed on its device. The decoders, training and the engine name none of them; a model is made ready by one call,
`prepare_for_decoding` (what `models.load_model` does), and keeps its parameters, ties and state dict through it.

- `packed.py`: linear layers on oneDNN with their weights packed once (no gradient, fp32, CPU), `PackedLinear`
  swapped in by `pack_linears` where the model's weights stream from memory;
- `heads.py`: the LM head by vocabulary slices (`SlicedLMHead`) or as an fp32 copy (`Fp32LMHead`);
- `siblings.py`: a layer's projections of one input (q, k, v; gate, up) as one packed product, `group_siblings`;
- `lora.py`: a low-rank delta on a layer's output, by hook or fused into the packed product (the draft adapter's
  arithmetic; the adapter itself, its gate and files, is jf_core/draft_adapter/);
- `blocks.py`: the model's repeated decoder blocks (`decoder_layers`: what FSDP2 shards, what an adapter's
  `last_layers` counts);
- `prepare.py`: `prepare_for_decoding`.
"""

from jf_core.layers.prepare import prepare_for_decoding

__all__ = ["prepare_for_decoding"]
