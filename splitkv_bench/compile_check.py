"""Compile the Triton kernels for sm_90 (H100/H200) on a machine without a GPU.

Catches compile errors the interpreter does not, and reports for each stage-1 variant what decides
its speed before any GPU time is spent: whether Triton's software pipeliner turned the tile
loads into asynchronous copies (``async_copy_global_to_local`` in the TTGIR, ``cp.async`` in the
PTX), the shared memory, and ptxas's registers and spills (Triton's bundled ptxas, ``-v``).

    python -m splitkv_bench compile-check                 # the table
    python -m splitkv_bench compile-check --dump DIR      # also the TTGIR / PTX of each variant
    python -m splitkv_bench compile-check --strict        # exit 1 if a float-KV variant is not
                                                         # pipelined or any variant spills
"""
import argparse
import os
import pathlib
import re
import subprocess
import tempfile

os.environ["TRITON_INTERPRET"] = "0"

from splitkv_common.optional import require

triton = require("triton", "python -m splitkv_bench compile-check")
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

import cuda_ref.kernels as K  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
PTRS = {"Q": "bf16", "K": "bf16", "V": "bf16", "OUT": "bf16", "PART_O": "fp32", "PART_LSE": "fp32",
        "OUT_LSE": "fp32", "K_SCALE": "fp32", "V_SCALE": "fp32", "K_OFFSET": "fp32", "V_OFFSET": "fp32"}
I32_PTRS = ("BLOCK_TABLE", "SEQ_LENS", "QUERY_START", "ITEM_REQ", "ITEM_HEAD", "ITEM_SPLIT", "ITEM_START",
            "ITEM_END", "NUM_SPLITS", "ROW_SLOT", "COUNTERS", "ERRORS")

ALIGNED_INTS = ("stride_qt", "stride_qh", "stride_kp", "stride_kt", "stride_kh", "stride_vp", "stride_vt",
                "stride_vh", "stride_ps", "stride_ph", "stride_ls", "stride_ot", "stride_oh", "stride_lot")
BASE = dict(GROUP=4, PAGE=16, HEAD_DIM=128, BLOCK_D=128, BLOCK_M=16, BLOCK_N=64, KV_INT8=False,
            HAS_OFFSET=False, SOFT_CAP=False, HAS_WINDOW=False, DOT_IEEE=False, UPCAST=False,
            FUSE_MERGE=False, SCALE_PER_CHANNEL=False, MERGE_CHUNK=32,
            MULTI_ROW_BLOCKS=False, BOUNDS=True, COUNT_ERRORS=True, MIXED_TILES=False, DEVICE_PLAN=False,
            COLUMN_SUM=False, HOST_SPLITS=False, STATIC_LOOP=False)


