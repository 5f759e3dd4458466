"""
Tests of eval.py and tools/geometry.py: Precision@1 on a dataset in the official MMEB layout (self-retrieval 100, a
constant model 0 with every row tied), strict ties and padding by hand, the Table 8 arithmetic, one encode per
distinct item, a run of main() on the toy benchmark with the samples it keeps and the geometry drawn from them,
and two gloo ranks against one process.

    python -m pytest -q tests/test_eval.py
"""

import contextlib
import dataclasses
import io
import json
import math
import os
import re
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from common import UserError
import torch
from PIL import Image, ImageDraw

import eval as evaluation
from model import EmbeddingSpec
from readers import mmeb
from readers.evaluation import read_eval_dataset
from runs.export import model_card
from runs import results
from shapes.prepare import prepare
from tools import geometry as diagnostics
from tests import downloads
from tests.toyrun import torchrun

TOY_DATASETS = ["Shapes-CLS", "Shapes-T2I-OOD"]  # one IND and one OOD, two meta tasks: fast


def write_mmeb_dataset(folder, rows):
    """rows: [(query, [gold, other candidates...])], each side (text, image path or '') -> a Parquet
    file in the official MMEB-eval layout."""
    os.makedirs(folder, exist_ok=True)
    table = pa.table({"qry_text": [q[0] for q, _ in rows], "qry_img_path": [q[1] for q, _ in rows],
                      "tgt_text": [[c[0] for c in cands] for _, cands in rows],
                      "tgt_img_path": [[c[1] for c in cands] for _, cands in rows]})
    pq.write_table(table, os.path.join(folder, "test.parquet"))


def write_images(image_dir, count):
    """count small, visibly different PNGs -> their paths relative to image_dir."""
    os.makedirs(image_dir, exist_ok=True)
    names = []
    for k in range(count):
        image = Image.new("RGB", (64, 64), (30 + 50 * k, 200 - 40 * k, 90))
        ImageDraw.Draw(image).ellipse([4 * k, 8, 30 + 6 * k, 40], fill=(250 - 60 * k, 20 * k, 200))
        names.append(f"img{k}.png")
        image.save(os.path.join(image_dir, names[-1]))
    return names


# five distinct items: text only, image only (MMEB writes the marker), text with an image
def distinct_sides(images):
    return [("a small red circle at the top left", ""), ("<|image_1|>\nRepresent the given image.", images[0]),
            ("<|image_1|>\nFind the caption that best describes this image.", images[1]),
            ("two blue squares and a green star", ""), ("<|image_1|>\nWhat colour is the cross?", images[2])]


@pytest.fixture
def self_retrieval_rows(tmp_path):
    """Row i: the query is item i, its gold is item i again, the other candidates the other items."""
    image_dir = tmp_path / "images"
    sides = distinct_sides(write_images(image_dir, 3))
    rows = [(side, [side] + [other for other in sides if other != side]) for side in sides]
    write_mmeb_dataset(tmp_path / "mmeb" / "Self", rows)
    return read_eval_dataset(str(tmp_path / "mmeb" / "Self"), str(image_dir))[0]


def test_self_retrieval_scores_100_with_cosine(tiny_embedder, self_retrieval_rows):
    result = evaluation.evaluate_dataset(tiny_embedder, self_retrieval_rows, "cos")[0]
    assert result["precision_at_1"] == result["precision_at_1_argmax"] == 100.0 and result["ties"] == 0
    assert result["candidates"] == [5, 5]
    assert result["num_queries"] == 5 and result["distinct_items"] == 5  # queries are their golds


def test_constant_embedding_scores_0_with_every_row_tied(tiny_embedder, self_retrieval_rows, monkeypatch):
    monkeypatch.setattr(tiny_embedder, "forward", lambda input_ids, **_: torch.ones(len(input_ids), tiny_embedder.dim))
    for similarity in ("cos", "dot"):
        result = evaluation.evaluate_dataset(tiny_embedder, self_retrieval_rows, similarity)[0]
        assert result["precision_at_1"] == 0.0
        assert result["ties"] == result["num_queries"] == 5
        assert result["precision_at_1_argmax"] == 100.0  # the official reading: every tie goes to the gold


