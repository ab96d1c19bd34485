"""Threads: OpenMP's wait policy is left alone in either import order, and the library's calls run at the free
cores' thread count (src/unfoldformer/threads.py; docs/results/speed.md, "Threads")."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = "import os, sys\n{first}\nprint(os.environ.get('OMP_WAIT_POLICY'))"


def _policy(first: str, env_policy: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if env_policy is not None:
        env["OMP_WAIT_POLICY"] = env_policy
    out = subprocess.run([sys.executable, "-c", PROBE.format(first=first)], env=env, capture_output=True,
                         text=True, check=True)
    return out.stdout.strip()


@pytest.mark.parametrize("first", ["import unfoldformer, torch", "import torch, unfoldformer"])
@pytest.mark.parametrize("env_policy", [None, "ACTIVE", "PASSIVE"])
def test_the_wait_policy_is_the_users_in_either_import_order(first, env_policy):
    # no import-order trap: importing unfoldformer first (as the command line does) must not change what OpenMP
    # reads when torch starts, so both orders run the same runtime settings
    assert _policy(first, env_policy) == str(env_policy)


# ----------------------------------------------------------------------------- threads for the free cores
@pytest.fixture
def fake_load(monkeypatch):
    """`threads._counters` replaced by a clock the test advances: `load(others, own)` adds one window in which
    other processes kept `others` cores busy and this process `own` cores, on 2 allowed CPUs."""
    import torch

    from unfoldformer import threads
    threads.set_policy("free-cores")
    monkeypatch.setattr(threads, "_cpus", lambda: {0, 1})
    clock = {"t": 0.0, "busy": 0, "total": 0, "own": 0}

    def counters():
        return clock["t"], clock["busy"], clock["total"], clock["own"]

    def load(others: float, own: float, window: float = 1.0):
        ticks = 100 * window                                        # USER_HZ per CPU
        clock["t"] += window
        clock["busy"] += round((others + own) * ticks)
        clock["total"] += round(2 * ticks)
        clock["own"] += round(own * ticks)

    monkeypatch.setattr(threads, "_counters", counters)
    monkeypatch.setattr(threads, "_clock", lambda: clock["t"])
    monkeypatch.setattr(threads, "_STATE", threads._State())
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    threads.free_cores()                                            # the first sample
    yield load
    torch.set_num_threads(before)


def test_calls_run_at_the_free_cores_and_restore_the_callers_count(fake_load):
    import torch

    from unfoldformer import threads
    fake_load(others=1.0, own=1.0)                                  # one core busy with another process
    with threads.free_core_threads() as inside:
        assert inside == 1 and torch.get_num_threads() == 1
        with threads.free_core_threads() as nested:                 # nested: nothing changes
            assert nested == 1
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2                             # the caller's count, restored
    fake_load(others=0.0, own=1.0)                                  # idle: the caller's 2
    with threads.free_core_threads() as inside:
        assert inside == 2
    fake_load(others=0.3, own=1.7)                                  # a little background work: still 2
    with threads.free_core_threads() as inside:
        assert inside == 2
    torch.set_num_threads(1)                                        # the caller asks for 1: never raised
    fake_load(others=0.0, own=1.0)
    with threads.free_core_threads() as inside:
        assert inside == 1
    assert torch.get_num_threads() == 1
    torch.set_num_threads(2)
    fake_load(others=2.0, own=0.0)                                  # every core busy: at least 1 thread
    with pytest.raises(RuntimeError, match="inside"):               # restored on an exception too
        with threads.free_core_threads() as inside:
            assert inside == 1
            raise RuntimeError("inside")
    assert torch.get_num_threads() == 2


def test_the_fixed_policy_and_a_missing_proc_leave_the_count_alone(fake_load, monkeypatch):
    import torch

    from unfoldformer import threads
    fake_load(others=1.0, own=1.0)
    threads.set_policy("fixed")
    with threads.free_core_threads() as inside:
        assert inside == 2 and torch.get_num_threads() == 2
    threads.set_policy("free-cores")
    monkeypatch.setattr(threads, "_counters", lambda: None)         # not Linux, or /proc unreadable
    monkeypatch.setattr(threads, "_STATE", threads._State())
    with threads.free_core_threads() as inside:
        assert inside == 2
    with pytest.raises(ValueError, match="unknown thread policy 'sometimes'"):
        threads.set_policy("sometimes")


def test_a_forward_runs_at_the_free_cores_and_the_environment_can_fix_the_count():
    """A real busy process on every other core beside forwards at 2 threads: the forward runs at 1 thread
    (read from /proc; recorded inside the joint stack's step) and the caller's 2 are back afterwards; with
    UNFOLDFORMER_THREADS=fixed the forward runs at 2. Skipped without /proc or with fewer than 2 allowed CPUs."""
    if not os.path.exists("/proc/stat") or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs /proc and 2 CPUs")
    probe = ("import time, torch, subprocess, sys\n"
             "import unfoldformer as uf\n"
             "torch.set_num_threads(2)\n"
             "busy = [subprocess.Popen([sys.executable, '-c', 'while True: pass']) for _ in range(NBUSY)]\n"
             "enc = uf.CertifiedEncoder(uf.CertifiedEncoderLayer(8, 2, 16), 2)\n"
             "seen = []\n"
             "trial = uf.joint.JointStack.trial\n"
             "def recorded(*a, **k):\n"
             "    seen.append(torch.get_num_threads())\n"
             "    return trial(*a, **k)\n"
             "uf.joint.JointStack.trial = recorded\n"
             "try:\n"
             "    for _ in range(6):\n"
             "        enc(torch.randn(2, 4, 8), return_energies=True); time.sleep(0.3)\n"
             "finally:\n"
             "    [b.kill() for b in busy]\n"
             "print(seen[-1] if seen else 'no-hook', torch.get_num_threads())\n")
    cpus = len(os.sched_getaffinity(0))
    for env_value, expected in ((None, "1 2"), ("fixed", "2 2")):
        env = {k: v for k, v in os.environ.items() if k != "UNFOLDFORMER_THREADS"}
        if env_value is not None:
            env["UNFOLDFORMER_THREADS"] = env_value
        out = subprocess.run([sys.executable, "-c", probe.replace("NBUSY", str(cpus - 1))], env=env,
                             capture_output=True, text=True, check=True, timeout=120)
        assert out.stdout.strip() == expected


def test_the_backward_pass_runs_at_the_forwards_count_and_the_callers_count_comes_back(fake_load):
    """One core busy with another process: the forward runs at 1 thread, and so does the backward through its
    output (recorded by a hook on the input's gradient, which runs after the model's backward); the caller's 2
    threads are back once the backward pass ends, and the gradients equal those of a forward and backward at the
    caller's count (float64: the thread count changes no arithmetic of these small products)."""
    import torch

    import unfoldformer as uf
    torch.manual_seed(0)
    enc = uf.CertifiedEncoder(uf.CertifiedEncoderLayer(8, 2, 16), 2).double()
    x = torch.randn(3, 5, 8, dtype=torch.float64, requires_grad=True)
    seen = []
    x.register_hook(lambda g: seen.append(torch.get_num_threads()))
    fake_load(others=1.0, own=1.0)
    out = enc(x)
    assert torch.get_num_threads() == 2                             # the forward gave the count back
    out.square().sum().backward()
    assert seen == [1] and torch.get_num_threads() == 2
    grad_lowered = x.grad.clone()
    x.grad = None
    fake_load(others=0.0, own=1.0)                                  # idle: nothing lowered
    enc(x).square().sum().backward()
    assert seen == [1, 2] and torch.get_num_threads() == 2
    assert torch.allclose(x.grad, grad_lowered, rtol=1e-12, atol=1e-12)
    fake_load(others=1.0, own=1.0)
    with torch.no_grad():                                           # no graph: no hook, nothing changes
        enc(x)
    assert torch.get_num_threads() == 2


def test_the_encoders_norm_runs_at_the_stacks_count_forward_and_backward(fake_load):
    """`CertifiedEncoder(norm=...)`: the final norm is part of the library's call, so beside a busy process it runs at
    the lowered count in the forward and in the backward (a parallel region at the caller's count between two
    lowered ones would wait for the shared core); the caller's 2 threads are back after each."""
    import torch
    from torch import nn

    import unfoldformer as uf

    class Probe(torch.autograd.Function):                           # the identity; records the count in backward
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            seen.append(("backward", torch.get_num_threads()))
            return g

    class Recorded(nn.LayerNorm):
        def forward(self, x):
            seen.append(("forward", torch.get_num_threads()))
            return Probe.apply(super().forward(x))                  # its backward runs first, then the norm's

    seen = []
    torch.manual_seed(0)
    enc = uf.CertifiedEncoder(uf.CertifiedEncoderLayer(8, 2, 16), 2, norm=Recorded(8))
    x = torch.randn(3, 5, 8, requires_grad=True)
    fake_load(others=1.0, own=1.0)                                  # one core busy with another process
    out = enc(x)
    assert seen == [("forward", 1)] and torch.get_num_threads() == 2
    out.square().sum().backward()
    assert seen == [("forward", 1), ("backward", 1)] and torch.get_num_threads() == 2
    fake_load(others=0.0, own=1.0)                                  # idle: the caller's count throughout
    enc(x).square().sum().backward()
    assert seen[2:] == [("forward", 2), ("backward", 2)] and torch.get_num_threads() == 2


def test_a_layer_stepping_towards_a_given_anchor_runs_at_the_free_cores(fake_load):
    """`CertifiedEncoderLayer(src, anchor=X)` (a layer inside the user's own stack) runs its step at the lowered count
    beside a busy process, as a stack does, and gives the caller's 2 threads back."""
    import torch

    import unfoldformer as uf
    torch.manual_seed(0)
    layer = uf.CertifiedEncoderLayer(8, 2, 16)
    seen = []
    layer.layer.register_forward_pre_hook(lambda module, args: seen.append(torch.get_num_threads()))
    x = torch.randn(3, 5, 8)
    fake_load(others=1.0, own=1.0)                                  # one core busy with another process
    layer(x, anchor=x)
    assert seen == [1] and torch.get_num_threads() == 2
    fake_load(others=0.0, own=1.0)                                  # idle: the caller's count
    layer(x, anchor=x)
    assert seen == [1, 2] and torch.get_num_threads() == 2


def test_a_backward_pass_that_raises_gives_the_count_back_at_the_next_library_call(fake_load):
    """The queued restoring call runs only when the pass ends normally; after a pass that raised, the next call of
    the library (here a forward, idle) restores the caller's 2 before it does anything else."""
    import torch

    import unfoldformer as uf
    torch.manual_seed(0)
    enc = uf.CertifiedEncoder(uf.CertifiedEncoderLayer(8, 2, 16), 2).double()
    x = torch.randn(2, 4, 8, dtype=torch.float64, requires_grad=True)

    def fail(grad):
        raise RuntimeError("inside the backward pass")
    x.register_hook(fail)
    fake_load(others=1.0, own=1.0)
    out = enc(x)
    with pytest.raises(RuntimeError, match="inside the backward pass"):
        out.sum().backward()
    assert torch.get_num_threads() == 1                             # the pass raised before its end
    fake_load(others=0.0, own=1.0)
    with torch.no_grad():
        enc(x)
    assert torch.get_num_threads() == 2


@pytest.mark.parametrize("app", ["lm", "classifier"])
def test_the_training_loops_whole_step_runs_at_the_free_cores(fake_load, app, tmp_path, sst2_dir):
    """The library's own training loops (`unfoldformer lm train`, `unfoldformer train`) run the loss, the backward
    pass and the optimiser step at the free cores' count too, not only the model's forward: beside a busy process
    a parallel region at the caller's 2 threads would stall on the shared core. Idle, the step runs at 2."""
    import torch

    from unfoldformer.cli import main
    seen = []
    from torch.optim.optimizer import register_optimizer_step_pre_hook
    hook = register_optimizer_step_pre_hook(lambda opt, *_: seen.append(torch.get_num_threads()))
    try:
        for others, expected in ((1.0, 1), (0.0, 2)):
            fake_load(others=others, own=1.0)
            seen.clear()
            out = tmp_path / f"{app}-{others}"
            if app == "lm":
                data = tmp_path / "text.txt"
                data.write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n" * 12)
                argv = ["lm", "train", "--out", str(out), "--data", str(data), "--iters", "3", "--no-progress",
                        "--layers", "1", "--heads", "2", "--width", "16", "--context", "8", "--batch", "4",
                        "--warmup", "1", "--eval-interval", "3"]
                assert main(argv) == 0
            else:
                from conftest import SMALL_TRAIN
                from unfoldformer.train import TrainConfig, train
                train(TrainConfig().with_overrides([*SMALL_TRAIN, "--run.threads", "2",   # the caller's 2 threads
                                                    "--data.data_dir", str(sst2_dir), "--run.out_dir", str(out)]))
            assert seen and set(seen) == {expected}, (others, seen)
            assert torch.get_num_threads() == 2                     # the caller's count after the run
    finally:
        hook.remove()