def variants():
    """(name, q dtype, kv dtype, constexprs, num_warps, num_stages)."""
    v = []
    for bn, nw, ns in ((64, 4, 3), (64, 4, 5), (64, 4, 7), (32, 4, 5), (32, 4, 7), (32, 2, 5), (64, 8, 5), (64, 8, 7)):
        v.append((f"bf16 D128 M16 n{bn}w{nw}s{ns}", "bf16", "bf16", dict(BASE, BLOCK_N=bn), nw, ns))
    v.append(("bf16 D128 M16 n16w1s5 (many items)", "bf16", "bf16", dict(BASE, BLOCK_N=16), 1, 5))
    v.append(("bf16 D128 M16 n16w1s5 unsplit from the index", "bf16", "bf16", dict(BASE, BLOCK_N=16, DEVICE_PLAN=True),
              1, 5))
    v.append(("bf16 D128 M16 n128w8s6 (lone item)", "bf16", "bf16", dict(BASE, BLOCK_N=128), 8, 6))
    v.append(("bf16 D128 M16 n128w8s6c (lone item, row sum per column)", "bf16", "bf16",
              dict(BASE, BLOCK_N=128, COLUMN_SUM=True), 8, 6))
    v.append(("bf16 D128 M16 fused n64w4s5", "bf16", "bf16", dict(BASE, FUSE_MERGE=True), 4, 5))
    v.append(("bf16 D128 M16 PDL trigger n64w4s5", "bf16", "bf16", dict(BASE, LAUNCH_DEPENDENTS=True), 4, 5))
    v.append(("bf16 D128 M16 device plan n64w4s7", "bf16", "bf16", dict(BASE, DEVICE_PLAN=True), 4, 7))
    v.append(("bf16 D128 M16 batch-1 splits, static loop n64w4s5", "bf16", "bf16",
              dict(BASE, DEVICE_PLAN=True, HOST_SPLITS=True, STATIC_LOOP=True), 4, 5))
    v.append(("bf16 D128 M16 graph-stable padded n64w4s7", "bf16", "bf16", dict(BASE, PADDED=True), 4, 7))
    v.append(("bf16 D128 M16 device plan fused n64w4s5", "bf16", "bf16", dict(BASE, DEVICE_PLAN=True,
                                                                            FUSE_MERGE=True), 4, 5))
    v.append(("bf16 D128 M64 (multi-query) n64w4s5", "bf16", "bf16", dict(BASE, BLOCK_M=64, MULTI_ROW_BLOCKS=True,
                                                                           MIXED_TILES=True),
              4, 5))
    v.append(("bf16 D128 cap+window n64w4s5", "bf16", "bf16", dict(BASE, SOFT_CAP=True, HAS_WINDOW=True), 4, 5))
    v.append(("fp16 D256 n32w4s5", "fp16", "fp16", dict(BASE, HEAD_DIM=256, BLOCK_D=256, BLOCK_N=32,
                                                         MERGE_CHUNK=16), 4, 5))
    v.append(("bf16 D64 n64w4s5", "bf16", "bf16", dict(BASE, HEAD_DIM=64, BLOCK_D=64), 4, 5))
    v.append(("bf16 D64 n32w2s7", "bf16", "bf16", dict(BASE, HEAD_DIM=64, BLOCK_D=64, BLOCK_N=32), 2, 7))
    v.append(("bf16 D64 n128w4s5", "bf16", "bf16", dict(BASE, HEAD_DIM=64, BLOCK_D=64, BLOCK_N=128), 4, 5))
    v.append(("fp32 D128 n32w8s5", "fp32", "fp32", dict(BASE, DOT_IEEE=True, BLOCK_N=32), 8, 5))
    v.append(("bf16/int8 D96 per-channel n32w8s5", "bf16", "i8", dict(BASE, HEAD_DIM=96, KV_INT8=True,
                                                                      HAS_OFFSET=True, DOT_IEEE=True,
                                                                      SCALE_PER_CHANNEL=True, BLOCK_N=32), 8, 5))
    return v


def compile_split(qdt, kvdt, const, nw, ns):
    fn = K.split_kv_kernel
    sig = {}
    for n in fn.arg_names:
        if n in const:
            sig[n] = "constexpr"
        elif n in I32_PTRS:
            sig[n] = "*i32"
        elif n in PTRS:
            t = PTRS[n]
            sig[n] = "*" + (qdt if n in ("Q", "OUT") else kvdt if n in ("K", "V") else t)
        elif n in ("qk_scale", "soft_cap"):
            sig[n] = "fp32"
        else:
            sig[n] = "i32"
    # what a launch specializes: pointers 16-byte aligned, and the strides of the benchmark's
    # tensors (head dim 128, page 16: all multiples of 16) divisible by 16
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
             if sig[n].startswith("*") or n in ALIGNED_INTS}
    return triton.compile(ASTSource(fn, sig, constexprs=dict(const), attrs=attrs), target=TARGET,
                          options={"num_warps": nw, "num_stages": ns})


