"""The CPU twin rejects each documented Ascend C rule the type-check cannot see.

One deliberately bad tiny kernel per rule (plus a well-behaved control), compiled against the
emulation exactly as the real kernels are, and run with the twin's launcher.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

sim = pytest.importorskip("ascend_ops.sim_backend")
pytestmark = pytest.mark.skipif(sim.compiler_missing() is not None, reason=str(sim.compiler_missing()))

KERNELS = r'''
#include "kernel_operator.h"
using namespace AscendC;

#define ENTRY(name) extern "C" __global__ __aicore__ void name(GM_ADDR x)

ENTRY(good) {  // the documented pattern: alloc, copy in, enqueue, dequeue, compute, copy out, free
    TPipe pipe; TQue<TPosition::VECIN, 2> in; TQue<TPosition::VECOUT, 2> out;  // each block its own half
    pipe.InitBuffer(in, 2, 256); pipe.InitBuffer(out, 2, 256);
    GlobalTensor<float> g; g.SetGlobalBuffer((__gm__ float*)x + 32 * GetBlockIdx(), 32);
    LocalTensor<float> a = in.AllocTensor<float>(); DataCopy(a, g, 32); in.EnQue(a);
    LocalTensor<float> b = in.DeQue<float>(); LocalTensor<float> c = out.AllocTensor<float>();
    Muls(c, b, 2.0f, 32); in.FreeTensor(b); out.EnQue(c);
    LocalTensor<float> d = out.DeQue<float>(); DataCopy(g, d, 32); out.FreeTensor(d);
}
ENTRY(ub_overflow) {  // 2 x 96 KiB + 32 B > 192 KiB
    TPipe pipe; TQue<TPosition::VECIN, 2> in; TBuf<TPosition::VECCALC> t;
    pipe.InitBuffer(in, 2, 96 * 1024); pipe.InitBuffer(t, 32);
}
ENTRY(copy_length_not_32B) {  // 10 floats = 40 bytes
    TPipe pipe; TQue<TPosition::VECIN, 1> in; pipe.InitBuffer(in, 1, 256);
    GlobalTensor<float> g; g.SetGlobalBuffer((__gm__ float*)x, 64);
    LocalTensor<float> a = in.AllocTensor<float>(); DataCopy(a, g, 10);
}
ENTRY(copy_address_not_32B) {  // UB destination 4 bytes into a buffer
    TPipe pipe; TQue<TPosition::VECIN, 1> in; pipe.InitBuffer(in, 1, 512);
    GlobalTensor<float> g; g.SetGlobalBuffer((__gm__ float*)x, 64);
    LocalTensor<float> a = in.AllocTensor<float>(); DataCopy(a[1], g, 8);
}
ENTRY(vector_operand_not_32B) {
    TPipe pipe; TBuf<TPosition::VECCALC> t; pipe.InitBuffer(t, 512);
    LocalTensor<float> a = t.Get<float>(); Duplicate(a, 1.0f, 64); Adds(a[3], a[8], 1.0f, 8);
}
ENTRY(read_before_write) {  // Exp of a freshly allocated (random) buffer
    TPipe pipe; TQue<TPosition::VECOUT, 1> out; pipe.InitBuffer(out, 1, 256);
    LocalTensor<float> a = out.AllocTensor<float>(); Exp(a, a, 64);
}
ENTRY(read_partially_written) {  // 32 of 64 elements written, 64 read
    TPipe pipe; TBuf<TPosition::VECCALC> t; pipe.InitBuffer(t, 512);
    LocalTensor<float> a = t.Get<float>(); Duplicate(a, 0.0f, 32); Muls(a[64], a, 3.0f, 64);
}
ENTRY(stale_after_realloc) {  // data written before FreeTensor is gone after the next AllocTensor
    TPipe pipe; TQue<TPosition::VECIN, 1> in; pipe.InitBuffer(in, 1, 256);
    LocalTensor<float> a = in.AllocTensor<float>(); Duplicate(a, 1.0f, 64); in.FreeTensor(a);
    LocalTensor<float> b = in.AllocTensor<float>(); float v = b.GetValue(0); (void)v;
}
ENTRY(alloc_beyond_buffers) {
    TPipe pipe; TQue<TPosition::VECIN, 2> in; pipe.InitBuffer(in, 2, 256);
    LocalTensor<float> a = in.AllocTensor<float>(); LocalTensor<float> b = in.AllocTensor<float>();
    LocalTensor<float> c = in.AllocTensor<float>();
}
ENTRY(free_not_allocated) {
    TPipe pipe; TQue<TPosition::VECIN, 2> in; pipe.InitBuffer(in, 2, 256);
    LocalTensor<float> a = in.AllocTensor<float>(); in.FreeTensor(a); in.FreeTensor(a);
}
ENTRY(enqueue_beyond_depth) {
    TPipe pipe; TQue<TPosition::VECIN, 1> in; pipe.InitBuffer(in, 2, 256);
    LocalTensor<float> a = in.AllocTensor<float>(); LocalTensor<float> b = in.AllocTensor<float>();
    in.EnQue(a); in.EnQue(b);
}
ENTRY(dequeue_empty) {
    TPipe pipe; TQue<TPosition::VECIN, 2> in; pipe.InitBuffer(in, 2, 256);
    LocalTensor<float> a = in.DeQue<float>();
}
ENTRY(free_while_queued) {
    TPipe pipe; TQue<TPosition::VECIN, 2> in; pipe.InitBuffer(in, 2, 256);
    LocalTensor<float> a = in.AllocTensor<float>(); in.EnQue(a); in.FreeTensor(a);
}
ENTRY(global_out_of_bounds) {
    TPipe pipe; TQue<TPosition::VECIN, 1> in; pipe.InitBuffer(in, 1, 512);
    GlobalTensor<float> g; g.SetGlobalBuffer((__gm__ float*)x, 64);
    LocalTensor<float> a = in.AllocTensor<float>(); DataCopy(a, g[32], 64);
}
ENTRY(wait_without_set) { WaitFlag<HardEvent::V_S>(0); }
'''

CASES = [
    ("ub_overflow", "ub-capacity"),
    ("copy_length_not_32B", "alignment"),
    ("copy_address_not_32B", "alignment"),
    ("vector_operand_not_32B", "alignment"),
    ("read_before_write", "uninit-read"),
    ("read_partially_written", "uninit-read"),
    ("stale_after_realloc", "uninit-read"),
    ("alloc_beyond_buffers", "queue"),
    ("free_not_allocated", "queue"),
    ("enqueue_beyond_depth", "queue"),
    ("dequeue_empty", "queue"),
    ("free_while_queued", "queue"),
    ("global_out_of_bounds", "bounds"),
    ("wait_without_set", "flag"),
]


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    return sim.load_kernels(KERNELS, tmp_path_factory.mktemp("rules"), "rule_kernels")


def _run(lib, name):
    buf = np.arange(64, dtype=np.float32)
    err = ctypes.create_string_buffer(1024)
    fn = ctypes.cast(getattr(lib, name), ctypes.c_void_p)
    rc = lib.sim_launch_1(fn, ctypes.c_void_p(buf.ctypes.data), 2, err, len(err))
    return rc, err.value.decode(), buf


def test_good_kernel_runs(lib):
    rc, msg, buf = _run(lib, "good")
    assert rc == 0, msg
    np.testing.assert_array_equal(buf, np.arange(64, dtype=np.float32) * 2)  # two blocks, one half each


@pytest.mark.parametrize("name,rule", CASES)
def test_rule_violation_is_rejected(lib, name, rule):
    rc, msg, _ = _run(lib, name)
    assert rc == 1 and f"[{rule}]" in msg, msg
    assert msg.startswith("block 0:")
