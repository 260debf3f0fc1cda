"""training.guessed_weight: the text proposers' guesses over the round's answers (jf_core/training/guessed.py) and
the consistency loss weighed by them (spans.py, losses.py)."""

from __future__ import annotations

import functools

import pytest
import torch

from jf_core.training.config import JFTrainConfig
from jf_core.training.guessed import TextGuesses, answer, fold
from jf_core.training.losses import JFLossConfig
from jf_core.training.mask import SPAN
from jf_core.training.packing import PackedExample, collate
from jf_core.training.spans import spans_row
from tests.conftest import PAD
from tests.jf_core.training.test_mask_packing_losses import adapter_model
from tests.jf_core.training.test_spans import _examples, _step

N = 4


def _example(prompt_id: str, prompt: list[int], text: list[int]) -> PackedExample:
    """`text` as the fixed point, in blocks of N (the last padded past its length), each block its own state."""
    blocks = [text[i : i + N] for i in range(0, len(text), N)]
    lengths = [len(b) for b in blocks]
    clean = [b + [0] * (N - len(b)) for b in blocks]
    return PackedExample(prompt_id, prompt, N, [list(c) for c in clean], clean, lengths, [[c] for c in clean])


def _ids(wanted_fold: int, count: int) -> list[str]:
    return [f"q{i}" for i in range(100) if fold(f"q{i}") == wanted_fold][:count]


def test_lookup_guesses_what_the_answer_copies_from_its_prompt():
    """The answer copies 40 41 42 43 44 from its prompt: from the root 41 (index 1), after 40 41 the lookup's
    guess (the prompt's continuation) matches the next three tokens, then the answer departs (9, not 44)."""
    prompt = [3, 40, 41, 42, 43, 44, 4]
    ex = _example(_ids(0, 1)[0], prompt, [40, 41, 42, 43, 9, 10, 11, 12])
    guesses = TextGuesses([ex], corpus=False)
    assert guesses.depth(ex, 1) == 2  # context ...40 41 -> 42 43 44 4; the answer goes 42 43 9
    assert guesses.depth(ex, 5) == 0  # ...9 10: never seen before


def test_an_answer_is_guessed_from_the_other_folds_answers_never_its_own():
    """Three answers: a pair of twins in opposite folds guess each other; a third, in the first twin's fold, shares
    its text with that twin only, so the corpus (its other fold holds the second twin) guesses it too; an answer
    alone in its text is guessed by nobody, its own copy in the corpus left out. A corpus guess is no longer than
    the tail it matched (suffix_factor 1): from the root at index 3 the tail is four tokens long."""
    a, c = _ids(0, 2)
    (b,) = _ids(1, 1)
    twin = [50, 51, 52, 53, 54, 55, 56, 57]
    lonely = [60, 61, 62, 63, 64, 65, 66, 67]
    examples = [_example(a, [1, 2], twin), _example(b, [1, 2], twin), _example(c, [1, 2], lonely)]
    guesses = TextGuesses(examples)
    assert guesses.depth(examples[0], 3) == 4 and guesses.depth(examples[1], 3) == 4
    assert guesses.depth(examples[0], 1) == 2
    assert guesses.depth(examples[2], 3) == 0  # its fold's other side holds only the twin
    assert TextGuesses(examples, corpus=False).depth(examples[0], 3) == 0  # no corpus: the lookup alone
    assert answer(examples[0]) == twin


def _first_students(batch: dict) -> torch.Tensor:
    """[B, K] bool: the students at depth 1, each its span's first position."""
    kind, block, copy = batch["layout_kind"], batch["layout_block"], batch["layout_copy"]
    s = batch["cons_student"]
    prev = (s - 1).clamp(min=0)
    same = (kind.gather(1, prev) == SPAN) & (block.gather(1, prev) == block.gather(1, s))
    same &= copy.gather(1, prev) == copy.gather(1, s)
    return batch["cons_valid"] & ~same


def _masked(batch: dict, keep: torch.Tensor) -> dict:
    return {**batch, "cons_valid": batch["cons_valid"] & keep}


@pytest.mark.parametrize("consistency", ["kl", "tv", "fixed_point"])
def test_the_loss_weighs_each_guessed_student(consistency):
    """Students within the guessed depth (here 1: each span's first) weigh w: the consistency term is
    (w S_1 + S_rest) / (w n_1 + n_rest), the sums and counts read from the unweighted batch with the other students
    masked out; at w = 0 those students are left out, and so are the spans that had no other student, with the
    same loss and gradients as the unweighted batch without them."""
    model, _ = adapter_model("llama")
    examples = _examples(4, copies=2)
    cfg = JFLossConfig(consistency=consistency, chunk=4)
    plain = collate(examples, PAD, "clean_context", span=3, row=spans_row)
    first = _first_students(plain)
    assert 0 < int(first.sum()) < int(plain["cons_valid"].sum())
    _, alone, _ = _step(model, _masked(plain, first), cfg)
    _, rest, rest_grads = _step(model, _masked(plain, ~first), cfg)
    s1, n1 = alone["consistency_loss_sum"], alone["consistency_positions"]
    s2, n2 = rest["consistency_loss_sum"], rest["consistency_positions"]

    def weighed(w: float, depth: int = 1) -> dict:
        row = functools.partial(spans_row, guessed=lambda ex, root: depth, guessed_weight=w)
        return collate(examples, PAD, "clean_context", span=3, row=row)

    _, got, _ = _step(model, weighed(0.25), cfg)
    assert got["consistency_positions"] == pytest.approx(0.25 * n1 + n2)
    assert got["consistency_loss"] == pytest.approx((0.25 * s1 + s2) / (0.25 * n1 + n2), rel=1e-5)
    # Every student guessed, each at 0.01: their summed weight is below 1, and the term is still their mean.
    _, everyone, _ = _step(model, plain, cfg)
    _, got, _ = _step(model, weighed(0.01, depth=3), cfg)
    assert got["consistency_positions"] < 1
    assert got["consistency_loss"] == pytest.approx(everyone["consistency_loss"], rel=1e-5)
    dropped = weighed(0.0)
    assert int(dropped["packed_tokens"]) < int(plain["packed_tokens"])
    _, got, grads = _step(model, dropped, cfg)
    assert got["consistency_loss"] == pytest.approx(rest["consistency_loss"], rel=1e-5)
    assert grads.keys() == rest_grads.keys() and any(g.abs().sum() > 0 for g in grads.values())
    for k in grads:
        torch.testing.assert_close(grads[k], rest_grads[k], rtol=1e-4, atol=1e-6)


def test_without_guesses_the_row_and_batch_are_unweighted():
    ex = _examples(5)[0]
    assert spans_row(ex, 3).cons_weight is None
    assert "cons_weight" not in collate([ex], PAD, "clean_context", span=3, row=spans_row)


def test_the_config_asks_for_the_spans_layout_in_one_process():
    JFTrainConfig(guessed_weight=0.1, packing="spans", mask="clean_context")
    with pytest.raises(ValueError, match=r"training\.packing spans"):
        JFTrainConfig(guessed_weight=0.1)
    with pytest.raises(ValueError, match=r"training\.strategy single"):
        JFTrainConfig(guessed_weight=0.1, packing="spans", mask="clean_context", strategy="ddp")
