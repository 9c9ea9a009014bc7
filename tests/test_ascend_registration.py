"""Registration plumbing of ``torch.ops.splitkv_ascend.decode_attention``, checked with plain torch on a CPU.

The real NPU kernel of the op is C++ (``ascend_ops/csrc/binding.cpp``), built only on a machine with
CANN and torch_npu. Here:

* the schema: one Python string (``ascend_ops.ops.SCHEMA``); the C++ kernel's parameters, the
  launch calls and the offline launch headers are read from the sources and compared with it and
  with the kernels' entry signatures (``splitkv_tiling.h``);
* ``binding.cpp`` compiled by g++ against the real torch headers, with stand-ins for the four
  NPU-only headers (``csrc/offline/``), loaded after the Python definition: the dispatcher
  accepts its signature, and its body runs on ``npu`` tensors up to the (counted) launches;
* ``torch.library.opcheck`` on the CPU kernel (the op's executable specification), the fake
  kernel under fake ``npu`` tensors, ``torch.compile(fullgraph=True)`` of the wrapper's ``run()``;
* an ``npu`` device made of plain torch: PrivateUse1 renamed to ``npu``, a stub device module
  (``torch._register_device_module``) and a Python backend whose tensors hold CPU data. A
  PrivateUse1 kernel registered from Python for the test (delegating to the CPU kernel; a
  stand-in for the C++ one) lets the wrapper and ``decode_attention`` run end to end on ``npu``
  tensors, and shows that ``run()`` never copies device memory to the host.

Renaming PrivateUse1 cannot be undone, so those checks run in a child interpreter (this file run
as a script); the tests read its JSON verdicts. Nothing here touches an NPU.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BINDING = ROOT / "ascend_ops" / "csrc" / "binding.cpp"
OFFLINE = ROOT / "ascend_ops" / "csrc" / "offline"
LAUNCH = ROOT / "ascend_ops" / "csrc" / "launch"
TILING_H = ROOT / "ascend_ops" / "kernel" / "splitkv_tiling.h"
KERNELS = ("splitkv_split", "splitkv_combine")


# ----------------------------------------------------------------------------------------------
# The child interpreter: an `npu` device out of plain torch
# ----------------------------------------------------------------------------------------------

def _setup_python_npu():
    """PrivateUse1 renamed to ``npu``, a stub device module, and a backend whose tensors wrap CPU
    tensors (every aten op runs on the wrapped data). Returns ``(Dev, host_syncs)``."""
    import torch
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

    class StubNPUModule:  # what torch asks of a device module (opcheck saves / restores RNG state)
        def is_initialized(self): return True
        def is_available(self): return True
        def current_device(self): return 0
        def device_count(self): return 1
        def _is_in_bad_fork(self): return False
        def manual_seed_all(self, seed): pass
        def get_rng_state(self, device=None): return torch.zeros(1, dtype=torch.uint8)
        def set_rng_state(self, state, device=None): pass

    _setup_privateuseone_for_python_backend("npu", backend_module=StubNPUModule())
    host_syncs: list[str] = []

    class Dev(torch.Tensor):
        @staticmethod
        def __new__(cls, raw):
            t = torch._C._acc.create_empty_tensor(raw.shape, raw.dtype)
            t.__class__ = Dev
            return t

        def __init__(self, raw):
            self.raw = raw

    def unwrap(x):
        if isinstance(x, Dev):
            return x.raw
        if isinstance(x, (list, tuple)):
            return type(x)(unwrap(y) for y in x)
        return x

    def wrap(x):
        if isinstance(x, torch.Tensor) and not isinstance(x, Dev):
            return Dev(x)
        if isinstance(x, (list, tuple)):
            return type(x)(wrap(y) for y in x)
        return x

    def fallback(op, *args, **kwargs):
        name = op.name()
        to_host = kwargs.get("device") is not None and torch.device(kwargs["device"]).type == "cpu"
        if name == "aten::_local_scalar_dense" or (to_host and any(isinstance(a, Dev) for a in args)):
            host_syncs.append(name)
        if name == "aten::_copy_from":
            src, dst = args[0], args[1]
            if not isinstance(dst, Dev):
                host_syncs.append("device-to-host copy")
                return dst.copy_(unwrap(src))
            dst.raw.copy_(unwrap(src))
            return dst
        kw = {k: (torch.device("cpu") if k == "device" else unwrap(v)) for k, v in kwargs.items()}
        res = op(*unwrap(args), **kw)
        ret = op._schema.returns
        if ret and ret[0].alias_info is not None and ret[0].alias_info.is_write:  # in-place / out=
            for a, v in zip(op._schema.arguments, args, strict=False):
                if a.alias_info is not None and a.alias_info.is_write:
                    return v
        return res if to_host else wrap(res)

    lib = torch.library.Library("_", "IMPL")
    lib.fallback(fallback, "PrivateUse1")
    aten = torch.library.Library("aten", "IMPL")
    for name in ("detach", "alias"):  # views that must keep the wrapped data
        aten.impl(name, lambda x: Dev(unwrap(x)), "PrivateUse1")
    _setup_python_npu.keep = (lib, aten, Dev)
    return Dev, host_syncs, unwrap


def _case_tensors(name: str, device: str = "cpu"):
    import torch

    from ascend_ops.ops import AscendDecodeWrapper
    from splitkv_common.torch_io import to_torch
    from splitkv_common.parity.cases import get_case

    case = get_case(name)
    inputs = case.build()
    plan = inputs.plan(case.policy, device="910b2", **case.plan_kwargs)
    t = to_torch(inputs, "cpu")
    w = AscendDecodeWrapper(inputs.q.shape[1], inputs.k_cache.shape[2], inputs.q.shape[2], inputs.k_cache.shape[1],
                            dtype=t["q"].dtype, kv_dtype=t["k_cache"].dtype, device="cpu")
    w.set_plan(plan, scale=inputs.scale, soft_cap=inputs.soft_cap, window_left=inputs.window_left,
               max_pages=t["block_table"].shape[1], num_pages=t["k_cache"].shape[0])
    from ascend_ops.ops import pack_kv_quant

    quant = pack_kv_quant(t["k_scale"], t["v_scale"], t["k_offset"], t["v_offset"], num_kv_heads=w.num_kv_heads,
                          head_dim=w.head_dim, device="cpu")
    b = w._buffers
    args = [t["q"], t["k_cache"], t["v_cache"], t["block_table"], quant, b["plan"], b["tiling"],
            b["workspace"].clone(), torch.empty_like(b["out"]), torch.empty_like(b["lse"]), int(w.tiling["blockDim"])]
    return inputs, plan, t, w, [a.to(device) if isinstance(a, torch.Tensor) and device != "cpu" else a for a in args]


def _check(results: dict, name: str, fn) -> None:
    try:
        out = fn()
        results[name] = {"ok": True, "detail": out}
    except Exception as e:  # noqa: BLE001 - reported to the parent test
        import traceback

        results[name] = {"ok": False, "detail": f"{type(e).__name__}: {e}\n{traceback.format_exc()[-3000:]}"}


def scenario_python_kernel() -> dict:
    """The op and the wrapper on `npu` tensors with a Python PrivateUse1 stand-in kernel."""
    Dev, host_syncs, unwrap = _setup_python_npu()
    import torch

    import ascend_ops
    from ascend_ops import ops

    results: dict = {}
    op = torch.ops.splitkv_ascend.decode_attention.default

    def opcheck_after_rename():
        for case in ("multi-query/gqa-bf16", "int8/per-channel-offset"):
            *_, args = _case_tensors(case)
            r = torch.library.opcheck(op, tuple(args))
            assert all(v == "SUCCESS" for v in r.values()), r
        return "opcheck passes on CPU tensors with PrivateUse1 renamed to npu"

    def fake_npu_tensors():
        from torch._subclasses.fake_tensor import FakeTensorMode

        *_, args = _case_tensors("multi-query/gqa-bf16")
        with FakeTensorMode() as mode:
            fargs = [mode.from_tensor(a).to("npu") if isinstance(a, torch.Tensor) else a for a in args]
            assert fargs[0].device.type == "npu"
            op(*fargs)
            bad = list(fargs)
            bad[8] = torch.empty(bad[8].shape, dtype=torch.float32, device="npu")
            try:
                op(*bad)
            except ValueError as e:
                assert "out: must be" in str(e)
            else:
                raise AssertionError("the fake kernel accepted out with the wrong dtype")
        return "fake kernel runs on fake npu tensors and checks metadata"

    calls = []

    def standin(q, k, v, bt, kvq, plan, tiling, ws, out, lse, block_dim):
        calls.append(int(block_dim))
        ops._cpu_kernel(*(unwrap(x) for x in (q, k, v, bt, kvq, plan, tiling, ws, out, lse)), block_dim)

    lib = torch.library.Library(ops.NAMESPACE, "IMPL")
    lib.impl(ops.OP_NAME, standin, "PrivateUse1")

    def wrapper_on_npu():
        from splitkv_common.parity.accuracy import check
        from splitkv_common.reference import dense_attention, plain_attention

        for case in ("multi-query/gqa-bf16", "int8/per-channel-offset", "empty/some-rows", "mask/sliding-window"):
            inputs, plan, t, w_cpu, _ = _case_tensors(case)
            tn = {k: (v.to("npu") if v is not None else None) for k, v in t.items()}
            assert isinstance(tn["q"], Dev) and tn["q"].device.type == "npu"
            w = ops.AscendDecodeWrapper(w_cpu.num_q_heads, w_cpu.num_kv_heads, w_cpu.head_dim, w_cpu.page_size,
                                        dtype=w_cpu.dtype, kv_dtype=w_cpu.kv_dtype)
            assert w.device.type == "npu"
            w.set_plan(plan, scale=inputs.scale, soft_cap=inputs.soft_cap, window_left=inputs.window_left,
                       max_pages=t["block_table"].shape[1], num_pages=t["k_cache"].shape[0])
            before, n_calls = len(host_syncs), len(calls)
            out, lse = w.run(tn["q"], tn["k_cache"], tn["v_cache"], tn["block_table"], tn["seq_lens"],
                             tn["query_start_loc"], k_scale=tn["k_scale"], v_scale=tn["v_scale"],
                             k_offset=tn["k_offset"], v_offset=tn["v_offset"])
            assert host_syncs[before:] == [], f"run() read device memory on the host: {host_syncs[before:]}"
            assert calls[n_calls:] == [w.tiling["blockDim"]], calls[n_calls:]
            assert isinstance(out, Dev) and out.device.type == "npu"
            o, lse_ = out.raw.float().numpy(), lse.raw.numpy()
            ref_o, ref_l = dense_attention(inputs)
            acc = check(o, lse_, ref_o, ref_l, plain_attention(inputs), inputs.dtype)
            assert acc.passed, (case, acc.reason)
        return "wrapper plan()/run() on npu tensors: PrivateUse1 kernel called, no host sync in run(), results pass"

    def public_api_on_npu():
        import numpy as np

        inputs, plan, t, _, _ = _case_tensors("multi-query/ragged")
        tn = {k: (v.to("npu") if v is not None else None) for k, v in t.items()}
        before = len(host_syncs)
        out, lse = ascend_ops.decode_attention(tn["q"], tn["k_cache"], tn["v_cache"], tn["block_table"],
                                               tn["seq_lens"], tn["query_start_loc"], scale=inputs.scale,
                                               window_left=inputs.window_left)
        from splitkv_common.reference import dense_attention

        ref_o, ref_l = dense_attention(inputs)
        np.testing.assert_allclose(out.raw.numpy(), ref_o, atol=1e-4)
        # the detector sees host reads: the one-call API validates lengths and block table on the host
        assert len(host_syncs) > before, "host-sync detector saw nothing"
        try:
            ascend_ops.decode_attention(tn["q"], tn["k_cache"], tn["v_cache"], tn["block_table"],
                                        tn["seq_lens"], None)
        except ValueError as e:
            assert "query_start_loc: required" in str(e)
        else:
            raise AssertionError("missing query_start_loc was accepted")
        return "ascend_ops.decode_attention validates, plans and runs on npu tensors"

    def harness_backends_on_npu():
        # (the torch-npu backend is stock torch ops on the device: this test backend is too thin for it)
        from ascend_ops.npu_backend import ascend_backend
        from splitkv_common.parity.cases import get_case
        from splitkv_common.parity.harness import PASS, run_case

        names = ("basic/vector-v-bfloat16", "int8/per-channel-offset", "mask/causal-tail-masked-split",
                 "empty/all-rows", "gqa/12-4", "multi-query/ragged")
        for name in names:
            r = run_case(ascend_backend, get_case(name))
            assert r.status == PASS, (name, r.status, r.message)
        return f"the ascend harness backend passes {len(names)} cases on npu tensors"

    def compile_fullgraph():
        inputs, plan, t, w, _ = _case_tensors("multi-query/gqa-bf16")
        graphs = []

        def backend(gm, example_inputs):
            from torch._inductor.compile_fx import compile_fx

            graphs.append(str(gm.graph))
            return compile_fx(gm, example_inputs)

        def step(q, k, v, bt):
            out, lse = w.run(q, k, v, bt)
            return out.float() * 2, lse

        eager = step(t["q"], t["k_cache"], t["v_cache"], t["block_table"])
        eager = (eager[0].clone(), eager[1].clone())
        compiled = torch.compile(step, backend=backend, fullgraph=True)
        got = compiled(t["q"], t["k_cache"], t["v_cache"], t["block_table"])
        assert len(graphs) == 1 and "splitkv_ascend.decode_attention" in graphs[0], graphs
        assert torch.equal(got[0], eager[0]) and torch.equal(got[1], eager[1])
        return "torch.compile(fullgraph=True, inductor) traces wrapper.run into one graph holding the op"

    _check(results, "opcheck_after_rename", opcheck_after_rename)
    _check(results, "fake_npu_tensors", fake_npu_tensors)
    _check(results, "wrapper_on_npu", wrapper_on_npu)
    _check(results, "public_api_on_npu", public_api_on_npu)
    _check(results, "harness_backends_on_npu", harness_backends_on_npu)
    _check(results, "compile_fullgraph", compile_fullgraph)
    return results


def scenario_cpp_kernel(lib_path: str) -> dict:
    """The C++ binding (offline build) as the PrivateUse1 kernel, on `npu` tensors."""
    Dev, host_syncs, unwrap = _setup_python_npu()
    import ctypes

    import torch

    from ascend_ops import ops

    results: dict = {}
    op = torch.ops.splitkv_ascend.decode_attention.default

    def load():
        assert not ops.has_npu_kernel()
        torch.ops.load_library(lib_path)  # the dispatcher checks the C++ signature against ops.SCHEMA
        assert ops.has_npu_kernel()
        return "loaded after the Python schema; PrivateUse1 kernel registered"

    counter = []

    def launches_so_far() -> int:  # the stand-in launch functions count themselves
        if not counter:
            counter.append(ctypes.c_int.in_dll(ctypes.CDLL(lib_path), "splitkv_offline_launches"))
        return counter[0].value

    def body_runs():
        for case in ("multi-query/gqa-bf16", "int8/per-head"):
            *_, args = _case_tensors(case, "npu")
            before = launches_so_far()
            op(*args)
            assert launches_so_far() - before == 2, "expected the split and the combine launch"
        return "binding.cpp's checks pass on valid npu tensors and both kernels are launched"

    def body_rejects():
        *_, args = _case_tensors("multi-query/gqa-bf16", "npu")
        bad_cases = {
            8: (torch.empty(args[8].shape, dtype=torch.float32).to("npu"), "out: must be"),
            6: (torch.zeros(7, dtype=torch.uint8).to("npu"), "tiling: must be"),
            10: (0, "block_dim: must be"),
            0: (unwrap(args[0]), "q: must be an NPU tensor"),
        }
        seen = []
        for i, (value, msg) in bad_cases.items():
            bad = list(args)
            bad[i] = value
            before = launches_so_far()
            try:
                op(*bad)
            except RuntimeError as e:
                assert msg in str(e), (msg, str(e)[:300])
                seen.append(msg)
            else:
                raise AssertionError(f"accepted a bad argument ({msg})")
            assert launches_so_far() == before, "launched despite a failed check"
        *_, args8 = _case_tensors("int8/per-head", "npu")
        args8[4] = None
        try:
            op(*args8)
        except RuntimeError as e:
            assert "kv_quant: required" in str(e)
        else:
            raise AssertionError("int8 KV without kv_quant was accepted")
        return f"rejected before any launch: {seen + ['kv_quant: required']}"

    _check(results, "load", load)
    if results["load"]["ok"]:
        _check(results, "body_runs", body_runs)
        _check(results, "body_rejects", body_rejects)
    return results


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    which = sys.argv[1]
    res = scenario_python_kernel() if which == "python" else scenario_cpp_kernel(sys.argv[2])
    print("RESULTS " + json.dumps(res))
    sys.exit(0)


# ----------------------------------------------------------------------------------------------
# Tests (pytest)
# ----------------------------------------------------------------------------------------------

torch = pytest.importorskip("torch")

from ascend_ops import build, ops  # noqa: E402

HAS_CXX = bool(os.environ.get("CXX") or shutil.which("g++") or shutil.which("clang++"))


def _start_child(*argv: str) -> subprocess.Popen:
    # torch_npu, where installed, must not be auto-imported: the child makes its own `npu` device
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    return subprocess.Popen([sys.executable, __file__, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)


def _child_results(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=600)
    line = [x for x in out.splitlines() if x.startswith("RESULTS ")]
    assert line, f"child interpreter failed (exit {proc.returncode}):\n{out[-2000:]}\n{err[-4000:]}"
    return json.loads(line[-1][len("RESULTS "):])


def _run_child(*argv: str) -> dict:
    return _child_results(_start_child(*argv))


@pytest.fixture(scope="module")
def python_npu_child():
    """Started early (see the autouse fixture) so it runs while the C++ binding compiles."""
    proc = _start_child("python")
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
    return _child_results(python_npu_child)


@pytest.fixture(scope="module")
def offline_lib(tmp_path_factory):
    if not HAS_CXX:
        pytest.skip("no host C++ compiler")
    return build.offline_library(tmp_path_factory.mktemp("offline"), log=lambda *a: None)


@pytest.fixture(scope="module")
def cpp_npu(offline_lib):
    return _run_child("cpp", str(offline_lib))


def _verdict(results: dict, name: str) -> str:
    r = results[name]
    assert r["ok"], r["detail"]
    return r["detail"]


# --- one schema ---------------------------------------------------------------------------------

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


# --- opcheck and fake on the CPU -----------------------------------------------------------------

@pytest.mark.parametrize("case", ["multi-query/gqa-bf16", "int8/per-channel-offset", "empty/some-rows"])
def test_opcheck(case):
    *_, args = _case_tensors(case)
    result = torch.library.opcheck(torch.ops.splitkv_ascend.decode_attention.default, tuple(args))
    assert set(result.values()) == {"SUCCESS"}, result


def test_fake_kernel_shapes_only():
    from torch._subclasses.fake_tensor import FakeTensorMode

    *_, args = _case_tensors("basic/vector-v-float16")
    with FakeTensorMode() as mode:
        fargs = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        torch.ops.splitkv_ascend.decode_attention(*fargs)
        fargs[9] = torch.empty(3, 5)
        with pytest.raises(ValueError, match=r"lse: must be float32 \(3, 4\)"):
            torch.ops.splitkv_ascend.decode_attention(*fargs)


# --- the C++ binding, compiled offline -----------------------------------------------------------

def test_cpp_binding_loads_against_the_schema(cpp_npu):
    _verdict(cpp_npu, "load")


def test_cpp_binding_body_launches_both_kernels(cpp_npu):
    _verdict(cpp_npu, "body_runs")


def test_cpp_binding_rejects_bad_arguments_before_launching(cpp_npu):
    _verdict(cpp_npu, "body_rejects")


@pytest.mark.slow
def test_a_wrong_cpp_signature_is_refused(tmp_path):
    """The check has teeth: one parameter too many and loading aborts with the dispatcher's message."""
    if not HAS_CXX:
        pytest.skip("no host C++ compiler")
    bad = tmp_path / "csrc"
    shutil.copytree(BINDING.parent, bad)
    src = bad / "binding.cpp"
    src.write_text(src.read_text().replace("int64_t block_dim)", "int64_t block_dim, double extra)"))
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