def test_precision_at_1_by_hand():
    # 2-D embeddings; candidate 3 is long but points away from the queries
    cand = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8], [10.0, 10.0]])
    query = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]])
    index = torch.tensor([[0, 1, 2, -1],  # gold cos 1 > 0.6 > 0: hit; -1 pads a shorter row
                          [1, 1, 0, -1],  # the gold listed again among the others: a tie, not a hit
                          [2, 0, 1, -1],  # cos 0.6 < 1: a miss, not a tie
                          [1, 3, -1, -1]])  # cos: 1 > 0.71, hit; dot: 1 < 10, miss
    p_at_1 = lambda q, i, s: evaluation.precision_at_1(evaluation.candidate_scores(q, cand, i, s))  # noqa: E731
    assert p_at_1(query, index, "cos") == (2, 1, 3)  # strict hits, ties, argmax hits (the tie goes to the gold)
    assert p_at_1(query, index, "dot") == (1, 1, 2)
    scores = evaluation.candidate_scores(query, cand, index, "dot")
    assert scores[3].tolist() == [1.0, 10.0, -float("inf"), -float("inf")]
    assert p_at_1(query[:1], index[:1, :1], "dot") == (1, 0, 1)  # one candidate: a hit
    with pytest.raises(ValueError, match="similarity"):  # a caller's bug, not a user's mistake: loss.comparison_vectors
        evaluation.candidate_scores(query, cand, index, "cosine")


def test_aggregate_matches_table_8_arithmetic():
    scores = {"ImageNet-1K": 50.0, "Place365": 30.0, "OK-VQA": 80.0, "Shapes-GRD-OOD": 10.0, "MyData": 20.0}
    per_dataset = {}
    for name, score in scores.items():
        meta_task, split = mmeb.dataset_group(name)
        per_dataset[name] = {"precision_at_1": score, "precision_at_1_argmax": score + 1, "num_queries": 10, "ties": 0,
                             "meta_task": meta_task, "split": split}
    assert [per_dataset[n]["meta_task"] for n in scores] == ["Classification", "Classification", "VQA",
                                                              "Visual Grounding", "Other"]
    assert [per_dataset[n]["split"] for n in scores] == ["IND", "OOD", "IND", "OOD", "IND"]
    summary = mmeb.aggregate(per_dataset)
    assert summary["meta_tasks"] == {"Classification": 40.0, "VQA": 80.0, "Visual Grounding": 10.0, "Other": 20.0}
    assert list(summary["meta_tasks"]) == ["Classification", "VQA", "Visual Grounding", "Other"]  # Table 8 order
    assert summary["IND"] == pytest.approx((50 + 80 + 20) / 3)
    assert summary["OOD"] == pytest.approx((30 + 10) / 2)
    assert summary["overall"] == pytest.approx(190 / 5)  # over datasets, not over meta tasks
    table = mmeb.format_table(per_dataset, "Final score")
    assert "Place365*" in table and "ImageNet-1K*" not in table
    totals = [line.split()[-2:] for line in table.splitlines() if line.startswith("All ")]
    assert [strict for strict, _ in totals] == ["40.0", "80.0", "10.0", "20.0", "50.0", "20.0", "38.0"]
    assert [argmax for _, argmax in totals] == ["41.0", "81.0", "11.0", "21.0", "51.0", "21.0", "39.0"]
    assert mmeb.dataset_group("Shapes-T2I") == ("Retrieval", "IND")
    assert mmeb.dataset_group("VisualNews_i2t") == ("Retrieval", "IND")
    assert mmeb.dataset_group("RefCOCO") == ("Visual Grounding", "OOD")


