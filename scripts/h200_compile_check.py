#!/usr/bin/env python3
"""Compile the Triton kernels for sm_90 (H100/H200) on a machine without a GPU: catches compile
errors the interpreter does not, and reports shared memory per variant (Triton's bundled ptxas)."""
import os
os.environ.pop("TRITON_INTERPRET", None)
os.environ["TRITON_INTERPRET"] = "0"
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import cuda_ref.kernels as K
sig = {}
import inspect
fn = K.split_kv_kernel
names = fn.arg_names
ptrs = {"Q":"*bf16","K":"*bf16","V":"*bf16","BLOCK_TABLE":"*i32","SEQ_LENS":"*i32","QUERY_START":"*i32",
 "ITEM_REQ":"*i32","ITEM_HEAD":"*i32","ITEM_SPLIT":"*i32","ITEM_START":"*i32","ITEM_END":"*i32","NUM_SPLITS":"*i32","ROW_SLOT":"*i32",
 "PART_O":"*fp32","PART_LSE":"*fp32","OUT":"*bf16","OUT_LSE":"*fp32","COUNTERS":"*i32","K_SCALE":"*fp32","V_SCALE":"*fp32","K_OFFSET":"*fp32","V_OFFSET":"*fp32",
 "qk_scale":"fp32","soft_cap":"fp32"}
const = dict(GROUP=4, PAGE=16, HEAD_DIM=128, BLOCK_D=128, BLOCK_M=16, BLOCK_N=64, KV_INT8=False, HAS_OFFSET=False, SOFT_CAP=True, HAS_WINDOW=True, DOT_IEEE=False, UPCAST=False, FUSE_MERGE=True, PREFETCH=False)
for n in names:
    if n in const: sig[n] = "constexpr"
    else: sig[n] = ptrs.get(n, "i32")
src = ASTSource(fn, sig, constexprs={(names.index(k),): v for k, v in const.items()})
k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 3})
print("ok", k.metadata.shared, k.n_regs if hasattr(k,'n_regs') else '')
print(k.asm.keys())
import itertools
for dt, int8, ieee, fuse, D in [("bf16",False,False,False,128),("fp16",False,False,True,256),("fp32",False,True,False,64),("bf16",True,True,True,96),("bf16",False,False,False,64)]:
    p = dict(ptrs); 
    for n in ("Q","OUT"): p[n]="*"+dt
    for n in ("K","V"): p[n]="*i8" if int8 else "*"+dt
    c = dict(const, KV_INT8=int8, HAS_OFFSET=int8, DOT_IEEE=ieee, FUSE_MERGE=fuse, HEAD_DIM=D, BLOCK_D=triton.next_power_of_2(D))
    sg = {n: ("constexpr" if n in c else p.get(n, "i32")) for n in names}
    kk = triton.compile(ASTSource(fn, sg, constexprs={(names.index(k),): v for k, v in c.items()}), target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 3})
    print(dt, int8, ieee, fuse, D, "smem", kk.metadata.shared, "regs", kk.n_regs if hasattr(kk, "n_regs") else "?")
m = K.merge_kernel
mn = m.arg_names
mc = dict(HEAD_DIM=128, BLOCK_H=32, BLOCK_D=128, SKIP_SINGLE=True)
mp = {"PART_O":"*fp32","PART_LSE":"*fp32","OUT":"*bf16","OUT_LSE":"*fp32","ROW_SLOT":"*i32","ROW_NS":"*i32"}
sg = {n: ("constexpr" if n in mc else mp.get(n, "i32")) for n in mn}
triton.compile(ASTSource(m, sg, constexprs={(mn.index(k),): v for k, v in mc.items()}), target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
print("merge ok")