# --- an npu device of plain torch ----------------------------------------------------------------

def test_opcheck_after_renaming_privateuse1(python_npu):
    _verdict(python_npu, "opcheck_after_rename")


def test_fake_kernel_on_fake_npu_tensors(python_npu):
    _verdict(python_npu, "fake_npu_tensors")


def test_wrapper_runs_on_npu_tensors_without_host_sync(python_npu):
    _verdict(python_npu, "wrapper_on_npu")


def test_decode_attention_on_npu_tensors(python_npu):
    _verdict(python_npu, "public_api_on_npu")


def test_harness_backends_on_npu_tensors(python_npu):
    _verdict(python_npu, "harness_backends_on_npu")


def test_torch_compile_fullgraph(python_npu):
    _verdict(python_npu, "compile_fullgraph")


# --- the node build's plumbing, with a stand-in CANN and torch_npu -----------------------------------

FAKE_ASCENDC_CMAKE = r"""
# Stand-in for CANN's ascendc.cmake: ascendc_library() makes an ordinary static library (the
# kernels are not compiled: no bisheng here) whose include directory holds the launch headers the
# real one generates (here: the offline stand-ins).
function(ascendc_library name kind)
    set(srcs ${ARGN})
    foreach(src ${srcs})
        if(NOT EXISTS "${src}")
            message(FATAL_ERROR "ascendc_library: no such kernel source ${src}")
        endif()
    endforeach()
    file(WRITE "${CMAKE_CURRENT_BINARY_DIR}/${name}_empty.cpp" "int ${name}_kernels_not_compiled_here;\n")
    add_library(${name} ${kind} "${CMAKE_CURRENT_BINARY_DIR}/${name}_empty.cpp")
    target_include_directories(${name} PUBLIC "@LAUNCH_DIR@")
    set(SPLITKV_FAKE_KERNEL_SOURCES "${srcs}" PARENT_SCOPE)
endfunction()
"""


