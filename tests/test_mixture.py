"""
Mixtures as the field trains them: a weight per train_data entry, same-source groups (homogeneous batches), and
Matryoshka dimensions; the sampler's shares and groups, its resume, what --check_data says, the bad input, and a
two-rank run of all three stopped and resumed to the straight run's losses.

    python -m pytest -q tests/test_mixture.py
"""
import collections
import json
import os
import shutil

import pytest

import data
from common import UserError
from model import EmbeddingSpec
from readers import training
from tests.toyrun import launch, read_log, run_train

SOURCES = [{"path": "a", "ranges": [(0, 300)], "weight": 3.0}, {"path": "b", "ranges": [(300, 400)], "weight": 1.0},
           {"path": "c", "ranges": [(400, 450), (460, 470)], "weight": 1.0}]  # c: two subsets, 10 rows between them bad


def source_of(row):
    return 0 if row < 300 else 1 if row < 400 else 2


def steps(sampler_args, count, world=2, position=0):
    """count global batches of a MixtureSampler, as [rank 0's rows, rank 1's rows, ...] a step."""
    samplers = [data.MixtureSampler(*sampler_args[:2], rank, world, *sampler_args[2:]) for rank in range(world)]
    for sampler in samplers:
        sampler.position = position
    iterators = [iter(sampler) for sampler in samplers]
    return [[next(it) for it in iterators] for _ in range(count)]


@pytest.mark.parametrize("group", [0, 4])
def test_sources_are_drawn_by_weight_and_a_group_holds_one_source(group):
    batches = steps((SOURCES, 16, 7, group), 1000)
    shares = collections.Counter(source_of(row) for step in batches for rank in step for row in rank)
    total = sum(shares.values())
    assert [shares[s] / total for s in range(3)] == pytest.approx([0.6, 0.2, 0.2], abs=0.02)  # 3:1:1
    assert all(row not in range(450, 460) and 0 <= row < 470 for step in batches for rank in step for row in rank)
    if group:  # group g of every rank from one source, the same on both ranks
        for step in batches:
            sources = [[{source_of(row) for row in rank[g:g + group]} for g in range(0, 8, group)] for rank in step]
            assert all(len(s) == 1 for rank in sources for s in rank) and sources[0] == sources[1]
    counts = collections.Counter(row for step in batches[:25] for rank in step for row in rank if row >= 400)
    assert max(counts.values()) == 1 or sum(counts.values()) > 60  # source c: each row once a pass, then again


def test_a_resume_mid_epoch_continues_the_straight_draws_and_refuses_another_mixture():
    straight = steps((SOURCES, 16, 7, 4), 40)
    assert steps((SOURCES, 16, 7, 4), 20, position=20) == straight[20:]
    sampler = data.MixtureSampler(SOURCES, 16, 0, 2, 7, 4)
    state = dict(sampler.state_dict(), position=20)
    for other in (data.MixtureSampler(SOURCES, 16, 0, 4, 7, 4),  # homogeneous groups are per rank
                  data.MixtureSampler([dict(s, weight=1.0) for s in SOURCES], 16, 0, 2, 7, 4)):
        with pytest.raises(UserError, match="cannot resume the data"):
            other.load_state_dict(state)
    unweighted = data.MixtureSampler(SOURCES, 16, 0, 2, 7, 0)  # per query: global batches do not depend on ranks
    one = [row for step in steps((SOURCES, 16, 7, 0), 5, world=1) for rank in step for row in rank]
    two = [row for step in steps((SOURCES, 16, 7, 0), 5, world=2) for rank in step for row in rank]
    assert one == two and unweighted.state_dict()["ranks"] is None


