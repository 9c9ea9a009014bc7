#!/usr/bin/env bash
# Checks and timings of the Triton kernels on one CUDA GPU (the H200 runs of docs/perf-notes.md),
# step by step into OUTDIR; every step runs even if an earlier one failed, the exit status says
# whether all passed.
#
#   scripts/gpu_checks.sh OUTDIR perf ncu check bench hostile overhead
#
#   perf   splitkv_bench/perf_check.py: variants at the key points under both L2 flushes
#   ncu    Nsight Compute: each kernel's own duration and DRAM bytes at B1 x 16k and B64 x 2k
#   check  correctness in parallel processes: the whole catalog through the harness (separate and
#          fused merge), every case in CUDA-graph replay with new lengths, bitwise batch invariance,
#          compute-sanitizer memcheck on a representative subset
#   bench  splitkv_bench/decode.py: the full sweep (JSON, markdown table, PNG)
#   hostile  splitkv_bench/gpu_check.py --hostile under compute-sanitizer memcheck: out-of-range page ids,
#          huge lengths, corrupt plans, strided indices (expect "ERROR SUMMARY: 0 errors", exit 0)
#   overhead splitkv_bench/perf_check.py --overhead: the cost of the always-on checks at B1x16k and
#          B64x2k (OUTDIR/overhead/overhead.json; target at most 1 % of the decode time)
#   floor    splitkv_bench/read_floor.py: the method's floor (an empty kernel, a bare read of each
#          point's KV bytes) beside ours and cuDNN at the batch-1 and one-item-an-SM points (OUTDIR/floor)
#   keypoints  the key points (read flush) with the default, stage 1 alone and a few stage-1
#          configurations only (OUTDIR/keypoints)
#   before   with KERNELS_BEFORE=FILE (another version of cuda_ref/kernels.py, e.g. from
#          `git show REV:cuda_ref/kernels.py`): the overhead step and the key points' default with those
#          kernels, for a before / after in the same run (OUTDIR/before_overhead, OUTDIR/before_keypoints);
#          the file must take the current launch's parameters (MIXED_TILES since run 12)
set -u
out=${1:?usage: gpu_checks.sh OUTDIR STEP...}
shift
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$out/install.log" 2>&1 || export PYTHONPATH=$PWD
status=0
keypoints="B1x2k,B1x4k,B1x16k,B1x128k,B16x8k,B64x2k,B128x1k"
memcheck_cases="seed/worked-example,mask/sliding-window,int8/per-channel-offset,empty/some-rows,multi-query/ragged,head-dim/96,policy/count-7,paging/page-size-1"

for step in "$@"; do
  start=$(date +%s)
  case $step in
    perf)
      python3 -m splitkv_bench perf-check --out "$out/perf" --iters 15 \
          --points B1x16k,B1x128k,B64x2k,B1x64k,B128x1k,B16x8k,B1x4k 2>&1 | tee "$out/perf.log" || status=1 ;;
    ncu)
      ncu --clock-control none --cache-control all -k 'regex:split_kv|merge|sdpa|flash|fmha|cudnn' \
          --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv \
          python3 -m splitkv_bench perf-check --eager-once B1x16k,B64x2k >"$out/ncu.csv" 2>"$out/ncu.err" || status=1
      tail -n 30 "$out/ncu.csv" ;;
    check)
      mkdir -p "$out/check"
      pids=()
      for i in 0 1 2 3 4 5 6 7; do
        python3 -m splitkv_bench gpu-check --out "$out/check" --shard "$i/8" --no-invariance >"$out/check/shard_$i.log" 2>&1 &
        pids+=($!)
      done
      python3 -m splitkv_bench gpu-check --out "$out/check" --no-parity --no-graph >"$out/check/invariance.log" 2>&1 &
      pids+=($!)
      compute-sanitizer --tool memcheck --error-exitcode 3 python3 -m splitkv_bench gpu-check --out "$out/check/mc" \
          --quick --cases "$memcheck_cases" >"$out/check/memcheck.log" 2>&1 &
      pids+=($!)
      compute-sanitizer --tool memcheck --error-exitcode 3 python3 -m splitkv_bench gpu-check --out "$out/check/hostile" \
          --hostile >"$out/check/memcheck_hostile.log" 2>&1 &
      pids+=($!)
      for p in "${pids[@]}"; do wait "$p" || status=1; done
      grep -h -E "FAIL|ERROR|ok=|bitwise|passed|Exit|errors" "$out"/check/*.log | sort | uniq -c | head -60 ;;
    bench)
      python3 -m splitkv_bench decode --out "$out/bench" --iters 12 --also-flush write \
          --partial "$out/bench/partial.json" 2>&1 \
          | tee "$out/bench.log" | grep -v '%|' || status=1 ;;
    hostile)
      mkdir -p "$out/hostile"
      compute-sanitizer --tool memcheck --error-exitcode 3 python3 -m splitkv_bench gpu-check --out "$out/hostile" \
          --hostile >"$out/hostile/memcheck.log" 2>&1 || status=1
      grep -E "hostile|ERROR SUMMARY|Error" "$out/hostile/memcheck.log" | tail -n 45 ;;
    overhead)
      python3 -m splitkv_bench perf-check --out "$out/overhead" --overhead B1x16k,B64x2k --iters 30 --flush read \
          2>&1 | tee "$out/overhead.log" || status=1 ;;
    floor)
      python3 -m splitkv_bench read-floor --out "$out/floor" --points B1x1k,B1x2k,B1x4k,B1x16k,B1x128k,B16x1k \
          >"$out/floor.log" 2>&1 || status=1
      tail -n 12 "$out/floor/read_floor.md" ;;
    keypoints)
      python3 -m splitkv_bench perf-check --out "$out/keypoints" --iters 15 --flush read --points "$keypoints" \
          --variants "default,stage 1 alone,n64w4s5,n64w4s7,n32w4s5,n32w4s7" 2>&1 | tee "$out/keypoints.log" || status=1 ;;
    before)
      python3 -m splitkv_bench perf-check --out "$out/before_overhead" --overhead B1x16k,B64x2k --iters 30 \
          --flush read --kernels-from "${KERNELS_BEFORE:?set KERNELS_BEFORE}" 2>&1 | tee "$out/before_overhead.log" || status=1
      python3 -m splitkv_bench perf-check --out "$out/before_keypoints" --iters 15 --flush read --points "$keypoints" \
          --variants "default,stage 1 alone" --kernels-from "$KERNELS_BEFORE" 2>&1 | tee "$out/before_keypoints.log" \
          || status=1 ;;
    *) echo "unknown step $step" >&2; status=2 ;;
  esac
  echo "== $step done in $(( $(date +%s) - start )) s (status so far $status)"
done
exit $status
