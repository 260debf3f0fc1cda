"""Streaming: every decoder hands each sequence's newly final tokens to `on_tokens` as forwards make them known.
The chunks concatenate to the output (EOS included), arrive over many forwards rather than once at the end, and are
never revised, on the embedded model whose answers end with EOS inside a block, at batch 1 and 4."""

from __future__ import annotations

import pytest

from jf_core.decoding import decode
from jf_core.decoding.ar import ar_decode
from jf_core.decoding.common import StopTokens
from jf_core.decoding.jacobi import JacobiConfig
from jf_core.decoding.multiblock import JFDecodeConfig
from jf_core.toy.task import make_split

pytestmark = pytest.mark.timeout(1800)

CONFIGS = {
    "jacobi": JacobiConfig(block_size=8, max_new_tokens=160),
    "multiblock": JFDecodeConfig(block_size=8, num_blocks=3, pool_size=0, max_new_tokens=160),
    "recycling": JFDecodeConfig(block_size=16, num_blocks=2, pool_size=4, seed_drafts=True, max_new_tokens=160),
    "adaptive": JFDecodeConfig(block_size=32, num_blocks=2, max_new_tokens=160, adaptive_width=True, ar_below=1.5),
}


class Sink:
    def __init__(self) -> None:
        self.chunks: dict[int, list[list[int]]] = {}

    def __call__(self, sequence: int, tokens: list[int]) -> None:
        assert tokens, "an empty chunk says nothing"
        self.chunks.setdefault(sequence, []).append(list(tokens))

    def joined(self, sequence: int) -> list[int]:
        return [t for chunk in self.chunks.get(sequence, []) for t in chunk]


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("method", ["ar", *CONFIGS])
def test_streamed_chunks_are_the_output_as_it_becomes_final(embedded, method, batch):
    model, tok = embedded
    prompts = [tok(e.prompt, add_special_tokens=False)["input_ids"] for e in make_split("test", batch)]
    stops = StopTokens(tok.eos_token_id, tok.pad_token_id)
    sink = Sink()
    if method == "ar":
        out = ar_decode(model, prompts, max_new_tokens=160, on_tokens=sink, stop=stops)
    else:
        out = decode(model, prompts, CONFIGS[method], on_tokens=sink, stop=stops)
    want = ar_decode(model, prompts, max_new_tokens=160, stop=stops).sequences
    for i, sequence in enumerate(out.sequences):
        assert sink.joined(i) == sequence == want[i]
        assert sequence[-1] == tok.eos_token_id
        # Progressive: one chunk per forward that made tokens final, not the whole answer at the end.
        assert len(sink.chunks[i]) >= max(2, len(sequence) // (1 if method == "ar" else 16)), sink.chunks[i]
        assert len(sink.chunks[i]) <= out.stats.sequences[i].forwards
