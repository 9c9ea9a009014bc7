"""What the GPU subcommands share: the timer (CUDA graphs, an L2 flush before each timed replay,
CUDA events, the median), interleaved passes, the copy ceiling, the decode points (paged KV, page 16)
and the peers' and our timed calls. Needs torch with CUDA (imported here: only the GPU subcommands
import this module)."""

from __future__ import annotations

import time

import numpy as np

from splitkv_common.optional import require

torch = require("torch", "python -m splitkv_bench (GPU subcommands)")
require("triton", "python -m splitkv_bench (GPU subcommands)")

from cuda_ref.wrapper import DecodeWrapper  # noqa: E402

#: Tokens a KV page holds in every GPU point.
PAGE = 16
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
#: Bytes of the buffer the timer reads or zeroes before each timed replay (larger than any L2).
FLUSH_BYTES = 256 << 20


class Timer:
    """Median time (µs) of CUDA-graph replays, each after an L2 flush.

    ``flush``: ``"read"`` (default) reads a buffer larger than the L2 before each replay, leaving
    the L2 full of clean lines of other data, as in a model where the previous layer read its own
    KV and weights; ``"write"`` zeroes that buffer instead (``triton.testing.do_bench``'s flush),
    leaving the L2 full of dirty lines that the timed kernel must first write back, up to the L2's
    size in extra traffic (measured in docs/perf-notes.md); ``"none"`` flushes nothing (hot L2)."""

    def __init__(self, iters: int = 20, warmup_s: float = 0.01, flush: str = "read"):
        if flush not in ("read", "write", "none"):
            raise ValueError(f"flush: must be 'read', 'write' or 'none', got {flush!r}")
        self.iters, self.warmup_s, self.flush_mode = iters, warmup_s, flush
        self.flush = torch.zeros(FLUSH_BYTES // 4, dtype=torch.float32, device="cuda")

    def _flush(self):
        if self.flush_mode == "read":
            self.flush.sum()
        elif self.flush_mode == "write":
            self.flush.zero_()

    def graph(self, fn):
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        torch.cuda.synchronize()
        return g.replay

    def __call__(self, fn, use_graph: bool = True) -> float:
        run = self.graph(fn) if use_graph else fn
        # keep the GPU busy for warmup_s first: after host-side work the clocks are down, and a
        # fixed count of warm-up calls left the first implementation timed at a point slow
        # (docs/perf-notes.md, "A slow first timing")
        t_end, n = time.perf_counter() + self.warmup_s, 0
        while n < 3 or time.perf_counter() < t_end:
            run()
            n += 1
            if n % 8 == 0:
                torch.cuda.synchronize()
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(self.iters)]
        for a, b in ev:
            self._flush()
            a.record()
            run()
            b.record()
        torch.cuda.synchronize()
        return float(np.median([a.elapsed_time(b) for a, b in ev]) * 1e3)


def interleaved(timer: Timer, runs: dict, passes: int = 3) -> dict:
    """``{name: [µs of each pass]}``: each of ``runs`` (name -> callable, e.g. a graph's replay from
    :meth:`Timer.graph`) timed by ``timer`` in turn, ``passes`` times, so that a drift of the GPU's
    or the host's speed falls on all of them alike."""
    out = {n: [] for n in runs}
    for _ in range(passes):
        for n, fn in runs.items():
            out[n].append(timer(fn, use_graph=False))
    return out


