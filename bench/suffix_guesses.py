"""How well suffix drafts continue answers the corpus does not hold, without a model: the greedy answers
`bench/draft_corpus.py` wrote (`CORPUS_DIR/answers.json`) split into a corpus (the first `--corpus` answers) and the
answers guessed (the rest), every position of each guessed at once from the answer so far, by each rule:

    .venv/bin/python bench/suffix_guesses.py --answers CORPUS_DIR/answers.json --corpus 768 \
        --rule 'share0.5:{"share": 0.5, "factor": 0}' --rule 'share0.3_factor1:{"share": 0.3, "factor": 1.0}'

For each rule: the share of positions with a guess, the tokens a guess gets right before its first miss (what a
verified branch would accept) and the tokens it lays out (what its branch costs, before any slots it shares with
the window or another branch), both per position. A proxy: in a decoder the block's end bounds a guess, and the
window and prompt lookup guess beside it; `jf bench cycle` measures the decoding itself.
"""

from __future__ import annotations

import argparse
import json

from jf_core.atomic import write_json_atomic
from jf_core.decoding.proposers.suffix import SuffixIndex
from jf_core.decoding.verify import common_prefix


def score(index: SuffixIndex, answers: list[list[int]], ngram: int, length: int, share: float, factor: float) -> dict:
    calls = guessed = laid = right = 0
    for answer in answers:
        for i in range(2, len(answer) - 1):
            guess = index.guess(answer[:i], ngram, length, share, factor)
            calls += 1
            guessed += bool(guess)
            laid += len(guess)
            right += common_prefix(guess, answer[i:])
    return {
        "positions": calls,
        "guessed": guessed / calls,
        "right_per_position": right / calls,
        "laid_per_position": laid / calls,
        "laid_per_right": laid / max(right, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--answers", required=True, help="answers.json from bench/draft_corpus.py (token ids)")
    ap.add_argument("--corpus", type=int, default=768, help="the first this many answers are the corpus")
    ap.add_argument("--ngram", type=int, default=8)
    ap.add_argument("--length", type=int, default=16)
    ap.add_argument("--rule", action="append", required=True, help='NAME:{"share": S, "factor": F}')
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args(argv)
    with open(args.answers) as fh:
        answers = json.load(fh)
    if not 0 < args.corpus < len(answers):
        ap.error(f"--corpus must leave answers to guess: 0 < {args.corpus} < {len(answers)}")
    index = SuffixIndex.of(answers[: args.corpus])
    rows = {}
    print(f"{len(answers) - args.corpus} answers guessed from a corpus of {args.corpus} ({len(index)} tokens)")
    print("| rule | guessed | right / position | laid out / position | laid out / right |\n|---|---|---|---|---|")
    for spec in args.rule:
        name, _, fields = spec.partition(":")
        rule = json.loads(fields)
        row = score(index, answers[args.corpus :], args.ngram, args.length, rule["share"], rule.get("factor", 0.0))
        rows[name] = {**rule, **row}
        print(
            f"| {name} | {row['guessed']:.3f} | {row['right_per_position']:.3f} | {row['laid_per_position']:.2f} "
            f"| {row['laid_per_right']:.2f} |",
            flush=True,
        )
    if args.json:
        write_json_atomic(args.json, {"answers": args.answers, "corpus": args.corpus, "rules": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
