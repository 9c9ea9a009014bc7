"""The profile the Ascend kernels plan and launch for on an NPU: the chip's own, with the device's core counts.

No NPU here: ``torch.npu`` is replaced by a stand-in that answers as torch_npu does (device name,
properties with ``cube_core_num`` / ``vector_core_num``, a stream limit).
"""

from __future__ import annotations

import types

import pytest

torch = pytest.importorskip("torch")
from ascend_ops import support  # noqa: E402


def fake_npu(name="Ascend910B3", aic=20, aiv=40, limit=None):
    props = types.SimpleNamespace(name=name, cube_core_num=aic, vector_core_num=aiv)
    ns = types.SimpleNamespace(get_device_name=lambda i: name, get_device_properties=lambda i: props,
                               current_device=lambda: 0, current_stream=lambda i=None: object())
    if limit is not None:
        ns.get_stream_limit = lambda stream: dict(limit)
    return ns


@pytest.fixture
def npu(monkeypatch):
    def install(**kw):
        support._npu_profile.cache_clear()
        monkeypatch.setattr(torch, "npu", fake_npu(**kw), raising=False)
        monkeypatch.delenv(support.PROFILE_ENV, raising=False)
    yield install
    support._npu_profile.cache_clear()


@pytest.mark.parametrize("chip, aic, aiv", [("Ascend910B2", 24, 48), ("Ascend910B3", 20, 40), ("Ascend910B4", 20, 40),
                                            ("Ascend910_9391", 24, 48), ("Ascend910_9362", 20, 40)])
def test_the_chips_own_profile_and_core_counts(npu, chip, aic, aiv):
    npu(name=chip, aic=aic, aiv=aiv)
    p = support.npu_profile(0)
    assert p.name == chip.lower().replace("ascend", "") and (p.cube_units, p.units) == (aic, aiv)


def test_a_named_profile_never_launches_more_cores_than_the_device_has(npu):
    """The 910B2's profile on a 910B3: 24 AI cores in a fused launch would hang in SyncAll."""
    npu(name="Ascend910B3", aic=20, aiv=40)
    p = support.npu_profile(0, "910b2")
    assert (p.name, p.cube_units, p.units) == ("910b2", 20, 40)


def test_a_stream_limit_lowers_the_cores(npu):
    npu(name="Ascend910B2", aic=24, aiv=48, limit={"cube_core_num": 12, "vector_core_num": 24})
    p = support.npu_profile(0)
    assert (p.cube_units, p.units) == (12, 24)


def test_an_unknown_chip_is_refused_by_name(npu):
    npu(name="Ascend910_9999")
    with pytest.raises(ValueError, match="Ascend910_9999, which has no device profile"):
        support.npu_profile(0)


def test_no_core_counts_is_an_error(npu):
    npu(name="Ascend910B2", aic=0, aiv=0)
    with pytest.raises(RuntimeError, match="cube / 0 vector cores"):
        support.npu_profile(0)


def test_the_tiling_of_a_device_profile_uses_its_cores(npu):
    from ascend_ops import tiling as tl
    from splitkv_common.parity.cases import random_inputs

    npu(name="Ascend910B2", aic=24, aiv=48, limit={"cube_core_num": 8, "vector_core_num": 16})
    prof = support.npu_profile(0)
    inp = random_inputs(3, [4000, 900], num_q_heads=16, num_kv_heads=4, head_dim=128, page_size=64, dtype="bfloat16")
    plan = inp.plan("size:128", device=prof)
    til = tl.build_tiling(inp, plan, prof)
    assert til.mixed and til.block_dim == 8


def test_off_the_npu_the_named_or_default_profile(monkeypatch):
    monkeypatch.delenv(support.PROFILE_ENV, raising=False)
    assert support.launch_profile(torch.device("cpu")) == support.DEFAULT_PROFILE
    assert support.launch_profile(torch.device("cpu"), "910b3") == "910b3"