def test_each_distinct_item_is_encoded_once(tiny_embedder, tmp_path, monkeypatch):
    image_dir = tmp_path / "images"
    a, b, c, d, e = distinct_sides(write_images(image_dir, 3))
    rows = [(a, [b, c, d]), (a, [b, d, c]), (b, [c, d, e]), (e, [b, c, d]), (d, [c, b, e]), (a, [c, b, d])]
    write_mmeb_dataset(tmp_path / "mmeb" / "Shared", rows)
    rows, _ = read_eval_dataset(str(tmp_path / "mmeb" / "Shared"), str(image_dir))
    encoded, forward = [], tiny_embedder.forward
    monkeypatch.setattr(tiny_embedder, "forward", lambda **batch: encoded.append(batch["input_ids"]) or forward(**batch))
    result = evaluation.evaluate_dataset(tiny_embedder, rows, "dot", batch_size=2)[0]
    assert sum(len(ids) for ids in encoded) == 5  # 18 + 6 references, 5 distinct items
    assert result["distinct_items"] == 5 and result["dedup_factor"] == pytest.approx(24 / 5)
    assert len({tuple(ids[i].tolist()) for ids in encoded for i in range(len(ids))}) == 5  # never the same twice


@pytest.fixture(scope="module")
def toy_benchmark(tmp_path_factory):
    """The smallest toy benchmark prepare() writes: 9 queries and 5 candidates per dataset."""
    return prepare(str(tmp_path_factory.mktemp("shapes")), seed=0, num_train=45, num_eval=9, num_candidates=5)


@pytest.fixture(scope="module")
def dot_checkpoint(tiny_checkpoint, tmp_path_factory):
    """The tiny checkpoint with an embedding spec saying it was trained with the dot product, as an export's."""
    path = str(tmp_path_factory.mktemp("dot") / "export")
    shutil.copytree(tiny_checkpoint, path)
    EmbeddingSpec(similarity="dot", backbone=tiny_checkpoint).save(path)
    return path


def toy_args(checkpoint, toy_benchmark, out):
    return ["config/shapes_eval.py", f"--init_from={checkpoint}", f"--mmeb_dir={toy_benchmark['eval']}",
            f"--image_dir={toy_benchmark['images']}", f"--datasets={TOY_DATASETS!r}", f"--out={out}",
            "--num_workers=0", "--device=cpu", "--geometry_samples=20", "--sheet_queries=2", "--v2_dir="]


@pytest.fixture(scope="module")
def toy_run(dot_checkpoint, toy_benchmark, tmp_path_factory):
    """main() in this process, --key=value style, on two toy datasets. -> (returned dict, JSON path)"""
    out = str(tmp_path_factory.mktemp("eval") / "one.json")
    return evaluation.main(toy_args(dot_checkpoint, toy_benchmark, out)), out


