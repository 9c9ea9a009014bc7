"""The CPU twin's reduction repeat forms (WholeReduceSum / WholeReduceMax / BlockReduceSum /
BlockReduceMax) on planted kernels, and the mixed kernel's row reductions built on them.

The semantics checked are the documented ones (one result per repeat or per 32-byte block, the mask,
the block and repeat strides, the dstRepStride unit, the value / index layout of WholeReduceMax, the
parameter limits); the summation order inside a repeat is the twin's stated assumption and is only
checked to the float32 rounding of the inputs used. A test double: nothing here ran on an NPU.
"""

from __future__ import annotations

import ctypes
from dataclasses import replace

import numpy as np
import pytest

sim = pytest.importorskip("ascend_ops.sim_backend")
pytestmark = pytest.mark.skipif(sim.compiler_missing() is not None, reason=str(sim.compiler_missing()))

SRC_NAME = "twin_reduce_kernels.cpp"
KERNELS = r'''
#include "kernel_operator.h"
using namespace AscendC;

#define ENTRY(name) extern "C" __global__ __aicore__ void name(GM_ADDR x)
template <HardEvent E>
__aicore__ inline void Sync() { SetFlag<E>(0); WaitFlag<E>(0); }
// x: 512 input floats (4 rows of 128), results from float 1024 on
#define SETUP                                                                           \
    TPipe pipe; TBuf<TPosition::VECCALC> t, o; pipe.InitBuffer(t, 4096); pipe.InitBuffer(o, 1024); \
    GlobalTensor<float> g; g.SetGlobalBuffer((__gm__ float*)x, 4096);                   \
    LocalTensor<float> a = t.Get<float>(), d = o.Get<float>();                          \
    DataCopy(a, g, 512); Duplicate(d, -7.0f, 256); Sync<HardEvent::MTE2_V>()
#define OUT Sync<HardEvent::V_MTE3>(); DataCopy(g[1024], d, 256)

// rows of 128 (srcRepStride 16 blocks), whole 64-lane repeats: d[0..4) sums, d[8..16) (value, index)
// pairs, d[16 + 2 r] values only (dstRepStride 2), d[32..36) sums of each row's first 24 lanes,
// d[40..42) sums of blocks 0, 2, 4, 6 of rows 0 and 1 (srcBlkStride 2, mask 32)
ENTRY(whole_reduce) {
    SETUP;
    WholeReduceSum(d, a, 64, 4, 1, 1, 16);
    WholeReduceMax(d[8], a, 64, 4, 1, 1, 16, ReduceOrder::ORDER_VALUE_INDEX);
    WholeReduceMax(d[16], a, 64, 4, 2, 1, 16, ReduceOrder::ORDER_ONLY_VALUE);
    WholeReduceSum(d[32], a, 24, 4, 1, 1, 16);
    WholeReduceSum(d[40], a, 32, 2, 1, 2, 16);
    OUT;
}
// index first: d[0..8) (index, value) pairs of the 4 rows' second halves (src a[64])
ENTRY(whole_reduce_index_value) {
    SETUP;
    WholeReduceMax(d, a[64], 64, 4, 1, 1, 16, ReduceOrder::ORDER_INDEX_VALUE);
    OUT;
}
// per block: d[0..64) sums of the 64 blocks of a (8 repeats), d[64..128) maxima; d[128..) the
// first 2 repeats with dstRepStride 2 (results at units 0 and 2 of 8 floats) and mask 20 (blocks
// 0 and 1 whole, block 2 four lanes, blocks 3..7 not written)
ENTRY(block_reduce) {
    SETUP;
    BlockReduceSum(d, a, 8, 64, 1, 1, 8);
    BlockReduceMax(d[64], a, 8, 64, 1, 1, 8);
    BlockReduceSum(d[128], a, 2, 20, 2, 1, 8);
    OUT;
}
// limits and rules
ENTRY(whole_repeat_over) { SETUP; WholeReduceSum(d, a, 64, 256, 1, 1, 0); }
ENTRY(whole_src_rep_stride_over) { SETUP; WholeReduceSum(d, a, 64, 1, 1, 1, 256); }
ENTRY(whole_mask_over) { SETUP; WholeReduceMax(d, a, 65, 1, 1, 1, 8); }
ENTRY(whole_max_dst_misaligned) { SETUP; WholeReduceMax(d[1], a, 64, 1, 1, 1, 8); }
ENTRY(whole_max_dst_aligned_ok) { SETUP; WholeReduceMax(d[2], a, 64, 1, 1, 1, 8); }
ENTRY(block_dst_misaligned) { SETUP; BlockReduceSum(d[4], a, 1, 64, 1, 1, 8); }
ENTRY(whole_reads_vector_result_no_barrier) {
    SETUP; Muls(a, a, 2.0f, 64); WholeReduceSum(d, a, 64, 1, 1, 1, 8);
}
ENTRY(whole_reads_vector_result_ok) {
    SETUP; Muls(a, a, 2.0f, 64); PipeBarrier<PIPE_V>(); WholeReduceSum(d, a, 64, 1, 1, 1, 8);
}
// counters: two repeat-form reductions and one count-mode ReduceSum
ENTRY(reduce_counters) {
    SETUP;
    LocalTensor<float> w = t.Get<float>()[512];
    WholeReduceSum(d, a, 64, 4, 1, 1, 16);
    BlockReduceMax(d[64], a, 2, 64, 1, 1, 8);
    ReduceSum(d[128], a, w, 128);
}
'''


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    dll = sim.load_kernels(KERNELS, tmp_path_factory.mktemp("reduce"), SRC_NAME.removesuffix(".cpp"))
    yield dll
    sim.set_block_order(dll, 0)


