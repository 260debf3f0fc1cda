"""Where models go wrong on the embedded task: greedy AR on the test programs, and for every wrong answer the first
step that differs from the reference.

    .venv/bin/python bench/answer_errors.py MODEL_DIR [MODEL_DIR ...] [--num-prompts 200]
"""

from __future__ import annotations

import argparse

from jf_core.decoding import ar_decode
from jf_core.models import load_model, stop_tokens
from jf_core.toy.task import make_split


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--num-prompts", type=int, default=200)
    args = parser.parse_args()
    examples = make_split("test", args.num_prompts)
    for path in args.models:
        model, tok = load_model(path)
        wrong = []
        for start in range(0, len(examples), 50):
            batch = examples[start : start + 50]
            prompts = [tok(e.prompt, add_special_tokens=False)["input_ids"] for e in batch]
            out = ar_decode(model, prompts, max_new_tokens=160, stop=stop_tokens(model, tok))
            for e, seq in zip(batch, out.sequences, strict=True):
                got = tok.decode(seq, skip_special_tokens=True).strip()
                if got != e.answer:
                    want_steps, got_steps = e.answer.split("; "), got.split("; ")
                    k = next(
                        (j for j, (a, b) in enumerate(zip(want_steps, got_steps, strict=False)) if a != b),
                        len(got_steps),
                    )
                    wrong.append(
                        f"{e.prompt}: step {k} of {len(want_steps)}: want {want_steps[min(k, len(want_steps) - 1)]!r}, "
                        f"got {got_steps[k] if k < len(got_steps) else '<end>'!r}"
                    )
        print(f"{path}: {len(wrong)} wrong of {len(examples)}")
        for line in wrong:
            print(f"  {line}")


if __name__ == "__main__":
    main()