def test_main_on_the_toy_benchmark_writes_table_and_geometry(toy_run, dot_checkpoint, toy_benchmark):
    result, out = toy_run
    with open(out) as f:
        written = json.load(f)
    assert written["similarity"] == "dot" == written["spec"]["similarity"]  # the checkpoint's spec, as PACE ranks
    assert list(written["datasets"]) == TOY_DATASETS
    cls, t2i = written["datasets"]["Shapes-CLS"], written["datasets"]["Shapes-T2I-OOD"]
    assert (cls["meta_task"], cls["split"], t2i["meta_task"], t2i["split"]) == ("Classification", "IND", "Retrieval", "OOD")
    for entry in (cls, t2i):
        assert entry["num_queries"] == 9 and 0 <= entry["ties"] <= 9 and entry["dedup_factor"] > 1
        assert entry["precision_at_1"] * 9 / 100 == pytest.approx(round(entry["precision_at_1"] * 9 / 100))
    assert written["meta_tasks"] == {"Classification": cls["precision_at_1"], "Retrieval": t2i["precision_at_1"]}
    assert (written["IND"], written["OOD"]) == (cls["precision_at_1"], t2i["precision_at_1"])
    assert written["overall"] == pytest.approx((cls["precision_at_1"] + t2i["precision_at_1"]) / 2)
    assert (cls["precision_at_1_argmax"] >= cls["precision_at_1"]) and cls["candidates"] == [5, 5]
    assert written["argmax"]["overall"] >= written["overall"]
    # the sheet's data: two queries, their top 3 by score, the gold marked
    assert len(cls["sheet"]) == 2 and all(len(row["results"]) == 3 for row in cls["sheet"])
    for row in cls["sheet"]:
        scores = [r["score"] for r in row["results"]]
        assert scores == sorted(scores, reverse=True) and sum(r["gold"] for r in row["results"]) <= 1
    assert written["benchmark"] == "other" and "coverage" not in written  # the toy: no MMEB dataset, its own means
    for entry in (cls, t2i):  # toy datasets keep their text; the layout read is said per dataset
        assert entry["instructions"] == {"not of an MMEB dataset (kept)": 9} and entry["layout"] == "v1"

    # tools/geometry.py on what eval.py kept: the numbers and the picture beside the JSON
    geometry = diagnostics.main([out])[out[:-len(".json")] + "_geometry.json"]
    for key in ("norm_cos_pearson_r", "random_pair_mean_cos", "query_norm", "candidate_norm", "pca_explained_variance"):
        assert key in geometry, key
    assert geometry["num_matched_pairs"] == 18  # every evaluated query with its gold
    # the random tiny model's final RMSNorm gives every embedding norm sqrt(D): r is undefined, not noise
    assert geometry["norm_cos_pearson_r"] is None and geometry["query_norm"]["std"] < 1e-4
    assert -1 <= geometry["random_pair_mean_cos"] <= 1
    assert set(geometry["query_norm"]) == {"mean", "std", "min", "max", "p5_p50_p95", "all_equal"}
    assert geometry["query_norm"]["min"] <= geometry["query_norm"]["p5_p50_p95"][1] <= geometry["query_norm"]["max"]
    # what redraws the pictures: PCA coordinates with norm percentiles, the random pairs, the matched pairs
    pca = geometry["pca"]
    assert len(pca["x"]) == len(pca["y"]) == len(pca["is_query"]) > 18
    assert sum(pca["is_query"]) == 18  # 10 a dataset asked for, 9 there: every query, then their candidates
    assert geometry["all_norms_equal"] and pca["norm_percentile"] is None  # no percentiles of equal norms
    assert len(geometry["random_pair_cos"]) == 18 and len(geometry["pairs"]["cos_positive"]) == 18
    with Image.open(out[:-len(".json")] + "_geometry.png") as image:
        assert image.width > 2 * image.height  # three panels side by side

    # the same run again ranks by cosine when asked, and the arguments of the first run do not leak
    other = out[:-len(".json")] + "_cos.json"
    args = [a for a in toy_args(dot_checkpoint, toy_benchmark, other) if not a.startswith("--geometry_samples")]
    args += ["--similarity=cos", "--geometry=False"]
    again = evaluation.main([a for a in args if not a.startswith("--datasets=")] + ["--datasets=['Shapes-T2I-OOD']"])
    assert again["similarity"] == "cos" and list(again["datasets"]) == ["Shapes-T2I-OOD"]
    assert again["config"]["geometry_samples"] == 1000  # config/shapes_eval.py's, not the 20 of the first run
    with pytest.raises(UserError, match="geometry sample .*Shapes-T2I-OOD.*--geometry=True"):
        diagnostics.main([other])  # nothing kept to draw from


