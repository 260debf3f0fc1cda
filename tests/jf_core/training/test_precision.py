"""training.compute_dtype resolved: the model's dtype, a named one, or `auto`'s measured choice."""

import math

import pytest
import torch

from jf_core.training.precision import CHOICES, faster, linear_seconds, resolve_compute_dtype

CPU = torch.device("cpu")


@pytest.mark.parametrize(
    ("setting", "model_dtype", "expected"),
    [("model", torch.float32, torch.float32), ("model", torch.bfloat16, torch.bfloat16),
     ("float32", torch.bfloat16, torch.float32), ("bfloat16", torch.float32, torch.bfloat16)],
)  # fmt: skip
def test_a_named_setting_or_the_models_dtype_is_taken_as_it_is(setting, model_dtype, expected):
    assert resolve_compute_dtype(setting, model_dtype, CPU, width=64) == expected


def test_the_faster_dtype_wins_and_fp32_keeps_a_tie():
    assert faster({torch.float32: 2.0, torch.bfloat16: 1.0}) == torch.bfloat16
    assert faster({torch.float32: 1.0, torch.bfloat16: 2.0}) == torch.float32
    assert faster({torch.bfloat16: 1.0, torch.float32: 1.0}) == torch.float32


def test_auto_on_a_cpu_times_both_dtypes_and_takes_the_faster():
    seconds = linear_seconds(64, CPU, rows=32, repeats=2)
    assert set(seconds) == set(CHOICES)
    assert all(0 < s < math.inf for s in seconds.values())
    assert resolve_compute_dtype("auto", torch.float32, CPU, width=64) in CHOICES
