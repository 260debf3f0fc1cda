"""A model directory that drafts from a corpus of its own answers, without a round: the model's greedy answers to the
first `--num-prompts` questions of a prompt file (its chat template, `--field`, default `question`), kept as the
directory's draft corpus (jf_core/decoding/proposers/suffix.py), with links to the model's files and a copy of its
config. What a round's trajectory stage leaves beside its trained model (`training.draft_corpus`), made here for a
base model to measure suffix drafts apart from training:

    .venv/bin/python bench/draft_corpus.py --model BASE_DIR --prompts ../shared/benchmarks/gsm8k_train.jsonl \
        --num-prompts 1024 --out CORPUS_DIR

then `jf bench cycle --model BASE_DIR --config 'suffix@CORPUS_DIR:{..., "suffix": 16}'`. The answers are also written
to `CORPUS_DIR/answers.json` (token ids, in the file's order). `--first 1024 2048` also writes `CORPUS_DIR-1024` and
`CORPUS_DIR-2048`, the first 1,024 and 2,048 answers: smaller corpora from one decode, to measure what size buys.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from jf_core.atomic import atomic_dir, write_json_atomic
from jf_core.decoding import ar_decode
from jf_core.decoding.proposers.suffix import save_corpus
from jf_core.models import load_model, stop_tokens
from jf_core.trajectory.prompts import format_prompt


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a model directory")
    ap.add_argument("--prompts", required=True, help="a JSONL file of questions")
    ap.add_argument("--field", default="question")
    ap.add_argument("--num-prompts", type=int, default=1024)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True, help="the new model directory (must not exist)")
    ap.add_argument("--first", type=int, nargs="*", default=[], help="also OUT-N of the first N answers, for each N")
    args = ap.parse_args(argv)
    src, out = Path(args.model).resolve(), Path(args.out)
    subsets = {n: out.with_name(f"{out.name}-{n}") for n in args.first}
    with open(args.prompts) as fh:
        questions = [json.loads(line)[args.field] for line in fh if line.strip()][: args.num_prompts]
    for n, path in [(None, out), *subsets.items()]:
        if path.exists():
            ap.error(f"--out {path} exists")
        if n is not None and not 0 < n < len(questions):  # the file may hold fewer than --num-prompts
            ap.error(f"--first {n}: not between 0 and the {len(questions)} questions decoded from {args.prompts}")
    torch.set_num_threads(args.threads)
    model, tok = load_model(str(src))
    stop = stop_tokens(model, tok)
    ids = [tok(format_prompt(q, tok), add_special_tokens=False)["input_ids"] for q in questions]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))  # similar lengths batched: less padding
    answers: list[list[int]] = [[] for _ in ids]
    start = time.time()
    for first in range(0, len(order), args.batch_size):
        chunk = order[first : first + args.batch_size]
        decoded = ar_decode(model, [ids[i] for i in chunk], max_new_tokens=args.max_new_tokens, stop=stop)
        for i, seq in zip(chunk, decoded.sequences, strict=True):
            answers[i] = seq
        print(f"{first + len(chunk)}/{len(order)} answers, {time.time() - start:.0f} s", file=sys.stderr)
    for path, kept in [(out, answers), *((path, answers[:n]) for n, path in subsets.items())]:
        write_model_dir(src, kept, path)
        print(f"{path}: {len(kept)} answers, {sum(map(len, kept))} tokens")
    return 0


def write_model_dir(src: Path, answers: list[list[int]], out: Path) -> None:
    """`src`'s files linked (its config copied) and `answers` as the draft corpus, written under a temporary name."""
    with atomic_dir(out) as tmp:
        for f in src.iterdir():
            if f.name == "config.json":
                (tmp / f.name).write_text(f.read_text())  # a copy: a tune writes its decode config into it
            elif not f.name.startswith(".") and f.name != "draft_corpus.npy":
                (tmp / f.name).symlink_to(f)
        save_corpus(answers, tmp)
        write_json_atomic(tmp / "answers.json", answers)


if __name__ == "__main__":
    sys.exit(main())
