"""`unfoldformer.descent`: what "does not rise" means, and the descent counts of evaluations."""
import numpy as np
import torch

from unfoldformer.descent import DescentCounts, lowered, share_lowered


def test_lowered_allows_round_off_only():
    before = torch.tensor([1.0, 1.0, -5.0], dtype=torch.float64)
    after = torch.tensor([1.0 + 1e-7, 1.0 + 3e-6, -5.0 + 5e-6], dtype=torch.float64)
    assert lowered(before, after, 1e-6).tolist() == [True, False, True]    # allowance 1e-6·(1 + |E|)
    assert share_lowered(before, after, 1e-6) == 2 / 3
    assert share_lowered(before.numpy(), after.numpy(), 1e-6) == 2 / 3     # numpy arrays alike


def test_descent_counts_add_up_and_merge():
    E = torch.tensor([[3.0, 2.0, 1.0], [3.0, 3.5, 1.0], [1.0, 1.0, 1.0]], dtype=torch.float64)   # (B, T+1)
    scales = torch.tensor([[1.0, 1.0], [0.5, 1.0], [1.0, 0.0]])
    c = DescentCounts()
    c.add(E, E[:, :-1], E[:, 1:], scales, 1e-6)
    assert (c.samples, c.monotone, c.monotone_strict, c.layers_descend) == (3, 2, 2, 2)
    assert (c.layer_steps, c.backtracked_steps) == (6, 2)
    both = c.merge(c)
    assert both.samples == 6 and both.backtracked_steps == 4
    assert {k: v for k, v in both.shares().items() if k != "samples"} == \
        {k: v for k, v in c.shares().items() if k != "samples"}
    assert np.isclose(c.shares()["backtracked_layer_share"], 2 / 6)
