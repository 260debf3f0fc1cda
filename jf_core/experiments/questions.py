"""An experiment's question sets for a profile: the questions it trains on (the prompt file's train split) and
held-out ones (the evaluation's source), and where the profile's benchmark scores the prompt file's own rows, the
reference rows and the scorer of their answers (accuracy beside TPF)."""

from __future__ import annotations

import sys

from jf_core.config import Profile
from jf_core.experiments.measure import Questions
from jf_core.trajectory.prompts import held_out_source, load_prompts


def question_sets(
    profile: Profile, tokenizer, held_out: int, held_out_field: str | None = None, measure_trained: int | None = None
) -> tuple[Questions, Questions, object]:
    """(trained, held-out, score): the profile's prompts (its train split, as the experiment's profile sets it),
    the first `measure_trained` of them measured (None: all); `held_out` questions of the evaluation's source never
    trained on, of their development half (an experiment decides a recipe; the confirmation half reports), with
    `held_out_field` their text field where another kind of question than the trained ones; `score`: the scorer
    (None where the benchmark does not score these rows)."""
    train = load_prompts(profile.prompts, tokenizer).items
    e = profile.evaluation
    field = {"text_field": held_out_field} if held_out_field else {}
    held_source = held_out_source(profile.prompts, e.source, e.split, "development")
    held_prompts = held_source.model_copy(update={"limit": held_out, **field})
    held = load_prompts(held_prompts, tokenizer).items
    (train_refs, held_refs), score = scoring(profile, tokenizer, train, held)
    sample = slice(0, measure_trained)
    trained = Questions([p.token_ids for p in train[sample]], None if train_refs is None else train_refs[sample])
    return trained, Questions([p.token_ids for p in held], held_refs), score


def scoring(profile: Profile, tokenizer, train: list, held: list):
    """References and a scorer for the questions' answers, where the profile's benchmark scores the prompt file's
    own rows (GSM8K: the final number of `answer`): ((trained rows, held-out rows), scorer), accuracy beside TPF;
    ((None, None), None) otherwise."""
    from jf_core.evaluation.benchmarks import BenchmarkItem, score
    from jf_core.trajectory.prompts import rows_by_prompt_id

    benchmark = profile.evaluation.benchmark
    if benchmark not in ("gsm8k", "math", "embedded"):
        return (None, None), None
    train_rows = rows_by_prompt_id(profile.prompts.model_copy(update={"split": "train", "limit": None}))
    e = profile.evaluation
    # Every held-out row by its id, whichever half (and text field) `held` was read by: ids are the file's rows.
    held_source = held_out_source(profile.prompts, e.source, e.split, "development")
    held_rows = rows_by_prompt_id(held_source.model_copy(update={"limit": None, "held_out_slice": None}))
    trained = [train_rows[p.prompt_id] for p in train]
    # A question written by `prompts.number_variants` has no reference answer: the trained set is then not scored.
    references = (None if any("variant_of" in r for r in trained) else trained, [held_rows[p.prompt_id] for p in held])
    if benchmark == "embedded":  # the task's rows are prompts: their answers are worked out
        from jf_core.toy.task import example_of

        references = tuple(
            None if rows is None else [{"answer": example_of(r["prompt"]).answer} for r in rows] for rows in references
        )
    else:
        # A file without answers (chat or code prompts measured for TPF under a GSM8K profile) goes unscored, said
        # here, before hours of decoding, not as a KeyError in the scorer after them.
        sources = (profile.prompts.source, held_source.source)
        references = tuple(
            None if rows is None else _with_references(rows, benchmark, source)
            for rows, source in zip(references, sources, strict=True)
        )

    def correct(tokens: list[int], row: dict) -> bool:
        text = tokenizer.decode(tokens, skip_special_tokens=True)
        return score(benchmark, BenchmarkItem(uid="", prompt="", record=row), text)

    return references, correct


def _with_references(rows: list[dict], benchmark: str, source: str) -> list[dict] | None:
    """`rows`, or None (unscored, said on stderr) when one lacks the field the benchmark scores against."""
    fields = ("answer", "solution") if benchmark == "math" else ("answer",)
    lacking = sum(not any(f in r for f in fields) for r in rows)
    if not lacking:
        return rows
    print(
        f"{source}: {lacking} of {len(rows)} questions lack a reference `{' or '.join(fields)}` for {benchmark}: "
        "those questions' accuracy is not scored",
        file=sys.stderr,
    )
    return None
