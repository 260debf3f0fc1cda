"""Spec-Bench, the field's benchmark for drafting methods across kinds of text (hemingkx/Spec-Bench: its question file,
`question_id`, `category`, `turns`), run at batch 1 with every method taking turns per category.

Its 13 categories come in two sizes: MT-bench's eight (writing, roleplay, reasoning, math, coding, extraction, stem,
humanities: 10 questions each, two turns) and five of 80 (translation, summarization, qa, math_reasoning, rag). The
eight are one group here, `mt_bench` (as the benchmark's own leaderboard reports them), so a subset takes the same
number of questions from each of six groups, in the file's order. A question's turns are the user's messages of one
chat, in the model's chat template: the second turn follows the model's own greedy answer to the first, which every
lossless method gives alike, so both turns are prompts of their own (the answer is our AR's, made once).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from jf_core.evaluation.method import AR, AR_CONTROL, Method
from jf_core.evaluation.speed import Decoder, MethodResult, bench
from jf_core.evaluation.tables import markdown
from jf_core.trajectory.prompts import PromptFormat, uses_chat_template

MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
GROUPS = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")


@dataclass(frozen=True)
class Question:
    question_id: int
    category: str
    turns: tuple[str, ...]

    @property
    def group(self) -> str:
        return "mt_bench" if self.category in MT_BENCH else self.category


def load_questions(path: str | Path, per_group: int, groups: Sequence[str] = GROUPS) -> dict[str, list[Question]]:
    """The first `per_group` questions of each of `groups`, in the file's order. A malformed row or an unknown group
    is refused naming the file, the line and the field."""
    unknown = sorted(set(groups) - set(GROUPS))
    if unknown:
        raise ValueError(f"spec_bench groups {unknown} unknown; the groups: {', '.join(GROUPS)}")
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"Spec-Bench question file {path} does not exist")
    chosen: dict[str, list[Question]] = {g: [] for g in groups}
    for line_no, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            question = Question(int(row["question_id"]), str(row["category"]), tuple(row["turns"]))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{path}:{line_no}: not a Spec-Bench question ({type(err).__name__}: {err})") from None
        if not question.turns or not all(isinstance(t, str) and t for t in question.turns):
            raise ValueError(f"{path}:{line_no}: turns must be non-empty strings")
        bucket = chosen.get(question.group)
        if bucket is not None and len(bucket) < per_group:
            bucket.append(question)
    return chosen


def turn_prompts(
    questions: Sequence[Question], tokenizer, answer: Callable[[list[int]], list[int]], fmt: PromptFormat
) -> list[list[int]]:
    """Every turn of each question as a prompt (tokenized): the first turn, then each later one after the model's
    own answer to the turns before (`answer`: the new tokens greedy decoding gives a prompt). In the chat template
    where the model has one (`fmt`), else as plain text, turns and answers one after another."""
    chat = uses_chat_template(tokenizer, fmt.chat_template)
    prompts = []
    for q in questions:
        messages: list[dict] = []
        text = ""
        for i, turn in enumerate(q.turns):
            messages.append({"role": "user", "content": turn})
            text = f"{text}\n\n{turn}" if text else turn
            ids = tokenizer(fmt.render(list(messages) if chat else text, tokenizer), add_special_tokens=False)[
                "input_ids"
            ]
            prompts.append(ids)
            if i + 1 < len(q.turns):
                reply = tokenizer.decode(answer(ids), skip_special_tokens=True)
                messages.append({"role": "assistant", "content": reply})
                text = f"{text}{reply}"
    return prompts


def run_groups(
    methods: dict[Method, Decoder],
    prompts: dict[str, list[list[int]]],
    *,
    repeats: int = 1,
    same_output_as: dict[Method, Method] | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, list[MethodResult]]:
    """Each group's prompts at batch 1, every method taking turns (`speed.bench`), identity checked against our AR
    (or `same_output_as`); a warm-up prompt before the first group only."""
    out = {}
    for i, (group, group_prompts) in enumerate(prompts.items()):
        say = (lambda line, g=group: progress(f"{g}: {line}")) if progress else None
        out[group] = bench(methods, group_prompts, batch_size=1, warmup_prompts=1 if i == 0 else 0, repeats=repeats,
                           reference=None, same_output_as=same_output_as, progress=say)  # fmt: skip
    return out


def table(results: dict[str, list[MethodResult]], versus: Method | None = None) -> str:
    """Per group: our AR's tokens/s, the control's ratio (our AR timed again: the spread), each other method's TPF
    and speedup against AR (and against `versus`, the untrained drafter to beat, where it ran), and the lowest share
    of outputs identical to greedy AR."""
    methods = [r.method for r in next(iter(results.values()), []) if r.method not in (AR, AR_CONTROL)]
    head = ["group", "prompts", "AR tok/s", "control: x AR"]
    head += [f"{m.label}: TPF, x AR" + (f", x {versus.label}" if versus and m != versus else "") for m in methods]
    head += ["identical to AR"]
    cells = []
    for group, rows in results.items():
        by = {r.method: r for r in rows}
        control = f"{by[AR_CONTROL].speedup_vs_ar:.2f}x" if AR_CONTROL in by else "-"
        line = [group, str(len(by[AR].first_divergence)), f"{by[AR].tps:.1f}", control]
        for m in methods:
            r = by[m]
            text = f"{r.tpf:.2f}, {r.speedup_vs_ar:.2f}x"
            if versus is not None and m != versus and versus in by:
                text += f", {r.tps / by[versus].tps:.2f}x"
            line.append(text)
        line.append(f"{min(r.identical_fraction for r in rows if r.method != AR):.2f}")
        cells.append(line)
    return markdown(head, cells)
