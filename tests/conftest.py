"""Shared pytest fixtures: one tiny random Qwen3.5 checkpoint per pytest run (shapes/tiny_model.py), the toy
benchmark the training tests run on, and its straight 4-step runs, which resumed and interrupted runs must equal.
Tests marked slow (pytest.ini) run train.py, torchrun or a whole script; `python -m pytest -q -m "not slow"` is the
quick lane."""
import json
import os

import pytest
import torch

from model import FAMILIES, Embedder
from shapes.tiny_model import make_tiny_checkpoint
from tests.toyrun import run_train

if os.environ.get("PYTEST_XDIST_WORKER"):  # one torch thread a worker, and in what it launches: two spinning thread
    torch.set_num_threads(1)               # pools on two cores (two workers, a torchrun's ranks) wait on each other
    os.environ["OMP_NUM_THREADS"] = "1"


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """Path of a tiny Qwen3.5 folder in the layout of a real release."""
    return make_tiny_checkpoint(str(tmp_path_factory.mktemp("tiny_qwen3_5")), seed=0)


@pytest.fixture(scope="session")
def tiny_embedder(tiny_checkpoint):
    """The tiny checkpoint loaded as an Embedder (float32, eval mode). Tests must not modify it."""
    return Embedder.from_pretrained(tiny_checkpoint).eval()


@pytest.fixture(scope="session")
def preprocessor(tiny_checkpoint):
    from model import Preprocessor
    return Preprocessor.from_pretrained(tiny_checkpoint)


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory, tiny_checkpoint):
    """{family: a tiny checkpoint of it} for every backbone family of model.FAMILIES (the core tests run on each)."""
    return {family: tiny_checkpoint if family == "qwen3_5" else make_tiny_checkpoint(
        str(tmp_path_factory.mktemp(f"tiny_{family}")), seed=0, family=family) for family in FAMILIES}


@pytest.fixture(scope="session", params=list(FAMILIES))
def family_embedder(request, tiny_checkpoints):
    """The tiny checkpoint of each backbone family as an Embedder (float32, eval mode): a test taking it runs on both.
    Tests must not modify it."""
    return Embedder.from_pretrained(tiny_checkpoints[request.param]).eval()


@pytest.fixture(scope="session")
def toy(tmp_path_factory, tiny_checkpoint):
    """The toy benchmark with the query images of the first two global batches' rows 0 and 3 broken (a truncated
    PNG, an empty file): with skip_bad_rows the runs below pass over them, the same way on every run."""
    from data import ShardedBatchSampler
    from shapes.prepare import prepare
    out = str(tmp_path_factory.mktemp("shapes"))
    paths = prepare(out, seed=0, num_train=120, num_eval=12)
    rows = [json.loads(line) for line in open(paths["train"])]
    first = next(iter(ShardedBatchSampler(len(rows), 8, seed=1337)))  # train.py's seed, --batch_size=8
    broken = [os.path.join(paths["images"], rows[first[k]]["qry_image_path"]) for k in (0, 3)
              if rows[first[k]]["qry_image_path"]]
    with open(broken[0], "rb") as f:
        whole = f.read()
    with open(broken[0], "wb") as f:
        f.write(whole[:len(whole) // 2])
    if len(broken) > 1:
        open(broken[1], "wb").close()
    return {"checkpoint": tiny_checkpoint, **paths, "root": out, "broken": broken}


@pytest.fixture(scope="session")
def straight(toy, tmp_path_factory):
    """Four steps of the toy's Stage I in one process, a checkpoint every two: what resumed, interrupted, sharded and
    GradCache runs must equal. -> (its out_dir, its log records)"""
    out = str(tmp_path_factory.mktemp("straight"))
    return out, run_train(toy, out, "--max_iters=4", "--checkpoint_interval=2")


@pytest.fixture(scope="session")
def straight_random(toy, tmp_path_factory):
    """The same run with Figure 6(b)'s random weighting, which draws from torch's RNG every step: what a resumed
    run must equal to show the RNG restored."""
    out = str(tmp_path_factory.mktemp("straight_random"))
    return out, run_train(toy, out, "--max_iters=4", "--checkpoint_interval=2", "--weighting='random'")


def pytest_collection_modifyitems(config, items):
    """The slow tests first, in file order: the two xdist workers then finish together on the quick ones, rather
    than one waiting out the other's last train.py run."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
