"""Which decoder runs a batch, and `decode`, the front door that runs it: AR, plain Jacobi or Jacobi Forcing
(multi-block, recycling), chosen here and nowhere else. The bench, the evaluation and the server all decode through
this module; every choice is lossless, so it changes speed, never text.

The stored rule (`prior`) is what `jf tune` measured by decoding alone on the hardware named in the model's block
(jf_core/model_dir.py): Jacobi at or below `ar_above_batch`, AR above it, and AR while the running mean of accepted
tokens per forward (TPF) is below the break-even TPF. `decode` applies it to one batch.

A server is not the tuning loop: per token it detokenizes, sends an SSE chunk and wakes the event loop on the same
cores (AR pays that once per token, Jacobi once per forward), and it may run on other hardware or another load: a
decode-only crossover sent batches to AR that Jacobi served faster behind the server (docs/serving.md, the
measured dispatch). So `Dispatch` keeps, per batch-size bucket (1, 2, 3-4,
5-8, ...), an exponentially weighted mean of the tokens per second each method delivered, and overrides the prior
when the other method is faster by more than a margin (25%: it keeps per-batch noise from flapping it).

The second batch of a bucket and every `probe_every`-th after run the method not chosen, so both stay measured and
a change (harder prompts, a busier machine) is seen; while one method is more than 1.5x faster (measured here, else
by the block's crossover) probes are 4x rarer and the first waits 2 * `probe_every` batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch

from jf_core.decoding.ar import ar_decode
from jf_core.decoding.common import DecodeOutput, StopTokens, TokenSink
from jf_core.decoding.jacobi import JacobiConfig, jacobi_decode
from jf_core.decoding.multiblock import JFDecodeConfig, jf_decode
from jf_core.decoding.sampling import Sampling

Decoder = Literal["jacobi", "ar"]


def prior(
    batch_size: int,
    ar_above_batch: int | None,
    break_even_tpf: float | None = None,
    recent_tpf: Sequence[float] = (),
) -> Decoder:
    """The stored rule: AR above the measured crossover's batch size, and while the running mean TPF (two Jacobi
    batches at least) is below the break-even TPF; Jacobi otherwise."""
    if ar_above_batch is not None and batch_size > ar_above_batch:
        return "ar"
    if break_even_tpf is not None and len(recent_tpf) >= 2 and sum(recent_tpf) / len(recent_tpf) < break_even_tpf:
        return "ar"
    return "jacobi"


def decode(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    config: JacobiConfig,
    *,
    stop: StopTokens,
    on_tokens: TokenSink | None = None,
    sampling: Sampling | None = None,
    seeds: Sequence[int] | None = None,
    ar_above_batch: int | None = None,
    decoder: Decoder | None = None,
) -> DecodeOutput:
    """Decode a batch. Greedy when `sampling` is None; otherwise exact sampling with one seed per prompt
    (sampling.py). `decoder` forces a method; else a batch larger than `ar_above_batch` (the crossover `jf tune`
    stores in the model's block) runs AR, where AR was measured faster, and the rest runs the config: Jacobi Forcing
    for a JFDecodeConfig, plain Jacobi for a JacobiConfig. The text is the same whichever runs."""
    common = {"stop": stop, "on_tokens": on_tokens, "sampling": sampling, "seeds": seeds}
    if (decoder or prior(len(prompts), ar_above_batch)) == "ar":
        return ar_decode(model, prompts, max_new_tokens=config.max_new_tokens, **common)
    if isinstance(config, JFDecodeConfig):
        return jf_decode(model, prompts, config, **common)
    return jacobi_decode(model, prompts, config, **common)


def bucket(batch_size: int) -> int:
    """The power of two at or above `batch_size`: batches of similar size share a measurement."""
    return 1 << max(batch_size - 1, 0).bit_length()


def _other(method: Decoder) -> Decoder:
    return "ar" if method == "jacobi" else "jacobi"


@dataclass
class Dispatch:
    tpf_window: int = 8  # Jacobi batches in the running mean TPF
    probe_every: int = 8  # in each bucket, batch 1 and every probe_every-th after run the method not chosen
    # A measured rate overrides the prior only when this much faster. Per-batch tokens/s is noisy (a batch's TPF and
    # answer lengths vary severalfold at batch 1): at a 10% margin a run of hard prompts flipped a far faster Jacobi
    # to AR for several batches (an earlier run on the embedded model).
    margin: float = 0.25
    weight: float = 0.2  # of a new observation in the running tokens/s
    rates: dict[tuple[Decoder, int], float] = field(default_factory=dict)  # (method, bucket) -> tokens/s
    batches: dict[int, int] = field(default_factory=dict)  # bucket -> batches dispatched
    recent_tpf: list[float] = field(default_factory=list)

    def prior(self, batch_size: int, ar_above_batch: int | None, break_even_tpf: float | None) -> Decoder:
        return prior(batch_size, ar_above_batch, break_even_tpf, self.recent_tpf)

    def preferred(self, batch_size: int, ar_above_batch: int | None, break_even_tpf: float | None) -> Decoder:
        """The prior, unless this server measured the other method faster at this batch size by the margin."""
        chosen, k = self.prior(batch_size, ar_above_batch, break_even_tpf), bucket(batch_size)
        mine, theirs = self.rates.get((chosen, k)), self.rates.get((_other(chosen), k))
        if mine is not None and theirs is not None and theirs > mine * (1 + self.margin):
            return _other(chosen)
        return chosen

    def choose(
        self,
        batch_size: int,
        ar_above_batch: int | None,
        break_even_tpf: float | None,
        prior_speedup: float | None = None,
    ) -> Decoder:
        """`prior_speedup`: Jacobi's TPS over AR's at this batch size by the block's crossover, if measured."""
        k = bucket(batch_size)
        n = self.batches.get(k, 0)
        self.batches[k] = n + 1
        chosen = self.preferred(batch_size, ar_above_batch, break_even_tpf)
        jacobi, ar = self.rates.get(("jacobi", k)), self.rates.get(("ar", k))
        gap = max(jacobi, ar) / min(jacobi, ar) if jacobi and ar else prior_speedup
        if gap is not None and gap > 0 and max(gap, 1 / gap) > 1.5:
            # A wide gap (measured here, else by the crossover) takes many batches to close: probing it often only
            # costs throughput (an earlier run on the embedded model). The first probe waits too.
            every, phase = 4 * self.probe_every, 2 * self.probe_every
        else:
            every, phase = self.probe_every, 1
        return _other(chosen) if n % every == phase else chosen

    def observe(self, method: Decoder, batch_size: int, tokens: int, seconds: float, tpf: float | None = None) -> None:
        """A finished batch: `tokens` generated in `seconds` of decoding; `tpf` its mean accepted tokens per
        forward (Jacobi)."""
        if seconds > 0 and tokens > 0:
            key = (method, bucket(batch_size))
            rate = tokens / seconds
            old = self.rates.get(key)
            self.rates[key] = rate if old is None else (1 - self.weight) * old + self.weight * rate
        if method == "jacobi" and tpf is not None:
            self.recent_tpf = [*self.recent_tpf, tpf][-self.tpf_window :]

    def summary(self) -> dict[str, float]:
        """The running tokens/s, as `<method>@<bucket>` (the server's /health shows it)."""
        ordered = sorted(self.rates.items(), key=lambda kv: (kv[0][1], kv[0][0]))
        return {f"{method}@{k}": round(rate, 1) for (method, k), rate in ordered}