def test_geometry_by_hand():
    # gold norms exp(3 (1 - cos)): the log norm product falls exactly linearly in cos(q, c+), r = -1
    angles = torch.linspace(0, 1.2, 50)
    directions = torch.stack([angles.cos(), angles.sin(), torch.zeros(50)], 1)  # (50, 3)
    queries, golds = torch.tensor([1.0, 0.0, 0.0]).expand(50, 3) * 2, directions * (3 * (1 - angles.cos()[:, None])).exp()
    sample = results.geometry_sample_of(queries, golds, golds, 10, torch.Generator().manual_seed(0))
    summary = diagnostics.summary([sample])
    assert summary["norm_cos_pearson_r"] == pytest.approx(-1.0, abs=1e-4)
    constant = results.geometry_sample_of(8 * directions, 8 * directions, 8 * directions, 10,
                                             torch.Generator().manual_seed(0))
    numbers = diagnostics.summary([constant])
    assert numbers["norm_cos_pearson_r"] is None and numbers["all_norms_equal"]  # all norms equal: r undefined
    assert numbers["norm_from_direction_r2"] == {"2": None, "10": None} and numbers["pca"]["norm_percentile"] is None
    assert diagnostics.describe(numbers).startswith("all norms 8.00")
    assert summary["num_matched_pairs"] == 50 and summary["num_random_pairs"] == 100
    pairs = torch.nn.functional.cosine_similarity(sample["queries"][:, None], sample["candidates"][None], dim=-1)
    assert summary["random_pair_mean_cos"] == pytest.approx(pairs.mean().item(), abs=1e-6)
    assert all(any(abs(v - p) < 1e-5 for p in pairs.flatten().tolist()) for v in summary["random_pair_cos"])
    assert summary["query_norm"]["mean"] == pytest.approx(2.0) and summary["query_norm"]["std"] == pytest.approx(0)
    z = torch.tensor(summary["pairs"]["standardised_log_norm_product"])
    assert z.mean().abs() < 1e-5 and z.std() == pytest.approx(1.0, abs=1e-5)  # Figure 4a's standardised axis


def test_norm_from_direction_r2():
    # the paper's "magnitude predictable from direction alone", measured: directions on a circle in the first two
    # coordinates (the first two principal components), norms exp(2 cos t + sin t), linear in those coordinates
    generator = torch.Generator().manual_seed(0)
    angle = torch.rand(400, generator=generator) * 2 * math.pi
    noise = 0.01 * torch.randn(400, 14, generator=generator)
    directions = torch.nn.functional.normalize(torch.cat([torch.stack([angle.cos(), angle.sin()], 1), noise], 1), dim=1)
    tied = directions * (2 * directions[:, :1] + directions[:, 1:2]).exp()  # (400, 16)
    r2 = diagnostics.norm_from_direction_r2(tied)
    assert set(r2) == {"2", "10"} and r2["2"] > 0.99 and r2["10"] > 0.99
    # norms drawn independently of the direction: nothing to predict out of fold
    free = torch.randn(400, 16, generator=generator)
    free = torch.nn.functional.normalize(free, dim=1) * torch.randn(400, 1, generator=generator).exp()
    r2 = diagnostics.norm_from_direction_r2(free)
    assert abs(r2["2"]) < 0.05 and abs(r2["10"]) < 0.1
    few = diagnostics.norm_from_direction_r2(free[:30])  # 30 points: enough for 2 components, too few for 10
    assert few["2"] is not None and few["10"] is None
    # norms that vary while r is undefined (every pair's cosine is 1): printed and drawn, not a crash
    numbers = diagnostics.summary([results.geometry_sample_of(tied, tied, tied, 10, generator)])
    assert numbers["norm_cos_pearson_r"] is None and not numbers["all_norms_equal"]
    assert diagnostics.describe(numbers).startswith("r -, norm-from-direction R^2 (k=2) 1.00")