def copy_ceiling(timer: Timer, nbytes: int = 2 << 30) -> float:
    """GB/s of a device-to-device copy, counting bytes read plus bytes written."""
    src = torch.randn(nbytes // 2, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    t_end = time.time() + 1.0  # bring the clocks up before the first timing
    while time.time() < t_end:
        dst.copy_(src)
    torch.cuda.synchronize()
    us = min(timer(lambda: dst.copy_(src), use_graph=False), timer(lambda: dst.copy_(src)))
    return 2 * nbytes / (us * 1e-6) / 1e9


def make_point(B, ctx, hq, hkv, D, dtype, seed=0):
    """One decode point on the GPU, seeded: ``q [B, hq, D]``, paged ``k`` and ``v`` ``[B * ctx / PAGE, PAGE,
    hkv, D]`` of ``dtype`` (standard normal), the block table ``[B, ctx / PAGE]`` int32 (the pages
    shuffled), ``seq_lens [B]`` int32 (every request ``ctx`` tokens)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    pages_per = ctx // PAGE
    P = B * pages_per
    k = torch.randn((P, PAGE, hkv, D), generator=g, device="cuda", dtype=dtype)
    v = torch.randn((P, PAGE, hkv, D), generator=g, device="cuda", dtype=dtype)
    bt = torch.randperm(P, generator=g, device="cuda").to(torch.int32).view(B, pages_per)
    q = torch.randn((B, hq, D), generator=g, device="cuda", dtype=dtype)
    seq = torch.full((B,), ctx, dtype=torch.int32, device="cuda")
    return q, k, v, bt, seq


def random_batches(max_batch: int, n: int, seed: int = 0, lo: int = 512, hi: int = 8192) -> list:
    """``n`` decode batches as a serving step sees them, the batch changing every step: each of 1 to
    ``max_batch`` requests (drawn at random) with lengths uniform in ``[lo, hi]``, as ``(B, lens int64
    [B] (host), seq_lens int32 [B], query_start_loc int32 [B + 1] (one row each; CUDA))`` (the first
    ``B`` rows of a :func:`make_point` of ``max_batch`` requests and ``hi`` tokens serve them all)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        B = int(rng.integers(1, max_batch + 1))
        lens = rng.integers(lo, hi + 1, B)
        out.append((B, lens, torch.from_numpy(lens.astype(np.int32)).cuda(),
                    torch.arange(B + 1, dtype=torch.int32, device="cuda")))
    return out


def contiguous_kv(k, bt, B, ctx):
    """``[B, Hkv, ctx, D]`` contiguous copy of a paged cache (the peers' layout)."""
    x = k[bt.long()]  # [B, pages, PAGE, Hkv, D]
    return x.view(B, ctx, k.shape[2], k.shape[3]).transpose(1, 2).contiguous()


def ours(timer, q, k, v, bt, seq, policy, *, stage1_only=False, min_split=None, config=None, max_splits=None):
    """Our ``DecodeWrapper`` with ``policy`` at a :func:`make_point` point (one query row a request), timed
    by ``timer``: ``(µs, plan, workspace bytes)``; ``stage1_only`` leaves the merge launch out."""
    B = bt.shape[0]
    w = DecodeWrapper(q.shape[1], k.shape[2], q.shape[2], PAGE, dtype=q.dtype, policy=policy,
                      min_split_tokens=min_split, config=config, max_splits=max_splits)
    plan = w.plan(seq.cpu().numpy())
    w.merge = not stage1_only
    qsl = torch.arange(B + 1, dtype=torch.int32, device="cuda")
    us = timer(lambda: w.run(q, k, v, bt, seq, qsl))
    return us, plan, w.workspace_bytes()


def sdpa_peers(timer, q, kc, vc) -> dict:
    """PyTorch SDPA with the cuDNN and the flash backends on the contiguous copy (µs, or None and
    the error when a backend refuses the shape)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    F = torch.nn.functional
    q4 = q[:, :, None, :]  # [B, Hq, 1, D]
    res = {}
    for name, be in (("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa_flash", SDPBackend.FLASH_ATTENTION)):
        def f(be=be):
            with sdpa_kernel([be]):
                return F.scaled_dot_product_attention(q4, kc, vc, enable_gqa=True)
        try:
            f()
            res[name] = timer(f)
        except Exception as e:  # noqa: BLE001 - a peer refusing a shape is a result
            res[name] = None
            res[name + "_error"] = f"{type(e).__name__}: {str(e)[:120]}"
    return res


def parse_points(text: str) -> list[tuple]:
    """``B1x16k,B1x32k@16/2/256,B16x4k@32/8/64`` -> ``[(B, ctx, hq, hkv, D, "bf16"), ...]`` (default heads
    32 / 8, head dim 128). Raises ``ValueError`` naming a point it cannot read."""
    pts = []
    for item in text.split(","):
        item = item.strip()
        shape, _, heads = item.partition("@")
        b, sep, n = shape.upper().lstrip("B").partition("X")
        try:
            if not sep:
                raise ValueError
            ctx = int(n[:-1]) * 1024 if n.endswith("K") else int(n)
            h = [int(x) for x in heads.split("/")] if heads else []
            if len(h) not in (0, 2, 3):
                raise ValueError
            hq, hkv, D = (h + [32, 8, 128][len(h):]) if h else (32, 8, 128)
            pts.append((int(b), ctx, hq, hkv, D, "bf16"))
        except ValueError:
            raise ValueError(f"--points: {item!r} is not B<batch>x<context>[@hq/hkv[/D]], e.g. B1x16k@64/8") from None
    return pts


def kv_bytes(B, ctx, hkv, D, dt):
    """Bytes of K and V at a point (``dt``: a key of :data:`DTYPES`)."""
    return 2 * B * ctx * hkv * D * torch.empty(0, dtype=DTYPES[dt]).element_size()
