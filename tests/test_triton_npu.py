"""triton-npu backend (`cuda_ref.npu`) here (no NPU, upstream Triton): unavailable with a reason; tile table sane."""

import pathlib

import pytest

from cuda_ref import npu
from splitkv_common.parity.cases import random_inputs


def test_unavailable_with_reason_here():
    why = npu.triton_npu_backend.unavailable()
    assert why and ("triton-ascend" in why or "torch_npu" in why)


def test_triton_ascend_detection_names_upstream_triton():
    pytest.importorskip("triton")
    # the system python holds upstream Triton: it must be told apart from triton-ascend
    assert "no Ascend backend" in npu.triton_ascend_unavailable()


@pytest.mark.parametrize("d, dtype, want", [(64, "float16", (64, 64)), (128, "bfloat16", (32, 64)),
                                            (96, "float16", (32, 64)), (256, "float16", (32, 32)),
                                            (128, "float32", (32, 32)), (256, "float32", (16, 32))])
def test_npu_tiles(d, dtype, want):
    assert npu.npu_tile(d, dtype) == want


def test_int8_kv_takes_the_float32_tiles():
    assert npu.npu_tile(128, "bfloat16", "int8") == npu.npu_tile(128, "float32")
    assert npu.npu_tile(256, "float16", "int8") == (16, 32)


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
    assert npu.triton_npu_unsupported(random_inputs(0, [5], kv_quant="head", dtype="float16")) is None
    assert npu.triton_npu_unsupported(random_inputs(0, [5], kv_quant="channel", dtype="float16")) is None
    assert "512" not in (npu.triton_npu_unsupported(random_inputs(0, [5], head_dim=128)) or "")
    assert npu.triton_npu_unsupported(random_inputs(0, [5], head_dim=128)) is None


def test_an_ascend_triton_is_compiled_for_not_interpreted(tmp_path):
    """With triton-ascend (a ``triton`` with ``backends/ascend``) and no CUDA GPU, importing cuda_ref
    must leave the interpreter off: the kernels are compiled for the NPU."""
    import os
    import subprocess
    import sys

    fake = tmp_path / "triton"
    (fake / "backends" / "ascend").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    root = str(pathlib.Path(__file__).resolve().parent.parent)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", "import os, cuda_ref; print(os.environ.get('TRITON_INTERPRET'), "
                        "cuda_ref.INTERPRET)"], capture_output=True, text=True, cwd=root,
                       env={**env, "PYTHONPATH": f"{tmp_path}:{root}"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["None", "False"]
