"""triton-npu backend here (no NPU, upstream Triton): unavailable with a reason; tile table sane."""

import pytest

from ascend_ops import triton_npu
from splitkv_common.parity.cases import random_inputs


def test_unavailable_with_reason_here():
    why = triton_npu.triton_npu_backend.unavailable()
    assert why and ("triton-ascend" in why or "torch_npu" in why)


def test_triton_ascend_detection_names_upstream_triton():
    pytest.importorskip("triton")
    # the system python holds upstream Triton: it must be told apart from triton-ascend
    assert "no Ascend backend" in triton_npu.triton_ascend_unavailable()


@pytest.mark.parametrize("d, dtype, want", [(64, "float16", (64, 64)), (128, "bfloat16", (32, 64)),
                                            (96, "float16", (32, 64)), (256, "float16", (32, 32)),
                                            (128, "float32", (32, 32)), (256, "float32", (16, 32))])
def test_npu_tiles(d, dtype, want):
    assert triton_npu.npu_tile(d, dtype) == want


def test_int8_kv_takes_the_float32_tiles():
    assert triton_npu.npu_tile(128, "bfloat16", "int8") == triton_npu.npu_tile(128, "float32")
    assert triton_npu.npu_tile(256, "float16", "int8") == (16, 32)


def test_packed_rows_capped():
    pytest.importorskip("torch")
    import cuda_ref  # noqa: F401  (interpreter without a GPU, before triton is imported)
    pytest.importorskip("triton")
    from cuda_ref.launch import packed_rows
    assert packed_rows(1, 8) == (16, 1)
    assert packed_rows(16, 8) == (64, 2)
    assert packed_rows(1, 8, 32) == (16, 1)
    assert packed_rows(4, 8, 32) == (32, 1)
    assert packed_rows(16, 8, 32) == (32, 4)


def test_unsupported_reasons():
    # int8 KV lowers since the kernel loads its scales without a runtime stride (docs/triton-ascend.md)
    assert triton_npu.triton_npu_unsupported(random_inputs(0, [5], kv_quant="head", dtype="float16")) is None
    assert triton_npu.triton_npu_unsupported(random_inputs(0, [5], kv_quant="channel", dtype="float16")) is None
    assert "512" not in (triton_npu.triton_npu_unsupported(random_inputs(0, [5], head_dim=128)) or "")
    assert triton_npu.triton_npu_unsupported(random_inputs(0, [5], head_dim=128)) is None