def _input() -> np.ndarray:
    rng = np.random.default_rng(7)
    a = rng.integers(-64, 64, 512).astype(np.float32) / 4  # small dyadic values: every sum exact
    a[3 * 128 + 17] = 100.0  # row 3's maximum at lane 17
    a[1 * 128 + 5] = a[1 * 128 + 9] = 90.0  # a tie in row 1: the lower lane
    return a


def run(lib, name):
    buf = np.zeros(4096, np.float32)
    buf[:512] = _input()
    err = ctypes.create_string_buffer(4096)
    sim.set_block_order(lib, 0)
    fn = ctypes.cast(getattr(lib, name), ctypes.c_void_p)
    rc = lib.sim_launch_1(fn, ctypes.c_void_p(buf.ctypes.data), 1, err, len(err))
    return rc, err.value.decode(), buf[1024:1280]


def test_whole_reduce_values_layout_mask_and_strides(lib):
    rc, msg, d = run(lib, "whole_reduce")
    assert rc == 0, msg
    rows = _input().reshape(4, 128)
    np.testing.assert_array_equal(d[:4], rows[:, :64].sum(1))
    assert (d[4:8] == -7.0).all()  # nothing past the last repeat's result
    pairs = d[8:16].reshape(4, 2)
    np.testing.assert_array_equal(pairs[:, 0], rows[:, :64].max(1))
    idx = pairs[:, 1].view(np.uint32)
    np.testing.assert_array_equal(idx, rows[:, :64].argmax(1))  # the lowest lane of a tie (row 1: 5)
    assert idx[1] == 5 and idx[3] == 17
    np.testing.assert_array_equal(d[16:24:2], rows[:, :64].max(1))
    assert (d[17:24:2] == -7.0).all()  # ORDER_ONLY_VALUE, dstRepStride 2: one element a unit
    np.testing.assert_array_equal(d[32:36], rows[:, :24].sum(1))
    blocks = rows[:2, :64].reshape(2, 8, 8)  # srcBlkStride 2: blocks 0, 2, 4, 6 of the row
    np.testing.assert_array_equal(d[40:42], blocks[:, 0:8:2].sum((1, 2)))


def test_whole_reduce_max_index_first(lib):
    rc, msg, d = run(lib, "whole_reduce_index_value")
    assert rc == 0, msg
    rows = _input().reshape(4, 128)[:, 64:]
    pairs = d[:8].reshape(4, 2)
    np.testing.assert_array_equal(pairs[:, 0].view(np.uint32), rows.argmax(1))
    np.testing.assert_array_equal(pairs[:, 1], rows.max(1))