@pytest.fixture
def fake_node(tmp_path, monkeypatch):
    """Stand-ins for a node's CANN (``ascendc.cmake``, ``acl/acl_base.h``, an empty ``libascendcl``,
    a ``bisheng`` that checks its flags and builds the launch functions from stubs) and torch_npu
    (the offline headers; a ``libtorch_npu`` from the stubs). Returns ``(cann, torch_npu)``."""
    if not (HAS_CXX and shutil.which("cmake")):
        pytest.skip("needs a C++ compiler and cmake")
    import torch.utils.cpp_extension as ext

    cann = tmp_path / "cann"
    cm = cann / "tools" / "tikcpp" / "ascendc_kernel_cmake"
    cm.mkdir(parents=True)
    (cm / "ascendc.cmake").write_text(FAKE_ASCENDC_CMAKE.replace("@LAUNCH_DIR@", str(LAUNCH)))
    shutil.copytree(OFFLINE / "acl", cann / "include" / "acl")
    (cann / "lib64").mkdir()
    npu = tmp_path / "torch_npu"
    shutil.copytree(OFFLINE / "torch_npu", npu / "include" / "torch_npu")
    (npu / "lib").mkdir()
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("clang++")
    torch_lib = Path(ext.include_paths()[0]).parent / "lib"
    subprocess.run([cxx, "-shared", "-fPIC", "-x", "c++", "/dev/null", "-o", str(cann / "lib64" / "libascendcl.so")],
                   check=True)
    subprocess.run([cxx, "-std=c++17", "-shared", "-fPIC", f"-D_GLIBCXX_USE_CXX11_ABI={build.torch_abi()}",
                    *[f"-isystem{p}" for p in ext.include_paths()], f"-I{OFFLINE}", f"-I{LAUNCH}",
                    str(OFFLINE / "stub_runtime.cpp"), f"-L{torch_lib}", "-lc10",
                    "-o", str(npu / "lib" / "libtorch_npu.so")], check=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub_c = tmp_path / "launch_stub.c"
    stub_c.write_text("#include <stdint.h>\n"
                      "uint32_t aclrtlaunch_splitkv_split(uint32_t b, void *s, void *a0, void *a1, void *a2, "
                      "void *a3, void *a4, void *a5, void *a6, void *a7) { return 0; }\n"
                      "uint32_t aclrtlaunch_splitkv_combine(uint32_t b, void *s, void *a0, void *a1, void *a2, "
                      "void *a3, void *a4) { return 0; }\n")
    (bin_dir / "bisheng").write_text(f"""#!/usr/bin/env bash
# stand-in: check the flags the real bisheng gets, then build the launch functions from stubs
set -euo pipefail
echo "$@" > {tmp_path / 'bisheng.args'}
[[ " $* " == *" -x asc "* && " $* " == *" --npu-arch=dav-2201 "* ]] || {{ echo "bad flags: $*" >&2; exit 1; }}
out=""; prev=""
for a in "$@"; do [[ "$prev" == "-o" ]] && out="$a"; prev="$a"; done
exec {cxx} -shared -fPIC -x c {stub_c} -o "$out"
""")
    (bin_dir / "bisheng").chmod(0o755)
    real_package_dir = build.package_dir
    monkeypatch.setattr(build, "package_dir",
                        lambda name, hint: npu if name == "torch_npu" else real_package_dir(name, hint))
    monkeypatch.setattr(build, "LIB_DIR", tmp_path / "_lib")
    monkeypatch.setenv("ASCEND_HOME_PATH", str(cann))
    monkeypatch.setenv("SPLITKV_ASCEND_SOC", "Ascend910B3")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return cann, npu


def _resolved(lib: Path, dep: str) -> bool:
    ldd = subprocess.run(["ldd", str(lib)], capture_output=True, text=True).stdout
    line = [x for x in ldd.splitlines() if dep in x]
    return bool(line) and "not found" not in line[0]


@pytest.mark.slow
def test_node_build_plumbing_with_stand_ins(fake_node, tmp_path):
    """scripts/build_ascend.sh's Python + CMake path end to end, with CANN and torch_npu replaced by
    stand-ins. Checks the CMakeLists (paths, kernel glob, include dirs, libraries, rpath), the copy
    into the package and that the result loads against the schema. Says nothing about a real toolkit."""
    cann, npu = fake_node
    logs = []
    lib = build.node_build(build_dir=tmp_path / "build", jobs=2, log=logs.append)
    assert lib == tmp_path / "_lib" / build.LIB_FILE and lib.is_file()
    assert any("-DSOC_VERSION=Ascend910B3" in x for x in logs)
    cache = (tmp_path / "build" / "CMakeCache.txt").read_text()
    assert f"TORCH_NPU_PATH:PATH={npu}" in cache
    assert build.load_check(lib).startswith("ok")
    assert _resolved(lib, "libtorch_npu.so")


@pytest.mark.slow
def test_node_build_bisheng_route_with_stand_ins(fake_node, tmp_path):
    """The ``--route bisheng`` path: bisheng gets ``-x asc --npu-arch=dav-2201`` and both launch
    sources; the binding links the kernels' library, found next to it through ``$ORIGIN``."""
    lib = build.node_build(build_dir=tmp_path / "build", log=lambda *a: None, route="bisheng")
    args = (tmp_path / "bisheng.args").read_text().split()
    assert {"-x", "asc", "--npu-arch=dav-2201", "-shared"} <= set(args)
    assert [Path(a).name for a in args if a.endswith(".asc")] == ["launch_split.asc", "launch_combine.asc"]
    assert (lib.parent / build.KERNELS_LIB_FILE).is_file()
    assert _resolved(lib, build.KERNELS_LIB_FILE) and _resolved(lib, "libtorch_npu.so")
    assert build.load_check(lib).startswith("ok")
