"""``python -m splitkv_bench read-floor``: its streaming read covers every element once whatever the grid
(run in the interpreter on the CPU; timed only on a GPU), and its variants parse or are refused."""

from __future__ import annotations

import importlib

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")


@pytest.fixture(scope="module")
def floor():
    return importlib.import_module("splitkv_bench.read_floor")


@pytest.mark.parametrize("sms,per_sm,block,unroll", [(1, 1, 64, 2), (3, 2, 64, 2), (5, 1, 32, 4), (4, 8, 32, 1)])
def test_read_sums_every_element_once(floor, sms, per_sm, block, unroll):
    n = 64 * 2 * 3 * 4
    k = torch.arange(n, dtype=torch.float32).remainder(7).to(torch.bfloat16)
    v = torch.arange(n, dtype=torch.float32).remainder(5).to(torch.bfloat16) * 3
    fn, progs = floor.read_launch(k, v, sms, per_sm, block, unroll, 1, 1)
    assert 1 <= progs <= sms * per_sm and (n // (block * unroll)) % progs == 0
    assert float(fn().sum()) == float(k.float().sum() + v.float().sum())


def test_read_refuses_a_length_of_partial_steps(floor):
    k = torch.zeros(100, dtype=torch.bfloat16)
    assert floor.read_launch(k, k, 2, 1, 64, 2, 1, 1) == (None, 0)


def test_variants_parse(floor):
    (p1, c1), (p2, c2) = floor.parse_variants("size:384/n64w4s5, auto/n128w8s6c")
    assert (p1, str(c1), p2, str(c2)) == ("size:384", "n64w4s5", "auto", "n128w8s6c")
    assert c2.column_sum and not c1.column_sum
    with pytest.raises(ValueError, match="--variants: 'size:384'"):
        floor.parse_variants("size:384")
