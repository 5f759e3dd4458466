"""
A rank that stops answering, for tests/test_train.py: two processes (RANK 0 and 1, as torchrun starts them) join a
gloo group with a 3-second timeout (common.compute_init), all-reduce once together, then rank 1 stops answering (as
a frozen GPU or a swapped-out node would) while rank 0 all-reduces again. Rank 0's collective times out, and the
error hook ends it in one line naming rank 1.

    RANK=0 ... python -m tests.dist_timeout_check & RANK=1 ... python -m tests.dist_timeout_check
"""
import time

import torch
import torch.distributed as dist

import common

common.install_error_hook()
rank, _, world, _ = common.compute_init("cpu", timeout_minutes=0.05)
value = torch.ones(1)
dist.all_reduce(value)  # the group works
if rank == 1:
    time.sleep(120)  # stopped: never joins another collective
dist.all_reduce(value)
