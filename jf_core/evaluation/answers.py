"""Answer checking for math benchmarks: GSM8K (the final number) and MATH (the last boxed answer, normalised).

GSM8K references end in `#### <number>`; a model's answer is, in order of preference, the number after `####`,
after "the answer is", or the last number in the text. Numbers compare exactly after removing thousands
separators, currency and units, and trailing zeros (`18.00` == `18`).

MATH references hold `\\boxed{...}`; so should the model's answer (the last `\\boxed` or `\\fbox`, braces matched).
Both sides are normalised the way the MATH paper's checker does (spaces, `\\left`/`\\right`, `\\!`, `dfrac`/`tfrac`,
`\\frac12` -> `\\frac{1}{2}`, `\\sqrt3` -> `\\sqrt{3}`, units in `\\text{}`, degrees, dollars, percent, a leading
`x =`, `0.5` -> `\\frac{1}{2}` for the simple case, trailing `.0`), then compared as strings.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def _clean_number(text: str) -> str | None:
    text = text.replace(",", "").replace("$", "").strip().rstrip(".")
    try:
        value = Decimal(text)
    except InvalidOperation:
        return None
    value = value.normalize()
    return format(value, "f") if value != 0 else "0"


def extract_gsm8k(text: str) -> str | None:
    """The final numeric answer of a GSM8K-style solution, canonicalised (None when there is none)."""
    for pattern in (r"####\s*([^\n]+)", r"[Tt]he (?:final )?answer is[:\s]*\$?\s*([^\n]+)"):
        found = re.findall(pattern, text)
        if found:
            numbers = _NUMBER.findall(found[-1])
            if numbers:
                return _clean_number(numbers[0])
    numbers = _NUMBER.findall(text)
    return _clean_number(numbers[-1]) if numbers else None


def gsm8k_correct(output: str, reference: str) -> bool:
    want = extract_gsm8k(reference)
    return want is not None and extract_gsm8k(output) == want


def last_boxed(text: str) -> str | None:
    """The content of the last \\boxed{...} or \\fbox{...} (braces matched), or of `\\boxed 5`."""
    starts = [m for m in re.finditer(r"\\(?:boxed|fbox)\s*", text)]
    if not starts:
        return None
    m = starts[-1]
    i = m.end()
    if i < len(text) and text[i] != "{":
        rest = re.match(r"[^\s$]+", text[i:])
        return rest.group(0) if rest else None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return None


def _fix_fracs(s: str) -> str:
    parts = s.split("\\frac")
    out = parts[0]
    for part in parts[1:]:
        out += "\\frac"
        if part.startswith("{") or len(part) < 2:
            out += part
            continue
        a, b, rest = part[0], part[1], part[2:]
        if b == "{":
            out += "{" + a + "}" + b + rest
        else:
            out += "{" + a + "}{" + b + "}" + rest
    return out


def _fix_sqrt(s: str) -> str:
    return re.sub(r"\\sqrt(\w)", r"\\sqrt{\1}", s)


def _fix_a_slash_b(s: str) -> str:
    m = re.fullmatch(r"(-?\d+)/(\d+)", s)
    return f"\\frac{{{m.group(1)}}}{{{m.group(2)}}}" if m else s


def normalize_math(answer: str) -> str:
    s = answer.replace("\n", "").replace("\\!", "")
    s = s.replace("\\\\", "\\")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac")
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "")
    s = s.replace("\\$", "").replace("$", "")
    s = re.sub(r"\\text\{\s*[a-zA-Z ]+\}$", "", s.strip())  # trailing units
    s = re.sub(r"\\(?:text|textbf|mathrm|mbox)\{([^}]*)\}", r"\1", s)
    s = s.replace("\\%", "").replace("%", "")
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    if s.startswith("."):
        s = "0" + s
    if re.match(r"^[a-zA-Z]\s*=", s) and len(s.split("=")) == 2:
        s = s.split("=")[1]
    s = _fix_sqrt(s)
    s = s.replace(" ", "")
    s = _fix_fracs(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    s = _fix_a_slash_b(s)
    s = re.sub(r"(\d+)\.0+$", r"\1", s)
    return s.rstrip(".")


def math_correct(output: str, reference: str) -> bool:
    want = last_boxed(reference)
    got = last_boxed(output)
    if want is None or got is None:
        return False
    return normalize_math(got) == normalize_math(want)
