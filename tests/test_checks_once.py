"""Every entry point checks a call's arguments once: the shared checks
(:func:`~splitkv_common.validation.check_decode_args`) and a plan's (``Plan.validate``) run at most
once per call on each route, counted by patching both where they are looked up.

Routes (on this machine's CPU): ``AscendDecodeWrapper.run`` (its ``validate``; the operator's CPU
kernel checks the op's contract, not the arguments again), ``set_plan``, ``ascend_ops.decode_attention``
(refused on a CPU after its checks), the torch path (``torch_eager.decode_attention``, what the vLLM
plugin falls back to) and the Triton wrapper ``cuda_ref.DecodeWrapper.run`` (interpreter).
"""

from __future__ import annotations

import sys
from collections import Counter

import pytest

torch = pytest.importorskip("torch")

import ascend_ops  # noqa: E402
import splitkv_common.torch_eager as torch_eager  # noqa: E402
from ascend_ops.wrapper import AscendDecodeWrapper  # noqa: E402
from splitkv_common import plan_layout, validation  # noqa: E402
from splitkv_common.parity.cases import get_case  # noqa: E402
from splitkv_common.torch_io import to_torch  # noqa: E402

CASE = "basic/vector-v-float16"


@pytest.fixture
def counts(monkeypatch) -> Counter:
    """``counts["args"]``: calls of ``check_decode_args`` (patched in every module that holds it);
    ``counts["plan"]``: calls of ``Plan.validate`` (its rules, ``plan_checks.validate_plan``)."""
    n = Counter()
    real_args, real_plan = validation.check_decode_args, plan_layout.validate_plan

    def args(*a, **k):
        n["args"] += 1
        return real_args(*a, **k)

    def plan(*a, **k):
        n["plan"] += 1
        return real_plan(*a, **k)

    for mod in list(sys.modules.values()):
        if getattr(mod, "check_decode_args", None) is real_args:
            monkeypatch.setattr(mod, "check_decode_args", args)
    monkeypatch.setattr(plan_layout, "validate_plan", plan)
    return n


@pytest.fixture(scope="module")
def batch():
    inputs = get_case(CASE).build()
    return inputs, to_torch(inputs, "cpu")


def _tensors(t: dict) -> tuple:
    return t["q"], t["k_cache"], t["v_cache"], t["block_table"]


def _ascend(inputs, t) -> AscendDecodeWrapper:
    return AscendDecodeWrapper(inputs.q.shape[1], inputs.k_cache.shape[2], inputs.q.shape[2], inputs.k_cache.shape[1],
                               dtype=t["q"].dtype, kv_dtype=t["k_cache"].dtype, device="cpu")


@pytest.mark.parametrize("validate, args", [(False, 0), (True, 1), ("auto", 1)])
def test_ascend_wrapper_run_checks_once(counts, batch, validate, args):
    inputs, t = batch
    w = _ascend(inputs, t)
    w.plan(inputs.seq_lens)
    assert counts == Counter()   # a plan of the shared planner is not checked again
    w.run(*_tensors(t), t["seq_lens"], t["query_start_loc"], validate=validate)
    # the CPU kernel checks the plan words it rebuilt (the op's contract), the arguments never
    assert (counts["args"], counts["plan"]) == (args, 1)


def test_ascend_wrapper_set_plan_checks_the_plan_once(counts, batch):
    inputs, t = batch
    w = _ascend(inputs, t)
    w.set_plan(inputs.plan("size:16", device="910b2"), seq_lens=inputs.seq_lens)
    assert (counts["args"], counts["plan"]) == (0, 1)


def test_ascend_decode_attention_checks_once_before_refusing_a_cpu(counts, batch):
    inputs, t = batch
    with pytest.raises(RuntimeError, match="q is a CPU tensor"):
        ascend_ops.decode_attention(*_tensors(t), t["seq_lens"], t["query_start_loc"],
                                    plan=inputs.plan("size:16", device="910b2"))
    assert (counts["args"], counts["plan"]) == (1, 1)


@pytest.mark.parametrize("validate, args", [("auto", 1), (True, 1), (False, 0)])
def test_torch_path_checks_once(counts, batch, validate, args):
    inputs, t = batch
    torch_eager.decode_attention(*_tensors(t), t["seq_lens"], t["query_start_loc"], plan=inputs.plan("size:16"),
                                 validate=validate)
    assert (counts["args"], counts["plan"]) == (args, 1)


def test_triton_wrapper_run_checks_once(counts, batch):
    pytest.importorskip("triton")
    from cuda_ref.wrapper import DecodeWrapper

    inputs, t = batch
    w = DecodeWrapper(inputs.q.shape[1], inputs.k_cache.shape[2], inputs.q.shape[2], inputs.k_cache.shape[1],
                      dtype=t["q"].dtype, kv_dtype=t["k_cache"].dtype, device="cpu")
    w.plan(inputs.seq_lens)
    w.run(*_tensors(t), t["seq_lens"], t["query_start_loc"], validate=True)
    assert (counts["args"], counts["plan"]) == (1, 0)
