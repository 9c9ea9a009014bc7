"""One unsplit `auto` plan of one long item an SM (`cuda_ref.launch.lone_item`) on a CUDA GPU, for
compute-sanitizer: B 16 ragged in [1024, 1100] tokens, Hq 32 / Hkv 8, D 128, bf16, page 16, shuffled
pages; prints the plan and configuration the launch took, the worst relative error of the 16 rows
against SDPA math on each request's own KV, then runs with two page ids out of range and prints the
error the wrapper reports (their tokens are read as absent); "ok" (exit 0) when the plan is unsplit
with 128-token tiles, the error under 1e-2 and the bad page ids reported.

    compute-sanitizer --tool memcheck --error-exitcode 3 python3 scripts/h200_lone_check.py
"""
import sys

import torch

sys.path.insert(0, "scripts")
sys.path.insert(0, ".")
from bench_decode import PAGE
from cuda_ref.wrapper import DecodeWrapper
torch.manual_seed(0)
B, H, HKV, D = 16, 32, 8, 128
lens = torch.randint(1024, 1101, (B,), dtype=torch.int32)
pages = (lens.max().item() + PAGE - 1) // PAGE
P = B * pages + 3
k = torch.randn(P, PAGE, HKV, D, device="cuda", dtype=torch.bfloat16)
v = torch.randn_like(k)
bt = torch.randperm(B * pages, device="cuda").to(torch.int32).view(B, pages)
q = torch.randn(B, H, D, device="cuda", dtype=torch.bfloat16)
seq = lens.cuda()
w = DecodeWrapper(H, HKV, D, PAGE, dtype=torch.bfloat16)
plan = w.plan(lens.numpy())
out, lse = w.run(q, k, v, bt, seq)
torch.cuda.synchronize()
c = w.last_launch.constexprs
print("split", plan.split_tokens, "items", plan.num_items, "item_tokens", w.dplan.item_tokens,
      "config", c["BLOCK_N"], c["num_warps"], c["num_stages"])
worst = 0.0
for b in range(B):
    L = int(lens[b])
    kc = k[bt[b].long()].reshape(-1, HKV, D)[:L]
    vc = v[bt[b].long()].reshape(-1, HKV, D)[:L]
    ref = torch.nn.functional.scaled_dot_product_attention(
        q[b:b + 1, :, None].float(), kc.permute(1, 0, 2)[None].float(), vc.permute(1, 0, 2)[None].float(),
        enable_gqa=True)[0, :, 0]
    worst = max(worst, float((out[b].float() - ref).norm() / ref.norm()))
print("worst rel err", worst)
bt2 = bt.clone()
bt2[3, 5], bt2[7, 0] = P + 1000, -5
out2, _ = w.run(q, k, v, bt2, seq)
torch.cuda.synchronize()
reported = False
try:
    w.check_errors()
    print("no error reported (unexpected)")
except RuntimeError as e:
    reported = True
    print("reported:", str(e)[:120])
ok = worst < 1e-2 and reported and plan.split_tokens == 0 and c["BLOCK_N"] == 128
print("ok" if ok else "BAD")
sys.exit(0 if ok else 1)