@pytest.mark.slow
def test_two_gloo_ranks_equal_one_process(toy_run, dot_checkpoint, toy_benchmark, tmp_path):
    one, _ = toy_run
    out = str(tmp_path / "two.json")
    # and, in the same launch, MMEB-V2 tasks of three kinds: a video pool, a row's own options, a document corpus
    v2 = [f"--v2_dir={downloads.mmeb_v2_video(str(tmp_path), names=('MSR-VTT', 'Video-MME'))}",
          "--v2_tasks=['MSR-VTT', 'Video-MME', 'ViDoRe_arxivqa']"]
    downloads.mmeb_v2_visdoc(str(tmp_path))
    code, output = torchrun(2, "eval.py", *toy_args(dot_checkpoint, toy_benchmark, out), *v2, timeout=120)
    assert code == 0, output[-6000:]
    with open(out) as f:
        two = json.load(f)
    alone = evaluation.main([f"--init_from={dot_checkpoint}", "--num_workers=0", "--device=cpu", "--geometry=False",
                             f"--out={tmp_path / 'v2_one.json'}", *v2])["mmeb_v2"]["results"]
    for name in ("MSR-VTT", "Video-MME", "ViDoRe_arxivqa"):
        for key in ("hit@1", "ndcg_linear@5", "mrr@10", "num_queries", "candidates"):
            assert two["mmeb_v2"]["results"][name][key] == pytest.approx(alone[name][key], abs=1e-9), (name, key)
    for name in TOY_DATASETS:  # every rank encoded half the distinct items: the same numbers
        for key in ("precision_at_1", "num_queries", "ties", "distinct_items", "dedup_factor"):
            assert two["datasets"][name][key] == one["datasets"][name][key], (name, key)
    assert (two["IND"], two["OOD"], two["overall"]) == (one["IND"], one["OOD"], one["overall"])
    one_geometry, two_geometry = diagnostics.from_results(toy_run[1])[0], diagnostics.from_results(out)[0]
    for key in ("random_pair_mean_cos", "num_matched_pairs"):  # each dataset's sample is the same: its own seed
        assert two_geometry[key] == pytest.approx(one_geometry[key], abs=1e-4)
    assert output.count("wrote ") == 1  # rank 0 alone prints and writes
    assert "Shapes-CLS: 16/16 items" in output  # rank 0's share of Shapes-CLS's 31 distinct items


def test_an_empty_dataset_folder_is_an_error_or_a_listed_omission(dot_checkpoint, toy_benchmark, tmp_path):
    mmeb_dir = tmp_path / "eval"
    shutil.copytree(toy_benchmark["eval"], mmeb_dir)
    for parquet in (mmeb_dir / "Shapes-VQA").iterdir():
        parquet.unlink()  # a download that did not finish
    args = toy_args(dot_checkpoint, toy_benchmark, str(tmp_path / "out.json"))
    args = [a for a in args if not a.startswith(("--mmeb_dir", "--datasets"))] + [f"--mmeb_dir={mmeb_dir}",
                                                                                 "--datasets=['Shapes-CLS', 'Shapes-VQA']"]
    with pytest.raises(UserError, match="without Parquet files .*Shapes-VQA"):
        evaluation.main(args)
    result = evaluation.main(args + ["--allow_missing_datasets=True", "--geometry=False"])
    assert result["omitted"] == ["Shapes-VQA"] and list(result["datasets"]) == ["Shapes-CLS"]
    args = [a for a in args if not a.startswith("--datasets")]  # every folder of mmeb_dir: the same
    with pytest.raises(UserError, match="Shapes-VQA"):
        evaluation.main(args)


def test_non_finite_embeddings_are_an_error_naming_the_dataset(tiny_embedder, self_retrieval_rows, monkeypatch):
    monkeypatch.setattr(tiny_embedder, "forward", lambda input_ids, **_: torch.full((len(input_ids), 64), math.nan))
    with pytest.raises(UserError, match="Self: the model gave non-finite embeddings for 5 of its 5 items"):
        evaluation.evaluate_dataset(tiny_embedder, self_retrieval_rows, "dot", label="Self")


def test_rows_of_different_candidate_counts_are_reported(tiny_embedder, tmp_path):
    image_dir = tmp_path / "images"
    a, b, c, d, e = distinct_sides(write_images(image_dir, 3))
    write_mmeb_dataset(tmp_path / "mmeb" / "Uneven", [(a, [b, c, d]), (b, [c, d]), (e, [a, b, c, d])])
    rows, _ = read_eval_dataset(str(tmp_path / "mmeb" / "Uneven"), str(image_dir))
    assert evaluation.evaluate_dataset(tiny_embedder, rows, "dot")[0]["candidates"] == [2, 4]


