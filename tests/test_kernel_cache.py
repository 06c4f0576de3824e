"""nmt.training.kernel_cache: training keeps oneDNN's compiled kernels for the shapes of more than ~40 updates (a
kernel compiled before 1,284 other shapes is still there), a user's own setting wins, and the trainer asks before
its first product."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nmt.training.kernel_cache import CAPACITY_ENV, TRAINING_CAPACITY, keep_compiled_kernels
from nmt.training.trainer import Trainer
from tests.conftest import tiny_config

ROOT = Path(__file__).resolve().parents[1]

# One bf16 product of shape A, 1,284 products of other shapes (oneDNN keeps 1,024 by default; torch sends a product
# to oneDNN from 16 x 16 x 16 multiply-adds on, hence rows from 17), then A again: oneDNN's verbose mode says whether
# A's kernel was found ("create:cache_hit") or compiled again ("create:cache_miss").
PROBE = """
import sys
from nmt.training.kernel_cache import keep_compiled_kernels
if sys.argv[1] == "keep":
    keep_compiled_kernels()
import torch
torch.set_num_threads(1)
w = torch.randn(16, 16, dtype=torch.bfloat16)
def product(rows):
    torch.mm(torch.ones(rows, 16, dtype=torch.bfloat16), w)
product(5000)
for rows in range(17, 1301):
    product(rows)
print("AGAIN", flush=True)
product(5000)
"""


def creation_of_repeated_shape(mode: str) -> str | None:
    env = {k: v for k, v in os.environ.items() if k != CAPACITY_ENV}
    env.update(ONEDNN_VERBOSE="profile_create", PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode], env=env, capture_output=True, text=True, timeout=120, check=True
    ).stdout
    after = out.split("AGAIN", 1)[1]
    for line in after.splitlines():
        if ",primitive,create:" in line and ",matmul," in line:
            return line.split(",")[3]  # create:cache_hit or create:cache_miss
    return None  # this CPU's bf16 products do not run on oneDNN's matmul: nothing to keep


def test_a_kernel_stays_compiled_across_more_shapes_than_onednns_default():
    kept = creation_of_repeated_shape("keep")
    if kept is None:
        pytest.skip("bf16 products do not run on oneDNN's matmul on this CPU")
    assert kept == "create:cache_hit"
    assert creation_of_repeated_shape("default") == "create:cache_miss"  # the probe can tell the two apart


def test_the_users_own_capacity_wins(monkeypatch):
    monkeypatch.setenv(CAPACITY_ENV, "64")
    assert keep_compiled_kernels() == 64
    assert os.environ[CAPACITY_ENV] == "64"
    monkeypatch.delenv(CAPACITY_ENV)
    assert keep_compiled_kernels() == TRAINING_CAPACITY
    assert os.environ[CAPACITY_ENV] == str(TRAINING_CAPACITY)


def test_the_trainer_asks_before_its_first_product(monkeypatch, toy_dir, tmp_path):
    monkeypatch.delenv(CAPACITY_ENV, raising=False)
    Trainer(tiny_config(toy_dir, tmp_path / "cache"), tmp_path / "run", log=lambda line: None)
    assert os.environ[CAPACITY_ENV] == str(TRAINING_CAPACITY)
