"""The split plan's public names, from the modules that define them (kept so that
``from splitkv_common.plan import ...`` keeps working):

* :mod:`~splitkv_common.plan_layout`: :class:`Plan` (the data: work items ``[W]``, partial slots)
  and :func:`visible_range`;
* :mod:`~splitkv_common.policies`: :class:`SplitPolicy` and the ``auto`` cost model (:func:`npu_auto`);
* :mod:`~splitkv_common.graph_shapes`: :func:`graph_capacity`, a graph-stable plan's work items;
* :mod:`~splitkv_common.planner`: :func:`make_plan`;
* :mod:`~splitkv_common.plan_checks`: the planner's checks (:func:`check_plan_limits`,
  :func:`validate_plan`);
* :mod:`~splitkv_common.plan_spec`: :class:`PlanSpec`, :class:`NativePlanner`, :class:`PlannedWrapper`.

New code imports from those modules.
"""

from .graph_shapes import graph_capacity
from .plan_checks import check_plan_limits, validate_plan
from .plan_layout import Plan, visible_range
from .plan_spec import NativePlanner, PlannedWrapper, PlanSpec, query_rows_arg
from .planner import make_plan
from .policies import POLICIES, SplitPolicy, npu_auto

__all__ = ["POLICIES", "NativePlanner", "Plan", "PlanSpec", "PlannedWrapper", "SplitPolicy", "check_plan_limits",
           "graph_capacity", "make_plan", "npu_auto", "query_rows_arg", "validate_plan", "visible_range"]
