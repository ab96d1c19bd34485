"""The OpenMP wait policy unfoldformer chooses (src/unfoldformer/__init__.py; docs/results/speed.md, "Threads")."""
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


@pytest.mark.parametrize("first, env_policy, expected", [
    ("import unfoldformer", None, "PASSIVE"),              # imported before torch: workers sleep when idle
    ("import unfoldformer", "ACTIVE", "ACTIVE"),           # the user's choice stands
    ("import torch, unfoldformer", None, "None"),          # too late for OpenMP: left unset, not pretended
])
def test_the_wait_policy_is_passive_unless_chosen_or_too_late(first, env_policy, expected):
    assert _policy(first, env_policy) == expected
