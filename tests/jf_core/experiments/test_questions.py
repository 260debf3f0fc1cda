"""An experiment's question sets (jf_core/experiments/questions.py): answers scored against their own rows."""

from __future__ import annotations

from jf_core.experiments.questions import scoring
from jf_core.models import load_model


def test_answers_are_scored_against_their_own_rows(profile, tmp_path):
    """Accuracy beside TPF: each trained and held-out question's answer is scored against its own row of the
    prompt file (GSM8K: the final number), found by the prompt id the questions were loaded under."""
    import json

    from jf_core.trajectory.prompts import held_out_source, load_prompts

    rows = [{"question": f"What is {i} plus 2?", "answer": f"{i} + 2 = {i + 2}\n#### {i + 2}"} for i in range(40)]
    (tmp_path / "q.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    prompts = profile.prompts.model_copy(
        update={
            "source": str(tmp_path / "q.jsonl"),
            "text_field": "question",
            "hash_splits": {"train": 0.5, "test": 0.5},
        }
    )
    p = profile.model_copy(
        update={"prompts": prompts, "evaluation": profile.evaluation.model_copy(update={"benchmark": "gsm8k"})}
    )
    _, tok = load_model(profile.model.path)
    train = load_prompts(prompts.model_copy(update={"split": "train", "limit": 3}), tok).items
    # An experiment's held-out questions: the development half of the held-out split (a recipe is decided on them).
    held = load_prompts(held_out_source(prompts, None, "test", "development").model_copy(update={"limit": 3}), tok)
    held = held.items
    (train_refs, held_refs), correct = scoring(p, tok, train, held)
    assert (
        len(train_refs) == 3
        and len(held_refs) == 3
        and not {r["question"] for r in train_refs} & {r["question"] for r in held_refs}
    )
    for row in train_refs + held_refs:
        n = int(row["answer"].rsplit("#### ", 1)[1])
        assert correct(tok(f"The answer is {n}.")["input_ids"], row)
        assert not correct(tok(f"The answer is {n + 1}.")["input_ids"], row)
    assert scoring(p.model_copy(update={"evaluation": p.evaluation.model_copy(update={"benchmark": "humaneval"})}),
                    tok, train, held) == ((None, None), None)  # fmt: skip
    # Questions written by prompts.number_variants have no reference: the trained set goes unscored, not misscored.
    grown = p.model_copy(update={"prompts": prompts.model_copy(update={"number_variants": 2})})
    variants = load_prompts(grown.prompts.model_copy(update={"limit": 6}), tok).items
    (train_refs, held_refs), _ = scoring(grown, tok, variants, held)
    assert train_refs is None and len(held_refs) == 3
    # Held-out questions from a file without answers (chat prompts under a GSM8K profile): unscored, not a KeyError.
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps({"question": r["question"]}) + "\n" for r in rows))
    chat = p.model_copy(update={"evaluation": p.evaluation.model_copy(update={"source": str(tmp_path / "chat.jsonl")})})
    chat_held = load_prompts(
        held_out_source(chat.prompts, chat.evaluation.source, chat.evaluation.split, "development"), tok
    ).items
    (train_refs, held_refs), correct = scoring(chat, tok, train, chat_held[:3])
    assert len(train_refs) == 3 and held_refs is None and correct is not None


def test_an_experiments_held_out_questions_are_never_the_ones_figures_are_reported_on(profile, tmp_path):
    """Issue 69, item 0: a recipe is decided on the development half of the held-out questions; a round's evaluation
    and `jf bench decode` report on the confirmation half; the two never share a question, whichever file holds
    them (GSM8K's test file read whole here)."""
    import json

    from jf_core.evaluation.evaluate import eval_set
    from jf_core.experiments.questions import question_sets
    from jf_core.trajectory.prompts import PromptFormat

    rows = [{"question": f"How many is {i} and 3?", "answer": f"#### {i + 3}"} for i in range(30)]
    (tmp_path / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    evaluation = profile.evaluation.model_copy(
        update={"benchmark": "gsm8k", "source": str(tmp_path / "test.jsonl"), "template": "{question}"}
    )
    prompts = profile.prompts.model_copy(update={"limit": 4})
    p = profile.model_copy(update={"prompts": prompts, "evaluation": evaluation})
    _, tok = load_model(profile.model.path)
    _, held, _ = question_sets(p, tok, held_out=30, held_out_field="question")
    reported = eval_set(p.evaluation, tok, PromptFormat.of(p.prompts), part="confirmation", limit=30).prompts
    decided = set(map(tuple, held.prompts))
    assert decided and reported and not decided & set(map(tuple, reported))
    assert len(decided) + len(reported) == len(rows)  # the halves cover the file
