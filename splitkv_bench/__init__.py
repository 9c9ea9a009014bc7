"""The benchmark and machine-check suite: ``python -m splitkv_bench <subcommand> [options]``.

Each subcommand is a module of this package with a ``main(argv) -> int``; ``python -m splitkv_bench``
lists them, ``python -m splitkv_bench <subcommand> --help`` gives each one's options. What they share
lives in :mod:`splitkv_bench.gpu` (the CUDA timer with its L2 flush, the decode points, the peers'
calls) and :mod:`splitkv_bench.output` (the JSON and Markdown results); every result carries
``splitkv_common.provenance``. torch, triton and torch_npu are imported by the subcommands that
need them, when they run. The suite imports only the public APIs of the packages
(``tests/test_import_rules.py``).
"""

#: Subcommand -> (module in this package, what it measures or checks, where it runs).
COMMANDS = {
    "decode": ("decode", "ours against SDPA (cuDNN, flash) and Flex over a sweep of points", "CUDA GPU"),
    "perf-check": ("perf_check", "kernel variants at the key points under each L2 flush", "CUDA GPU"),
    "serving": ("serving", "a continuous-batching trace, step by step", "CUDA GPU or CPU"),
    "ragged": ("ragged", "one ragged batch every way the wrapper can run it", "CUDA GPU"),
    "config-grid": ("config_grid", "stage-1 configurations at any point against the default", "CUDA GPU"),
    "kernels-ab": ("kernels_ab", "this tree's kernels against another kernels.py, interleaved", "CUDA GPU"),
    "eager-ab": ("eager_ab", "eager DecodeWrapper.run() host time against another tree", "CUDA GPU or CPU"),
    "read-floor": ("read_floor", "the method's floor: an empty kernel, a bare read of the KV", "CUDA GPU"),
    "context-parallel": ("context_parallel", "one request over 1 vs N GPUs (NCCL), or gloo", "CUDA GPUs or CPU"),
    "plan": ("plan", "the split planner's time per decode step", "CPU"),
    "shared-prefix": ("shared_prefix", "shared-prefix decode against the plain step; the planner's choice",
                      "CUDA GPU, or CPU (cost model)"),
    "gpu-check": ("gpu_check", "the Triton backend's correctness: catalog, graph replay, invariance", "CUDA GPU"),
    "compile-check": ("compile_check", "the Triton kernels compiled for sm_90: pipelining, registers", "CPU"),
    "lower-triton-ascend": ("lower_triton_ascend", "every Triton kernel variant lowered for Ascend 910B", "CPU"),
    "npu": ("npu", "our Ascend operator against CANN's FIA and ATB's PagedAttention", "Ascend NPU"),
    "npu-graph-check": ("npu_graph_check", "aclgraph capture and replay of the Ascend operator", "Ascend NPU"),
    "npu-estimate": ("npu_estimate", "a paper estimate of the Ascend kernels' time (CPU twin counters)", "CPU"),
}
