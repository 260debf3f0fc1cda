"""Check the benchmark scorers on real benchmark files: HumanEval's canonical solutions must all pass and its
prompts alone (no body) must all fail; every GSM8K reference answer must extract to its own `####` number.

    .venv/bin/python bench/check_scorers.py --humaneval ../shared/benchmarks/HumanEval.jsonl.gz \
        --gsm8k ../shared/benchmarks/gsm8k_test.jsonl
"""

from __future__ import annotations

import argparse
import time

from jf_core.evaluation.answers import gsm8k_correct
from jf_core.evaluation.benchmarks import load_benchmark, score


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--humaneval")
    parser.add_argument("--gsm8k")
    args = parser.parse_args()
    if args.humaneval:
        items = load_benchmark("humaneval", args.humaneval)
        t0 = time.perf_counter()
        canonical = sum(score("humaneval", i, i.record["canonical_solution"]) for i in items)
        empty = sum(score("humaneval", i, "") for i in items)
        print(
            f"HumanEval: canonical solutions pass {canonical}/{len(items)}; prompts alone pass {empty}/{len(items)}"
            f" ({time.perf_counter() - t0:.0f} s in the sandbox)"
        )
    if args.gsm8k:
        items = load_benchmark("gsm8k", args.gsm8k)
        ok = sum(gsm8k_correct(i.record["answer"], i.record["answer"]) for i in items)
        # The reference's own `####` line against a model-style answer: "The answer is N."
        styled = sum(
            gsm8k_correct(f"... so the answer is {i.record['answer'].split('####')[-1].strip()}.", i.record["answer"])
            for i in items
        )
        print(
            f"GSM8K: reference answers extract correctly {ok}/{len(items)}; as 'the answer is N' {styled}/{len(items)}"
        )


if __name__ == "__main__":
    main()
