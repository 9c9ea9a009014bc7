"""The node day: one command that turns the first hour on an Ascend 910B node into a verdict.

``scripts/npu_node_day.sh`` (``python -m ascend_ops.node_day``) runs, in order: 1 identify, 2 build
(each route), 3 smoke (one feature at a time, each launch under a watchdog), 4 determinism and races,
5 parity, 6 latency and bandwidth probes (and a constants file for the cost model), 7 timing; each
stage stops at its first failure and the report is written after every step. ``--twin`` runs
stages 1, 3-6 on the CPU twin (nothing on an NPU; its times are meaningless). ``docs/npu.md``,
"Node day", says what each stage does and what to do when one fails.

Modules: :mod:`.cli` (arguments, the stages in order), :mod:`.report` (report.json / report.md,
the schema check), :mod:`.watchdog` (child processes with a time limit, device logs), :mod:`.child`
(what a child runs), :mod:`.identify`, :mod:`.smoke`, :mod:`.probes`, :mod:`.constants_file`.
"""
