"""The child interpreter of the registration tests: an ``npu`` device made of plain torch.

An ``npu`` device without torch_npu: PrivateUse1 renamed to ``npu``, a stub device module
(``torch._register_device_module``) and a Python backend whose tensors hold CPU data. In it:

* :func:`scenario_python_kernel`: a PrivateUse1 kernel registered from Python for the test
  (delegating to the op's CPU kernel; a stand-in for the C++ one) lets the wrapper and
  ``decode_attention`` run end to end on ``npu`` tensors, and shows that ``run()`` never copies
  device memory to the host; ``opcheck`` and the fake kernel after the rename;
  ``torch.compile(fullgraph=True)`` of the wrapper's ``run()``;
* :func:`scenario_cpp_kernel`: ``binding.cpp`` built offline (``csrc/offline/``) as the
  PrivateUse1 kernel, its body run on ``npu`` tensors up to the (counted) launches.

Renaming PrivateUse1 cannot be undone, so these run in a child interpreter (this file run as a
script, :func:`start_child`); the tests read its JSON verdicts (:func:`child_results`,
:func:`verdict`). :func:`case_tensors` (a catalog case as the op's arguments, planned by the
wrapper on the CPU) serves both sides. Nothing here touches an NPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


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
        # what the operator asks of the device: the chip (its profile) and its cores (a 910B2's)
        def get_device_name(self, device=None): return "Ascend910B2"
        def get_device_properties(self, device=None):
            import types
            return types.SimpleNamespace(name="Ascend910B2", cube_core_num=24, vector_core_num=48)

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

        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            # a dtype view (the wrapper's tiling bytes in its int32 meta buffer) keeps the wrapped data
            if func is torch.Tensor.view and len(args) == 2 and isinstance(args[1], torch.dtype) and not kwargs:
                return Dev(args[0].raw.view(args[1]))
            return super().__torch_function__(func, types, args, kwargs)

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


def case_tensors(name: str, device: str = "cpu"):
    import torch

    from ascend_ops.wrapper import AscendDecodeWrapper
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
            b["workspace"].clone(), torch.empty_like(b["out"]), torch.empty_like(b["lse"]), int(w.tiling["blockDim"]),
            int(w.tiling["kernelKind"])]
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
    from ascend_ops.wrapper import AscendDecodeWrapper

    results: dict = {}
    op = torch.ops.splitkv_ascend.decode_attention.default

    def opcheck_after_rename():
        for case in ("multi-query/gqa-bf16", "int8/per-channel-offset"):
            *_, args = case_tensors(case)
            r = torch.library.opcheck(op, tuple(args))
            assert all(v == "SUCCESS" for v in r.values()), r
        return "opcheck passes on CPU tensors with PrivateUse1 renamed to npu"

    def fake_npu_tensors():
        from torch._subclasses.fake_tensor import FakeTensorMode

        *_, args = case_tensors("multi-query/gqa-bf16")
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

    def standin(q, k, v, bt, kvq, plan, tiling, ws, out, lse, block_dim, kernel=0):
        calls.append(int(block_dim))
        ops._cpu_kernel(*(unwrap(x) for x in (q, k, v, bt, kvq, plan, tiling, ws, out, lse)), block_dim, kernel)

    lib = torch.library.Library(ops.NAMESPACE, "IMPL")
    lib.impl(ops.OP_NAME, standin, "PrivateUse1")

    def wrapper_on_npu():
        from splitkv_common.parity.accuracy import check
        from splitkv_common.reference import dense_attention, plain_attention

        for case in ("multi-query/gqa-bf16", "int8/per-channel-offset", "empty/some-rows", "mask/sliding-window"):
            inputs, plan, t, w_cpu, _ = case_tensors(case)
            tn = {k: (v.to("npu") if v is not None else None) for k, v in t.items()}
            assert isinstance(tn["q"], Dev) and tn["q"].device.type == "npu"
            w = AscendDecodeWrapper(w_cpu.num_q_heads, w_cpu.num_kv_heads, w_cpu.head_dim, w_cpu.page_size,
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

        inputs, plan, t, _, _ = case_tensors("multi-query/ragged")
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
        inputs, plan, t, w, _ = case_tensors("multi-query/gqa-bf16")
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

    from ascend_ops import runtime

    results: dict = {}
    op = torch.ops.splitkv_ascend.decode_attention.default

    def load():
        assert not runtime.has_npu_kernel()
        torch.ops.load_library(lib_path)  # the dispatcher checks the C++ signature against ops.SCHEMA
        assert runtime.has_npu_kernel()
        return "loaded after the Python schema; PrivateUse1 kernel registered"

    counter = []

    def launches_so_far() -> int:  # the stand-in launch functions count themselves
        if not counter:
            counter.append(ctypes.c_int.in_dll(ctypes.CDLL(lib_path), "splitkv_offline_launches"))
        return counter[0].value

    mix_counter = []

    def mix_launches_so_far() -> int:
        if not mix_counter:
            mix_counter.append(ctypes.c_int.in_dll(ctypes.CDLL(lib_path), "splitkv_offline_mix_launches"))
        return mix_counter[0].value

    def body_runs():
        for case in ("basic/vector-v-float32", "int8/per-head-offset-fp32"):
            *_, args = case_tensors(case, "npu")
            assert args[-1] == 0, "the vector kernel serves fp32 q (with KV of the same dtype or int8)"
            before, mix_before = launches_so_far(), mix_launches_so_far()
            op(*args)
            assert launches_so_far() - before == 2, "expected the split and the combine launch"
            assert mix_launches_so_far() == mix_before
        return "binding.cpp's checks pass on valid npu tensors and both vector-path kernels are launched"

    def body_runs_mix():
        for case in ("int8/per-head",):  # fp16 q, int8 KV: the mixed kernel too, kv_quant passed
            *_, w, args = case_tensors(case, "npu")
            assert args[-1] == 1 and args[4] is not None, (case, w.kernel_reason)
            before, mix_before = launches_so_far(), mix_launches_so_far()
            op(*args)
            assert launches_so_far() - before == 1 and mix_launches_so_far() - mix_before == 1, case
        *_, w, args = case_tensors("multi-query/gqa-bf16", "npu")
        assert args[-1] == 1 and "mixed" in w.kernel_reason, w.kernel_reason
        before, mix_before = launches_so_far(), mix_launches_so_far()
        op(*args)
        assert launches_so_far() - before == 1 and mix_launches_so_far() - mix_before == 1, \
            "expected one launch: the fused mixed kernel"
        bad = list(args)
        bad[-1] = 2
        try:
            op(*bad)
        except RuntimeError as e:
            assert "kernel: must be" in str(e)
        else:
            raise AssertionError("kernel=2 was accepted")
        return ("a bf16 tiling and an fp16 / int8 KV one of kernelKind 1 each make binding.cpp enqueue one launch "
                "of splitkv_attention_mix")

    def body_rejects():
        *_, args = case_tensors("multi-query/gqa-bf16", "npu")
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
        *_, args8 = case_tensors("int8/per-head", "npu")
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
        _check(results, "body_runs_mix", body_runs_mix)
        _check(results, "body_rejects", body_rejects)
    return results


def start_child(*argv: str) -> subprocess.Popen:
    # torch_npu, where installed, must not be auto-imported: the child makes its own `npu` device
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    return subprocess.Popen([sys.executable, __file__, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)


def child_results(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=600)
    line = [x for x in out.splitlines() if x.startswith("RESULTS ")]
    assert line, f"child interpreter failed (exit {proc.returncode}):\n{out[-2000:]}\n{err[-4000:]}"
    return json.loads(line[-1][len("RESULTS "):])


def run_child(*argv: str) -> dict:
    return child_results(start_child(*argv))



def verdict(results: dict, name: str) -> str:
    r = results[name]
    assert r["ok"], r["detail"]
    return r["detail"]



if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    which = sys.argv[1]
    res = scenario_python_kernel() if which == "python" else scenario_cpp_kernel(sys.argv[2])
    print("RESULTS " + json.dumps(res))
    sys.exit(0)
