"""A draft-only LoRA: weights that draft apart from the weights that verify.

Training the whole model on its own Jacobi trajectories makes it draft better, but the model that drafts is also the
model that verifies, so the text it accepts is its new greedy text: on questions it was not trained on, that text
changed (docs/experiments/mechanism.md). With a draft adapter the base weights stay frozen and verify; low-rank
adapters on the attention and MLP projections act only on the positions that draft, chosen per token by a gate:

- the base computes every token that is committed (gate 0 on the verified window and so on the whole KV cache), and
  a draft token is accepted only where it equals the base's own greedy pick: the output is the base model's greedy
  output by construction, whatever the adapter learned (`JacobiDecoder` with an adapter, jf_core/decoding/jacobi.py);
- the adapter drafts from a second chain in the same forward: the window's draft tokens again, gated on, seeing the
  base's cache and their own chain. A forward carries 2n - 2 tokens instead of n (the chain skips the window's
  last slot, whose guess is never read), or n + `draft_span` with a shorter chain (JacobiConfig.draft_span).

The design is SGLang's UNO's (a draft-only LoRA, lossless against the base by construction). Training
(`training.draft_lora`) gates the noisy blocks' drafted positions on and everything the decoder's cache would
hold off, so the adapter learns to map the base's context and its own draft to the base's fixed point.

The adapter is a submodule of the model (`jf_draft_adapter`: the optimizer, checkpoints and `.to()` reach it) whose
hooks add `gate * scale * B(A(x))` to each target projection's output while a gate is set (`gated`); outside it
the model is the base, exactly, with no hook on it. A model directory keeps it beside the base weights in
`draft_adapter.safetensors` (rank, scale and targets in the file's metadata), which `load_model` attaches.

The one seam, as TRL puts PEFT behind `peft_config` -> `get_peft_model`: the profile's `training.draft_lora`
section is a `DraftLora` (config.py, no torch); from adapter.py training calls `for_training` (and
`directory_parts` to save), loading `load_draft_adapter`, planning `target_projections`, and decoding and training
build their gates from one rule (`drafted_slots` -> `draft_gate`). Decoding's use of it, the draft chain, is
`decoding/proposers/adapter_chain.AdapterChain`.
"""
