"""The device check (benchmarks/device_check.py): its order tags, and a whole run on CPU (gloo).

On a GPU machine the same script runs with ``--device cuda`` (NCCL); here it checks, in a
subprocess of its own (a real process group must not meet the fake ones of other tests), that
the CPU path reports every check true for a schedule that buckets.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
import torch.fx as fx

from fxsched.benchmarks.device_check import code_order, graph_order

WRAPPER = '''
def call(args):
    arg0_1, arg1_1 = args
    buf0 = torch.ops._c10d_functional.all_gather_into_tensor.default(arg0_1, 2, '0')
    buf1 = empty_strided_cpu((4, 4), (4, 1), torch.float32)
    extern_kernels.mm(arg1_1, arg1_1, out=buf1)
    torch.ops._c10d_functional.wait_tensor.default(buf0)
    torch.ops._c10d_functional.all_reduce_.default(buf1, 'sum', '0')
    extern_kernels.addmm(buf1, buf1, buf1, alpha=1, beta=1, out=buf2)
    return (buf0, )
'''


def test_code_order_tags_the_wrapper_calls_in_order() -> None:
    """Two collectives, a wait and two matmuls (mm, addmm) in the wrapper's ``call``; the in-place
    ``all_reduce_`` that Inductor emits is tagged as the functional ``all_reduce`` of the graph."""
    assert code_order(WRAPPER) == ["all_gather_into_tensor", "mm", "wait_tensor", "all_reduce", "mm"]


def test_graph_order_tags_aten_matmuls_and_collectives_only() -> None:
    """A graph mm -> tanh -> all_reduce -> wait -> addmm: the tanh is left out."""
    g = fx.Graph()
    x = g.placeholder("x")
    mm = g.call_function(torch.ops.aten.mm.default, (x, x))
    t = g.call_function(torch.ops.aten.tanh.default, (mm,))
    ar = g.call_function(torch.ops._c10d_functional.all_reduce.default, (t, "sum", "0"))
    w = g.call_function(torch.ops._c10d_functional.wait_tensor.default, (ar,))
    out = g.call_function(torch.ops.aten.addmm.default, (w, w, w))
    g.output(out)
    assert graph_order(fx.GraphModule({}, g)) == ["mm", "all_reduce", "wait_tensor", "mm"]


def test_cpu_run_keeps_the_scheduled_order(tmp_path: Path) -> None:
    """3 layers on gloo: the schedule buckets (priced as 8 ranks), the scheduled graph lints, its
    Inductor build matches eager and keeps the scheduled order of collectives, waits and matmuls."""
    out = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "fxsched.benchmarks.device_check", "--device", "cpu",
                           "--layers", "3", "--budget", "1", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    report = json.loads(out.read_text())
    assert report["ok"] and all(report["checks"].values())
    assert report["solve"]["buckets"] >= 1 and report["solve"]["control_deps"] > 0
    assert report["order"]["inductor"] == report["order"]["scheduled"]
    assert report["order"]["scheduled"].count("mm") == 2 * 3  # h @ w and h^T h per layer