def test_bad_mixtures_are_named():
    with pytest.raises(UserError, match=r"'data/x.jsonl': weight must be a positive number, got -1"):
        training.train_entries([{"path": "data/x.jsonl", "weight": -1}], "")
    with pytest.raises(UserError, match=r"weight must be a positive number, got 'heavy'"):
        training.train_entries([{"path": "data/x.jsonl", "weight": "heavy"}], "")
    with pytest.raises(UserError, match=r"homogeneous_batch=3 does not divide a rank's 8 queries"):
        data.MixtureSampler(SOURCES, 16, 0, 2, 7, 3)
    with pytest.raises(UserError, match=r"matryoshka_dims increasing .* got dim=0, matryoshka_dims=\[32, 16\]"):
        EmbeddingSpec(matryoshka_dims=(32, 16))


def test_above_the_backbone_a_dimension_is_an_error(tiny_checkpoint):
    from model import Embedder
    with pytest.raises(UserError, match=r"matryoshka_dims=\[32, 128\]: the backbone's vectors have 64 dimensions"):
        Embedder.from_pretrained(tiny_checkpoint, matryoshka_dims=(32, 128))
    assert Embedder.from_pretrained(tiny_checkpoint, dim=16).encode([{"text": "a", "image": None}]).shape == (1, 16)


def family_sources(toy, folder):
    """The toy's training rows in three files by family, the train_data of a 3:1:1 mixture."""
    os.makedirs(folder, exist_ok=True)
    rows = [json.loads(line) for line in open(toy["train"])]
    family = lambda row: (row["qry_image_path"] or "/T2I/").split("/")[1]  # noqa: E731
    parts = {"cls": ["CLS"], "vqa": ["VQA"], "rest": ["T2I", "I2T", "GRD"]}
    for name, families in parts.items():
        with open(os.path.join(folder, f"{name}.jsonl"), "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows if family(row) in families)
    return [{"path": os.path.join(folder, f"{name}.jsonl"), "weight": w} for name, w in zip(parts, (3, 1, 1))]


@pytest.mark.slow
def test_two_ranks_train_a_mixture_stopped_and_resumed_to_the_straight_runs_losses(toy, tmp_path):
    train_data = family_sources(toy, str(tmp_path / "sources"))
    args = [f"--train_data={train_data!r}", "--homogeneous_batch=4", "--matryoshka_dims=[16, 32]", "--max_iters=4",
            "--checkpoint_interval=2"]
    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    records = run_train(toy, straight, *args, nproc=2)
    shutil.copytree(straight, resumed)  # stopped after step 2: its checkpoint, nothing after it
    for name in ("step_000004", "export"):
        shutil.rmtree(os.path.join(resumed, name))
    again = run_train(toy, resumed, *args, "--resume=True", nproc=2)
    assert [r["loss"] for r in again] == pytest.approx([r["loss"] for r in records], rel=1e-5)
    spec = json.load(open(os.path.join(straight, "export", "embedding_spec.json")))
    assert spec["matryoshka_dims"] == [16, 32] and read_log(straight)[0]["loss"] > 0
    code, check = launch(toy, str(tmp_path / "check"), *args, "--check_data=True")
    assert code == 0 and "weight 3, 60.0% of the draws" in check and "same-source groups of 4 queries" in check


def test_the_vlm2vec_v2_image_config_is_its_mixture_on_mmeb_train():
    from configurator import configure
    from tests.toyrun import ROOT, script_defaults
    config = configure(dict(script_defaults("train.py")), [os.path.join(ROOT, "config", "vlm2vec_v2_image.py")])
    entries = training.train_entries(config["train_data"], config["image_dir"])
    assert len(entries) == 20 and all(e["path"].startswith("data/MMEB-train/") for e in entries)
    assert sum(e["weight"] for e in entries) == 15 and sum(e["max_rows"] for e in entries) == 1_103_000
    assert {e["weight"] for e in entries} == {0.5, 1} and config["image_dir"] == "data/MMEB-train"
    assert (config["batch_size"] // 8) % config["homogeneous_batch"] == 0  # groups fill a GPU's share on 8 GPUs
