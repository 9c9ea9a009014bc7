"""The op, the wrapper and ``decode_attention`` on an ``npu`` device made of plain torch.

In a child interpreter (:mod:`.npu_child`; renaming PrivateUse1 cannot be undone): PrivateUse1
renamed to ``npu``, a stub device module and a Python backend whose tensors hold CPU data, with a
PrivateUse1 kernel registered from Python (delegating to the CPU kernel; a stand-in for the C++
one). ``opcheck`` and the fake kernel after the rename, the wrapper and ``decode_attention`` end
to end on ``npu`` tensors (``run()`` never copies device memory to the host), the ``ascend``
harness backend, and ``torch.compile(fullgraph=True)`` of the wrapper's ``run()``.
"""

from __future__ import annotations

import pytest

from .npu_child import child_results, start_child, verdict

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def python_npu_child():
    """Started early (see the autouse fixture) so it runs while the C++ binding compiles."""
    proc = start_child("python")
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.communicate()


@pytest.fixture(scope="module", autouse=True)
def _start_python_npu_early(request):
    wanted = any("python_npu" in item.fixturenames for item in request.session.items
                 if item.module is request.module)
    if wanted:
        request.getfixturevalue("python_npu_child")


@pytest.fixture(scope="module")
def python_npu(python_npu_child):
    return child_results(python_npu_child)


def test_opcheck_after_renaming_privateuse1(python_npu):
    verdict(python_npu, "opcheck_after_rename")


def test_fake_kernel_on_fake_npu_tensors(python_npu):
    verdict(python_npu, "fake_npu_tensors")


def test_wrapper_runs_on_npu_tensors_without_host_sync(python_npu):
    verdict(python_npu, "wrapper_on_npu")


def test_decode_attention_on_npu_tensors(python_npu):
    verdict(python_npu, "public_api_on_npu")


def test_harness_backends_on_npu_tensors(python_npu):
    verdict(python_npu, "harness_backends_on_npu")


def test_torch_compile_fullgraph(python_npu):
    verdict(python_npu, "compile_fullgraph")
