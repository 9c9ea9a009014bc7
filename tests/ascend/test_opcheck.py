"""``torch.library.opcheck`` on the op's CPU kernel (its executable specification), and the fake kernel.

Both on CPU tensors, with the arguments the wrapper builds for catalog cases
(:func:`~.npu_child.case_tensors`). The same checks on ``npu`` tensors: ``test_npu_device.py``.
"""

from __future__ import annotations

import pytest

from .npu_child import case_tensors

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("case", ["multi-query/gqa-bf16", "int8/per-channel-offset", "empty/some-rows"])
def test_opcheck(case):
    *_, args = case_tensors(case)
    result = torch.library.opcheck(torch.ops.splitkv_ascend.decode_attention.default, tuple(args))
    assert set(result.values()) == {"SUCCESS"}, result


def test_fake_kernel_shapes_only():
    from torch._subclasses.fake_tensor import FakeTensorMode

    *_, args = case_tensors("basic/vector-v-float16")
    with FakeTensorMode() as mode:
        fargs = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        torch.ops.splitkv_ascend.decode_attention(*fargs)
        fargs[9] = torch.empty(3, 5)
        with pytest.raises(ValueError, match=r"lse: must be float32 \(3, 4\)"):
            torch.ops.splitkv_ascend.decode_attention(*fargs)
