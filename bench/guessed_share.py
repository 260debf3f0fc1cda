"""How many of a round's consistency students the text proposers already guess (training.guessed_weight), without a
model: each packed example's noisy blocks as packing drew them, each span's root at its first departure, and the
share of students at each depth from the root that prompt lookup or the other fold's answers (suffix drafts, as a
tree) guess (jf_core/training/guessed.py):

    .venv/bin/python bench/guessed_share.py --packed ROUND_DIR/packed/examples.parquet --examples 150 --span 3

A student the text guesses earns the adapter nothing at decode time: verification keeps the text's branch, which
holds the same tokens. The share is what `training.guessed_weight` weighs down.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter

from jf_core.atomic import write_json_atomic
from jf_core.training.guessed import TextGuesses
from jf_core.training.jf_data import read_packed_share
from jf_core.training.packing import consistency_targets, first_departure
from jf_core.training.spans import guessed_students


def shares(packed: str, examples: int, span: int, corpus: bool) -> dict:
    every = read_packed_share(packed, 0, 1)
    guesses = TextGuesses(every, corpus=corpus)  # the folds over every example, as training builds them
    students, guessed = Counter(), Counter()
    roots, start = 0, time.perf_counter()
    for ex in every[:examples]:
        for j, noisy in enumerate(ex.noisy):
            first = first_departure(ex, j, ex.lengths[j], noisy)
            targets = [] if first is None else consistency_targets(ex, j, first, span)
            if not targets:
                continue
            roots += 1
            for (t, _), held in zip(targets, guessed_students(guesses.depth, ex, j, first, targets), strict=True):
                students[t - first + 1] += 1
                guessed[t - first + 1] += held
    return {
        "packed_examples": len(every),
        "examples": min(examples, len(every)),
        "corpus": corpus,
        "roots": roots,
        "ms_per_root": 1000 * (time.perf_counter() - start) / max(roots, 1),
        "by_depth": {k: {"students": students[k], "guessed": guessed[k] / students[k]} for k in sorted(students)},
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--packed", required=True, help="a round's packed/examples.parquet")
    ap.add_argument("--examples", type=int, default=150, help="examples whose spans are counted")
    ap.add_argument("--span", type=int, default=3, help="training.draft_span")
    ap.add_argument("--no-corpus", action="store_true", help="prompt lookup alone (a round without a draft corpus)")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args(argv)
    out = shares(args.packed, args.examples, args.span, not args.no_corpus)
    for k, row in out["by_depth"].items():
        print(f"depth {k}: {row['students']} students, {row['guessed']:.1%} guessed by the text")
    print(f"{out['roots']} roots, {out['ms_per_root']:.2f} ms a root")
    if args.json:
        settings = {k: v for k, v in vars(args).items() if k != "json"}
        write_json_atomic(args.json, {"command": "bench/guessed_share.py", **settings, **out})
    else:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
