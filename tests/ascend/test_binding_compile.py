"""The C++ binding (``ascend_ops/csrc/binding.cpp``) compiled offline and run without an NPU.

``binding.cpp`` is compiled by g++ against the real torch headers, with stand-ins for the four
NPU-only headers (``csrc/offline/``), and loaded after the Python definition: the dispatcher
accepts its signature (and refuses one with a parameter too many), and in a child interpreter
(:mod:`.npu_child`) its body runs on ``npu`` tensors of a plain-torch test backend up to the
(counted) launches. With ``SPLITKV_TORCH_NPU_WHEEL`` set it is also compiled against that
torch_npu release's own headers.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from .npu_child import run_child, verdict
from .sources import BINDING, HAS_CXX

torch = pytest.importorskip("torch")

from ascend_ops import build  # noqa: E402


@pytest.fixture(scope="module")
def offline_lib(tmp_path_factory):
    if not HAS_CXX:
        pytest.skip("no host C++ compiler")
    return build.offline_library(tmp_path_factory.mktemp("offline"), log=lambda *a: None)


@pytest.fixture(scope="module")
def cpp_npu(offline_lib):
    return run_child("cpp", str(offline_lib))


def test_cpp_binding_loads_against_the_schema(cpp_npu):
    verdict(cpp_npu, "load")


def test_cpp_binding_body_launches_both_kernels(cpp_npu):
    verdict(cpp_npu, "body_runs")


def test_cpp_binding_launches_the_fused_mixed_kernel_where_the_tiling_says(cpp_npu):
    verdict(cpp_npu, "body_runs_mix")


def test_cpp_binding_rejects_bad_arguments_before_launching(cpp_npu):
    verdict(cpp_npu, "body_rejects")


@pytest.mark.slow
def test_a_wrong_cpp_signature_is_refused(tmp_path):
    """The check has teeth: one parameter too many and loading aborts with the dispatcher's message."""
    if not HAS_CXX:
        pytest.skip("no host C++ compiler")
    bad = tmp_path / "csrc"
    shutil.copytree(BINDING.parent, bad)
    src = bad / "binding.cpp"
    src.write_text(src.read_text().replace("int64_t kernel)", "int64_t kernel, double extra)"))
    orig = build.CSRC
    try:
        build.CSRC = bad
        with pytest.raises(build.BuildError, match="doesn't match the expected function schema"):
            build.offline_check(tmp_path, log=lambda *a: None)
    finally:
        build.CSRC = orig


@pytest.mark.skipif(not os.environ.get("SPLITKV_TORCH_NPU_WHEEL"),
                    reason="set SPLITKV_TORCH_NPU_WHEEL to a torch-npu wheel matching this torch (docs/npu.md)")
def test_binding_compiles_against_torch_npu_headers():
    """binding.cpp against a torch_npu release's own NPUStream.h / OpCommand.h (read from the wheel file)."""
    msg = build.torch_npu_headers_check(Path(os.environ["SPLITKV_TORCH_NPU_WHEEL"]), log=lambda *a: None)
    assert msg.startswith("ok")