def test_training_rows_geometry_and_the_model_card(dot_checkpoint, toy_benchmark, tmp_path):
    export = tmp_path / "run" / "export"
    shutil.copytree(dot_checkpoint, export)
    spec = dataclasses.replace(EmbeddingSpec.load(str(export)), max_pixels=128 * 192, max_length=512,
                               matryoshka_dims=(32,))  # config/shapes_eval.py's budgets: its own settings
    spec.save(str(export))
    info = {"step": 7, "config": {"learning_rate": 0.1}}
    (export / "pace.json").write_text(json.dumps(info))
    (export / "README.md").write_text(model_card(spec, info, str(export)))
    untouched, out = (export / "README.md").read_text(), str(tmp_path / "card.json")
    whole = [a for a in toy_args(str(export), toy_benchmark, out) if not a.startswith("--datasets=")]
    for args, why in ((toy_args(str(export), toy_benchmark, out), f"datasets={TOY_DATASETS!r} (a part"),
                      (whole + ["--dim=16"], "dim 16, not its own 0"), (whole + ["--max_pixels=4096"], "max_pixels 4096"),
                      (whole + ["--keep_card=True"], "keep_card=True")):  # each leaves the card as it was
        with contextlib.redirect_stdout(io.StringIO()) as said:
            result = evaluation.main(args)
        assert (export / "README.md").read_text() == untouched, args
        assert f"the model card of {export} is left as it is: {why}" in said.getvalue(), said.getvalue()[-2000:]
        assert f"the results are in {out} only" in said.getvalue() and os.path.isfile(out)
    assert result["dim"] == 64 and "dim: scoring at 64 of the backbone's 64 dimensions (trained at 32, 64)" in \
        said.getvalue()
    with contextlib.redirect_stdout(io.StringIO()) as said:
        evaluation.main(whole + ["--dim=16"])
    assert ("dim: scoring at 16 of the backbone's 64 dimensions; WARNING: " f"{export} was trained at 32, 64 only"
            in said.getvalue())
    with contextlib.redirect_stdout(io.StringIO()) as said:
        evaluation.main(whole + ["--dim=32"])  # a trained prefix: no warning, and a card it may not speak for
    assert "(trained at 32, 64)" in said.getvalue() and "WARNING" not in said.getvalue()
    evaluation.main(whole)  # the whole benchmark at the export's own settings: its table goes into the card
    card = (export / "README.md").read_text()
    assert "Shapes-CLS" in card.split("## Evaluation")[1] and card.count("## Evaluation") == 1
    assert "MMEB (dot similarity, instructions 'paper', dim 64, max_pixels 24,576, max_length 512, video_frames 8)" in card
    assert "**dot product**" in card and "load_embedder" in card
    # the paper's geometry on training rows: 20 queries with their positives
    train = diagnostics.main([f"--init_from={export}", f"--train_data={[toy_benchmark['train']]!r}",
                              f"--image_dir={toy_benchmark['images']}", f"--table_dir={tmp_path / 'tables'}",
                              "--samples=20", "--num_workers=0", f"--out={tmp_path / 'train_geometry.json'}"])
    numbers = train[str(tmp_path / "train_geometry.json")]
    assert numbers["num_matched_pairs"] == 20 and len(numbers["random_pair_cos"]) == 20
    assert os.path.isfile(tmp_path / "train_geometry.png")
    # a source with a bad row is refused as train.py refuses it, naming the row; skip_bad_rows samples past it
    rows = [json.loads(line) for line in open(toy_benchmark["train"])]
    rows[3]["qry_image_path"] = "no/such.png"
    broken = tmp_path / "broken.jsonl"
    broken.write_text("".join(json.dumps(row) + "\n" for row in rows))
    args = [f"--init_from={export}", f"--train_data={str(broken)!r}", f"--image_dir={toy_benchmark['images']}",
            f"--table_dir={tmp_path / 'tables'}", "--samples=20", "--num_workers=0",
            f"--out={tmp_path / 'broken_geometry.json'}"]
    with pytest.raises(UserError, match=rf"{re.escape(str(broken))}.*line 4.*no/such.png.*skip_bad_rows=True"):
        diagnostics.main(args)
    skipped = diagnostics.main(args + ["--skip_bad_rows=True"])[str(tmp_path / "broken_geometry.json")]
    assert skipped["num_matched_pairs"] == 20