def test_block_reduce_per_block_and_partial_mask(lib):
    rc, msg, d = run(lib, "block_reduce")
    assert rc == 0, msg
    blocks = _input().reshape(64, 8)
    np.testing.assert_array_equal(d[:64], blocks.sum(1))
    np.testing.assert_array_equal(d[64:128], blocks.max(1))
    first = d[128:152].reshape(3, 8)  # repeat 0 at unit 0, repeat 1 at unit 2; unit 1 untouched
    for r, unit in ((0, 0), (1, 2)):
        b = blocks[8 * r:8 * r + 3]
        np.testing.assert_array_equal(first[unit, :3], [b[0].sum(), b[1].sum(), b[2, :4].sum()])
        assert (first[unit, 3:] == -7.0).all()  # blocks without a lane in the mask: not written
    assert (first[1] == -7.0).all()


@pytest.mark.parametrize("name,rule,detail", [
    ("whole_repeat_over", "vec-param", "repeatTimes = 256"),
    ("whole_src_rep_stride_over", "vec-param", "srcRepStride = 256"),
    ("whole_mask_over", "vec-param", "mask (continuous) = 65"),
    ("whole_max_dst_misaligned", "alignment", "not 8-byte aligned"),
    ("block_dst_misaligned", "alignment", "not 32-byte aligned"),
    ("whole_reads_vector_result_no_barrier", "pipe-race", "WholeReduceSum"),
])
def test_reduce_limits_and_rules(lib, name, rule, detail):
    rc, msg, _ = run(lib, name)
    assert rc == 1 and f"[{rule}]" in msg and detail in msg, msg


@pytest.mark.parametrize("name", ["whole_max_dst_aligned_ok", "whole_reads_vector_result_ok"])
def test_reduce_legal_counterparts(lib, name):
    rc, msg, _ = run(lib, name)
    assert rc == 0, msg


def test_repeat_form_reductions_are_not_counted_as_drains(lib):
    rc, msg, _ = run(lib, "reduce_counters")
    assert rc == 0, msg
    s = sim.last_stats(lib)[0]
    assert s["vec_reduces"] == 1  # the count-mode ReduceSum only
    # Duplicate (1 repeat of 256 floats: 4), WholeReduceSum (4), BlockReduceMax (2), ReduceSum (2 + 1)
    assert s["ins"]["V"] == 4
    assert s["vec_repeats"] == 4 + 4 + 2 + 3


def _step_counts(hq: int, hkv: int, kv_quant=None) -> dict:
    """Per exchange step counters of the mixed kernel's busier vector core (one request per KV head,
    one and two full steps; the difference), as splitkv_bench.npu_estimate.vec_work_from_twin."""
    from ascend_ops import tiling as tl
    from splitkv_bench import npu_estimate as ne

    sh = replace(ne.SHAPES[0], batch=1, hq=hq, hkv=hkv, kv_quant=kv_quant)
    tt, _, steps = tl.choose_mix_tiles(sh.head_dim, sh.dtype, hq // hkv, False,
                                       kv_dtype="int8" if kv_quant else None)
    lib = sim.twin_library()
    sim.set_block_order(lib, 0)
    pts = []
    for k in (1, 2):
        inp = ne._inputs(sh, k * tt * steps)
        sim.run_twin(inp, inp.plan("none", device="910b2"), kernel="mix", fused=True)
        aiv = [s for s in sim.last_stats(lib) if s.get("core_type") == "AIV" and s["ins"]["V"] > 0]
        pts.append(max(aiv, key=lambda s: s["vec_repeats"]))
    a, b = pts
    return {"reduces": b["vec_reduces"] - a["vec_reduces"], "barriers": b["barrier_v"] - a["barrier_v"]}


@pytest.mark.parametrize("kv_quant", [None, "channel"])
def test_mixed_kernel_row_reductions_do_not_grow_with_rows(kv_quant):
    """A full 2048-token step (rows of 2048 scores): with 4 or more rows per vector core the softmax's
    row reductions are BlockReduce levels and one WholeReduce for all rows (no count-mode
    ReduceSum / ReduceMax), so the step's drains are the same for 4, 8 and 16 rows."""
    got = {g: _step_counts(8 * g, 8, kv_quant) for g in (8, 16, 32)}  # 4, 8, 16 rows per vector core
    for g, c in got.items():
        assert c["reduces"] == 0, (g, c)
    assert len({c["barriers"] for c in got.values()}) == 1, got
