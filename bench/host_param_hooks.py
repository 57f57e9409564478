"""Host time per weight tensor that Megatron-Core's DDP and Transformer Engine add to an eager step.

Runs on any CPU with PyTorch (`pip install -e '.[test]'`; no GPU): `python bench/host_param_hooks.py [OUT.json]`.
The code paths timed are PyTorch's and Megatron-Core's own Python, rebuilt here step for step because
neither needs a GPU to run them (core_v0.15.0 distributed_data_parallel.py; TransformerEngine v2.9
module/grouped_linear.py `handle_custom_ddp_from_mcore`):

* backward, per weight: Transformer Engine accumulates the weight gradient into `main_grad` inside its
  GEMM and hands autograd a dummy gradient (`torch.empty` of the weight's shape, after setting
  `grad_added_to_main_grad`); autograd's AccumulateGrad node stores it and runs the hook Megatron's DDP
  registers on that node (`_make_backward_post_hook`), which drops the dummy and tells the bucket group the
  gradient is ready. Timed: a grouped module of N weights returning dummies and hooked as DDP hooks them,
  minus the same module returning no weight gradients, over N.
* forward, per weight: with the distributed optimizer and `overlap_param_gather`, DDP's forward pre-hook on
  each module walks the module's own parameters and calls `finish_param_sync` on each one's bucket group
  (after the first micro-batch, nothing to wait for). Timed: the module with the hook minus without, over N.

The result is CPU time on this machine; it prints torch.empty and an elementwise add from Python beside it,
which the H100 machines measured at 4.4-4.9 us and 9.9-10.2 us through CUDA (validation/
kernels_measured_h100.json `host_runs`), to compare the two hosts.
"""

from __future__ import annotations

import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch


class GroupedWeights(torch.autograd.Function):
    """A grouped linear's autograd shape: one input, N weights; backward returns TE's dummy wgrads."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, dummies: bool, *weights: torch.nn.Parameter) -> torch.Tensor:
        ctx.weights, ctx.dummies = weights, dummies
        return x.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        wgrads = []
        for w in ctx.weights:
            if ctx.dummies and hasattr(w, "grad_added_to_main_grad"):
                w.grad_added_to_main_grad = True
                wgrads.append(torch.empty(w.main_grad.shape, dtype=w.dtype, device=w.device, requires_grad=False))
            else:
                wgrads.append(None)
        return (grad, None, *wgrads)


class BucketGroup:
    """The parts of Megatron-Core's bucket group that the hooks touch between micro-batches."""

    def __init__(self) -> None:
        self.is_last_microbatch = False
        self.param_gather_dispatched = True
        self.param_gather_handle = None
        self.params_with_grad: set = set()

    def register_grad_ready(self, param: torch.nn.Parameter) -> None:
        if self.is_last_microbatch:
            self.params_with_grad.add(param)

    def finish_param_sync(self, skip_next_bucket_dispatch: bool = False) -> None:
        if not self.param_gather_dispatched:
            raise RuntimeError("not reached after the first micro-batch")
        if self.param_gather_handle is not None:
            self.param_gather_handle.wait()


class Grouped(torch.nn.Module):
    def __init__(self, n: int, dummies: bool) -> None:
        super().__init__()
        self.dummies = dummies
        for i in range(n):
            w = torch.nn.Parameter(torch.zeros(8, 8))
            w.main_grad = torch.zeros(8, 8)
            w.grad_added_to_main_grad = False
            self.register_parameter(f"weight{i}", w)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return GroupedWeights.apply(x, self.dummies, *self.parameters())


def ddp_wrap(module: torch.nn.Module, backward_hooks: bool, forward_hooks: bool) -> list:
    """Register Megatron-Core DDP's hooks (core_v0.15.0) on `module`; returns what must stay alive."""
    groups = {p: BucketGroup() for p in module.parameters()}
    keep = []
    if backward_hooks:
        for param in module.parameters():

            def hook(*unused, param=param):
                if param in groups:
                    assert param.requires_grad
                    assert param.grad is not None
                    if param.grad is not None and (
                        not param.grad_added_to_main_grad or getattr(param, "zero_out_wgrad", False)
                    ):
                        param.main_grad.add_(param.grad.data)
                    param.grad = None
                    groups[param].register_grad_ready(param)

            grad_acc = param.expand_as(param).grad_fn.next_functions[0][0]
            grad_acc.register_hook(hook)
            keep.append(grad_acc)
    if forward_hooks:

        def pre_hook(mod, *unused):
            for param in mod.parameters(recurse=False):
                if param not in groups:
                    continue
                assert param.requires_grad
                groups[param].finish_param_sync(skip_next_bucket_dispatch=False)

        keep.append(module.register_forward_pre_hook(pre_hook))
    return keep


def time_steps_s(modules: list[torch.nn.Module], reps: int = 100, rounds: int = 40) -> list[float]:
    """Per module, the fastest over `rounds` of the mean of `reps` forward + backward steps. The modules
    take turns within each round, so a slow spell of the machine hits them alike; the minimum keeps other
    processes' interruptions out."""
    x = torch.zeros(8, requires_grad=True)
    for module in modules:
        for _ in range(50):
            module(x).sum().backward()
    best = [float("inf")] * len(modules)
    for _ in range(rounds):
        for i, module in enumerate(modules):
            t0 = time.perf_counter()
            for _ in range(reps):
                module(x).sum().backward()
            best[i] = min(best[i], (time.perf_counter() - t0) / reps)
    return best


def per_call_s(fn, reps: int = 5000, rounds: int = 25) -> float:
    for _ in range(1000):
        fn()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - t0) / reps)
    return best


def cpu_name() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def slope(xs: tuple[int, ...], ys: list[float]) -> float:
    """Least-squares slope of ys over xs."""
    return statistics.linear_regression(xs, ys).slope


def main(sizes: tuple[int, ...] = (4, 16, 64)) -> dict[str, float]:
    """Per-weight costs as slopes over module sizes (what a module costs once drops out)."""
    torch.set_num_threads(1)
    modules: list[torch.nn.Module] = []
    keep: list = []
    for n in sizes:
        hooked, both = Grouped(n, dummies=True), Grouped(n, dummies=True)
        keep += ddp_wrap(hooked, backward_hooks=True, forward_hooks=False)
        keep += ddp_wrap(both, backward_hooks=True, forward_hooks=True)
        modules += [Grouped(n, dummies=False), hooked, both]
    times = time_steps_s(modules)
    plain, backward, forward = times[0::3], times[1::3], times[2::3]
    a = torch.zeros(4)
    return {
        "backward_per_weight_us": (slope(sizes, backward) - slope(sizes, plain)) * 1e6,
        "forward_pre_hook_per_weight_us": (slope(sizes, forward) - slope(sizes, backward)) * 1e6,
        "torch_empty_us": per_call_s(lambda: torch.empty((8, 8))) * 1e6,
        "add_us": per_call_s(lambda: a.add(1)) * 1e6,
    }


if __name__ == "__main__":
    # python bench/host_param_hooks.py [OUT.json]: print one run; with OUT, append it to OUT's "runs"
    run = main()
    for key, value in run.items():
        print(f"{key:32s} {value:8.2f}")
    if len(sys.argv) > 1:
        out = Path(sys.argv[1])
        data = json.loads(out.read_text()) if out.exists() else {"runs": []}
        data["torch"] = torch.__version__
        data["python"] = platform.python_version()
        data["cpu"] = cpu_name()
        data["runs"].append({k: round(v, 3) for k, v in run.items()})
        out.write_text(json.dumps(data, indent=1) + "\n")