def ptxas_report(ptx: str) -> tuple[int, int, int]:
    """(registers, spill stores, spill loads) from ptxas -v on the kernel's PTX."""
    ptxas = pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    with tempfile.TemporaryDirectory() as d:
        p = pathlib.Path(d) / "k.ptx"
        p.write_text(ptx)
        r = subprocess.run([str(ptxas), "-v", "-arch=sm_90a", str(p), "-o", str(pathlib.Path(d) / "k.cubin")],
                           capture_output=True, text=True)
    text = r.stdout + r.stderr
    regs = int(m.group(1)) if (m := re.search(r"Used (\d+) registers", text)) else -1
    st = int(m.group(1)) if (m := re.search(r"(\d+) bytes spill stores", text)) else -1
    ld = int(m.group(1)) if (m := re.search(r"(\d+) bytes spill loads", text)) else -1
    return regs, st, ld


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dump", default=None, help="write each variant's TTGIR and PTX here")
    ap.add_argument("--strict", action="store_true")
    ap.add_argument("--only", default="")
    a = ap.parse_args(argv)
    bad = []
    print(f"{'variant':40s} {'async copies':>12s} {'cp.async':>8s} {'smem KiB':>8s} {'regs':>5s} {'spill st/ld':>12s}")
    for name, qdt, kvdt, const, nw, ns in variants():
        if a.only and a.only not in name:
            continue
        k = compile_split(qdt, kvdt, const, nw, ns)
        ttgir, ptx = k.asm["ttgir"], k.asm["ptx"]
        n_async = ttgir.count("async_copy_global_to_local")
        n_cp = len(re.findall(r"cp\.async\.(?:ca|cg)", ptx))
        regs, st, ld = ptxas_report(ptx)
        print(f"{name:40s} {n_async:12d} {n_cp:8d} {k.metadata.shared / 1024:8.1f} {regs:5d} {st:6d}/{ld:<5d}")
        if a.dump:
            d = pathlib.Path(a.dump)
            d.mkdir(parents=True, exist_ok=True)
            stem = re.sub(r"[^A-Za-z0-9]+", "_", name)
            (d / f"{stem}.ttgir").write_text(ttgir)
            (d / f"{stem}.ptx").write_text(ptx)
        if st > 0 or ld > 0 or (not const["KV_INT8"] and ns >= 2 and n_async == 0):
            bad.append(name)
    m = K.merge_kernel
    mp = {"PART_O": "*fp32", "PART_LSE": "*fp32", "OUT": "*bf16", "OUT_LSE": "*fp32", "ROW_SLOT": "*i32",
          "ROW_NS": "*i32", "SEQ_LENS": "*i32", "QUERY_START": "*i32"}
    for d, chunk, pdl, dev in ((128, 32, False, False), (128, 32, True, False), (256, 32, True, False),
                               (128, 32, True, True)):
        parts = max(1, d // 64)  # cuda_ref.launch.merge_d_parts (64 columns a program)
        mc = dict(HEAD_DIM=d, BLOCK_D=d, SKIP_SINGLE=True, CHUNK=chunk, WAIT_PRIMARY=pdl, DEVICE_PLAN=dev,
                  D_PARTS=parts)
        sg = {n: ("constexpr" if n in mc else mp.get(n, "i32")) for n in m.arg_names}
        mk = triton.compile(ASTSource(m, sg, constexprs=dict(mc)), target=TARGET,
                            options={"num_warps": 1, "launch_pdl": pdl})  # KernelConfig.merge_warps
        regs, st, ld = ptxas_report(mk.asm["ptx"])
        name = f"merge D{d} chunk{chunk} parts{parts} w1{' PDL' if pdl else ''}{' device plan' if dev else ''}"
        print(f"{name:40s} {'-':>12s} {'-':>8s} {mk.metadata.shared / 1024:8.1f} {regs:5d} {st:6d}/{ld:<5d}")
        if pdl and "griddepcontrol.wait" not in mk.asm["ptx"]:
            bad.append(name + " (no griddepcontrol.wait)")
    if bad:
        print("not pipelined or spilling:", ", ".join(bad))
    return 1 if (a.strict and bad) else 0
