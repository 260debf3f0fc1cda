"""GSM8K and MATH answer extraction and normalisation."""

from __future__ import annotations

import pytest

from jf_core.evaluation.answers import extract_gsm8k, gsm8k_correct, last_boxed, math_correct, normalize_math


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("She makes 9 * 2 = $<<9*2=18>>18 every day.\n#### 18", "18"),
        ("#### 1,250", "1250"),
        ("so the answer is $18.00.", "18"),
        ("The answer is: -3", "-3"),
        ("first 5 then 7 and finally 12 eggs", "12"),
        ("#### 0.50", "0.5"),
        ("no numbers here", None),
    ],
)
def test_gsm8k_extraction(text, want):
    assert extract_gsm8k(text) == want


def test_gsm8k_compares_numbers_not_strings():
    assert gsm8k_correct("The answer is 18.0", "blah\n#### 18")
    assert not gsm8k_correct("The answer is 17", "#### 18")
    assert not gsm8k_correct("anything 18", "reference without a number")


def test_last_boxed_matches_braces():
    assert last_boxed(r"so \boxed{\frac{1}{2}} and then \boxed{x^{2}+1}") == "x^{2}+1"
    assert last_boxed(r"\fbox{3}") == "3"
    assert last_boxed(r"\boxed 5 is it") == "5"
    assert last_boxed("nothing") is None and last_boxed(r"\boxed{unclosed") is None


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (r"\dfrac{1}{2}", r"\frac12"),
        ("0.5", r"\frac{1}{2}"),
        ("1/2", r"\frac{1}{2}"),
        (r"\sqrt3", r"\sqrt{3}"),
        (r"10\text{ cm}", "10"),
        (r"90^\circ", "90"),
        (r"\$5", "5"),
        (r"x = 3", "3"),
        (r"\left( 1, 2 \right)", "(1,2)"),
        ("5.0", "5"),
        (r"50\%", "50"),
    ],
)
def test_math_normalisation_equates(a, b):
    assert normalize_math(a) == normalize_math(b)


def test_math_correct_uses_boxed_answers():
    assert math_correct(r"... hence \boxed{\dfrac{3}{4}}.", r"We get $\boxed{\frac34}$.")
    assert not math_correct(r"\boxed{\frac{3}{5}}", r"\boxed{\frac34}")
    assert not math_correct("3/4 without a box", r"\boxed{\frac34}")
