"""One schema for ``torch.ops.splitkv_ascend.decode_attention``, checked with plain torch on a CPU.

The schema is one Python string (``ascend_ops.ops.SCHEMA``); the C++ kernel's parameters
(``ascend_ops/csrc/binding.cpp``), the launch calls and the offline launch headers are read from the
sources and compared with it and with the kernels' entry signatures (``splitkv_tiling.h``).
"""

from __future__ import annotations

import re

import pytest

from .sources import BINDING, KERNELS, LAUNCH, ROOT, TILING_H

torch = pytest.importorskip("torch")

from ascend_ops import ops  # noqa: E402


def test_the_registered_schema_is_the_python_string():
    registered = torch.ops.splitkv_ascend.decode_attention.default._schema
    assert str(registered) == f"{ops.NAMESPACE}::{ops.SCHEMA}"
    mutated = [a.name for a in registered.arguments if a.alias_info is not None and a.alias_info.is_write]
    assert mutated == ["workspace", "out", "lse"]
    assert len(registered.returns) == 0


def test_docs_state_the_schema():
    text = " ".join((ROOT / "docs" / "npu.md").read_text().split())
    assert f"{ops.NAMESPACE}::{ops.SCHEMA}".replace(", ", ",") in text.replace(", ", ",")


def _cpp_params(fn: str) -> list[tuple[str, str, bool]]:
    """``[(schema type, name, mutable)]`` of a C++ function in binding.cpp, from its declaration."""
    text = BINDING.read_text()
    m = re.search(rf"\bvoid {fn}\((.*?)\)\s*\{{", text, re.S)
    assert m, f"{fn} not found in {BINDING.name}"
    types = {
        r"const at::Tensor &": "Tensor", r"at::Tensor &": "Tensor", r"const std::optional<at::Tensor> &": "Tensor?",
        r"int64_t ": "int", r"double ": "float", r"std::optional<double> ": "float?",
        r"std::optional<int64_t> ": "int?", r"bool ": "bool",
    }
    params = []
    for p in (x.strip() for x in m.group(1).split(",")):
        p = " ".join(p.split())
        for cpp, schema_type in types.items():
            if p.startswith(cpp):
                params.append((schema_type, p[len(cpp):], cpp == r"at::Tensor &"))
                break
        else:
            raise AssertionError(f"unmapped C++ parameter {p!r}")
    return params


def test_the_cpp_kernel_signature_is_the_schema():
    schema = torch._C.parse_schema(f"{ops.NAMESPACE}::{ops.SCHEMA}")
    want = [(str(a.type).replace("Optional[Tensor]", "Tensor?"), a.name,
             a.alias_info is not None and a.alias_info.is_write) for a in schema.arguments]
    assert _cpp_params("decode_attention_npu") == want


def test_binding_implements_without_restating_the_schema():
    text = BINDING.read_text()
    assert "m.def(" not in text and "TORCH_LIBRARY(" not in text and "TORCH_LIBRARY_FRAGMENT" not in text
    impl = re.search(r"TORCH_LIBRARY_IMPL\((\w+), (\w+), m\)\s*\{\s*m\.impl\(\"(\w+)\", TORCH_FN\(([\w:]+)\)\);",
                     text)
    assert impl and impl.groups() == (ops.NAMESPACE, "PrivateUse1", ops.OP_NAME,
                                      "splitkv_ascend::decode_attention_npu")
    assert "OpCommand::RunOpApiV2(" in text and "getCurrentNPUStream().stream(false)" in text


def _kernel_params(text: str, kernel: str) -> list[str]:
    m = re.search(rf'extern "C" __global__ __aicore__ void {kernel}\((.*?)\)', text, re.S)
    assert m, kernel
    return [p.split()[-1] for p in m.group(1).split(",")]


@pytest.mark.parametrize("kernel", KERNELS)
def test_launches_pass_the_kernel_parameters_in_order(kernel):
    declared = _kernel_params(TILING_H.read_text(), kernel)
    # every kernel source that defines the entry agrees with the header
    for src in (ROOT / "ascend_ops" / "kernel").glob("*.cpp"):
        if f"void {kernel}(" in src.read_text():
            assert _kernel_params(src.read_text(), kernel) == declared, src.name
    # binding.cpp: ACLRT_LAUNCH_KERNEL(kernel)(blocks, stream, gm.<param>...) in the declared order
    call = re.search(rf"ACLRT_LAUNCH_KERNEL\({kernel}\)\((.*?)\);", BINDING.read_text(), re.S)
    args = [a.strip() for a in call.group(1).split(",")]
    assert args[:2] == ["blocks", "stream"]
    assert [a.removeprefix("gm.") for a in args[2:]] == declared
    # the launch declaration (what ascendc_library() generates): blockDim, stream, one void * per GM_ADDR
    header = (LAUNCH / f"aclrtlaunch_{kernel}.h").read_text()
    m = re.search(rf"aclrtlaunch_{kernel}\((.*?)\);", header, re.S)
    params = [" ".join(p.split()) for p in m.group(1).split(",")]
    assert params[:2] == ["uint32_t blockDim", "aclrtStream stream"]
    assert [p.removeprefix("void *") for p in params[2:]] == declared
    # the bisheng route's definition: the same signature, and <<<>>> passes the parameters in order
    asc = (LAUNCH.parent / f"launch_{kernel.removeprefix('splitkv_')}.asc").read_text()
    m = re.search(rf"aclrtlaunch_{kernel}\((.*?)\)\s*\{{", asc, re.S)
    assert [" ".join(p.split()) for p in m.group(1).split(",")] == params
    m = re.search(rf"{kernel}<<<blockDim, nullptr, stream>>>\((.*?)\);", asc, re.S)
    passed = re.findall(r"reinterpret_cast<GM_ADDR>\((\w+)\)", m.group(1))
    assert passed == declared
