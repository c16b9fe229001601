"""Graph zoo: real post-grad ATen FX graphs of Llama-style training steps.

Built on CPU with a fake process group (no GPU needed); the FakeTensor metadata is
retargeted to CUDA. Entry points: :func:`build_graphs` (any :class:`ZooConfig`),
:data:`ZOO` (named configs) and :func:`build` (by name). A build leaves the fake process
group of its config alive (group names in the graphs resolve through c10d);
:func:`activate_groups` re-creates the groups of an earlier config and
:func:`release_process_group` destroys the fake group.
"""

from .config import PARALLELISMS, GroupInfo, ZooConfig, ZooGraph
from .llama import ParamSpec, param_specs
from .registry import ZOO, build, problems
from .tracing import COLLECTIVE_OPS, activate_groups, build_graphs, release_process_group

__all__ = [
    "COLLECTIVE_OPS",
    "PARALLELISMS",
    "GroupInfo",
    "ParamSpec",
    "ZOO",
    "ZooConfig",
    "ZooGraph",
    "activate_groups",
    "build",
    "build_graphs",
    "param_specs",
    "problems",
    "release_process_group",
]
