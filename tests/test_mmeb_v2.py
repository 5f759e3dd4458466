"""
Tests of readers/mmeb_v2.py: its ranking and metrics against VLM2Vec-V2's own code on saved score matrices (the
fixture tests/fixtures/vlm2vec_v2_metrics.json, made by running VLM2Vec's eval.py ranking and RankingMetrics; its
"provenance" says at which commit and how), the 78-task table, and the means over a partial or a full run.

    python -m pytest -q tests/test_mmeb_v2.py
"""
import json
import os

import numpy as np
import pytest
import torch

from common import UserError
from readers import mmeb_v2
from readers.mmeb import MMEB_DATASETS
from readers.mmeb_v2 import FAMILIES, MODALITIES, V2_TASKS

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "vlm2vec_v2_metrics.json")
with open(FIXTURE) as f:
    VLM2VEC = json.load(f)
CASES = {case["name"]: case for case in VLM2VEC["cases"]}


def scores_of(case):
    return np.array(case["scores"], dtype=case["dtype"])  # (Q, K) exactly the matrix VLM2Vec ranked


def their_rankings(case):
    return [[case["candidate_names"][j] for j in row] for row in case["their_rankings"]]  # top 10 per query


def assert_same_metrics(ours, theirs):
    assert list(ours) == list(theirs)  # the same keys, in RankingMetrics' order
    for key, value in theirs.items():
        assert ours[key] == pytest.approx(value, abs=1e-9, rel=0), key


def numpy_order_here(case):
    """eval.py's own calls on this machine: does this numpy order the fixture's ties as the machine that made it?"""
    scores, names = scores_of(case), case["candidate_names"]
    if case["local"] is None:
        return [[names[j] for j in row] for row in np.argsort(-scores, axis=1)[:, :10].tolist()]
    index = {name: j for j, name in enumerate(names)}
    return [[own[i] for i in np.argsort(-scores[q, [index[n] for n in own]])[:10].tolist()]
            for q, own in enumerate(case["local"])]


def test_the_fixture_says_where_it_came_from():
    assert os.path.getsize(FIXTURE) < 60_000
    assert "TIGER-AI-Lab/VLM2Vec @ " in VLM2VEC["provenance"] and "metrics.py" in VLM2VEC["provenance"]
    kinds = {(c["local"] is not None, c["rel_scores"] is not None) for c in CASES.values()}
    assert kinds == {(False, False), (False, True), (True, False), (True, True)}  # global / local, binary / graded
    assert all(c["ties_in_scores"] > 0 for c in CASES.values())


@pytest.mark.parametrize("name", list(CASES))
def test_metrics_equal_vlm2vecs_on_its_own_rankings(name):
    """The metric math alone, on the rankings VLM2Vec made: holds on any machine."""
    case = CASES[name]
    assert_same_metrics(mmeb_v2.metrics_from_rankings(their_rankings(case), case["labels"], case["rel_scores"]),
                        case["their_metrics"])


@pytest.mark.parametrize("name", list(CASES))
def test_ranking_metrics_equal_vlm2vecs_on_the_same_scores(name):
    """Scores in, VLM2Vec's numbers out, ties ordered as its np.argsort ordered them."""
    case = CASES[name]
    if numpy_order_here(case) != their_rankings(case):
        pytest.skip("this numpy / CPU orders tied scores unlike the fixture's machine (VLM2Vec's tie order is "
                    "numpy's unstable argsort); the metric math is still checked on VLM2Vec's own rankings")
    args = (case["candidate_names"], case["labels"], case["rel_scores"], case["local"])
    assert mmeb_v2.rank(scores_of(case), case["candidate_names"], case["local"], top=10) == their_rankings(case)
    assert_same_metrics(mmeb_v2.ranking_metrics(scores_of(case), *args), case["their_metrics"])
    if case["dtype"] == "float32":  # a torch tensor ranks as the numpy array it holds
        assert_same_metrics(mmeb_v2.ranking_metrics(torch.from_numpy(scores_of(case)), *args), case["their_metrics"])


def test_the_fixture_would_catch_another_tie_order():
    """Ranked by a stable sort (ties in index order), some cases score otherwise than VLM2Vec."""
    differ = 0
    for case in CASES.values():
        scores, names = scores_of(case), case["candidate_names"]
        if case["local"] is None:
            stable = [[names[j] for j in row] for row in np.argsort(-scores, axis=1, kind="stable")[:, :10]]
        else:
            index = {n: j for j, n in enumerate(names)}
            stable = [[own[i] for i in np.argsort(-scores[q, [index[n] for n in own]], kind="stable")[:10]]
                      for q, own in enumerate(case["local"])]
        ours = mmeb_v2.metrics_from_rankings(stable, case["labels"], case["rel_scores"])
        differ += any(abs(ours[k] - v) > 1e-9 for k, v in case["their_metrics"].items())
    assert differ >= 2


def test_graded_labels_keep_their_own_grades_in_any_order():
    scores = np.array([[0.9, 0.8, 0.1]], dtype=np.float32)  # ranks a, b, c
    names = ["a", "b", "c"]
    one = mmeb_v2.ranking_metrics(scores, names, [["a", "c"]], rel_scores=[[1, 3]])
    other = mmeb_v2.ranking_metrics(scores, names, [["c", "a"]], rel_scores=[[3, 1]])
    assert one == other
    ideal = 3 + 1 / np.log2(3)  # c (3) then a (1)
    assert one["ndcg_linear@5"] == pytest.approx((1 + 3 / np.log2(4)) / ideal, abs=1e-12)
    assert one["precision@5"] == pytest.approx(2 / 5) and one["map@5"] == pytest.approx((1 + 2 / 3) / 2)


def test_local_ranks_only_the_rows_own_names():
    scores = np.array([[5.0, 1.0, 2.0, 3.0], [0.0, 4.0, 1.0, 0.5]])  # (2, 4)
    names = ["w", "x", "y", "z"]
    assert mmeb_v2.rank(scores, names, local=[["x", "y"], ["w", "z", "x"]]) == [["y", "x"], ["x", "z", "w"]]
    result = mmeb_v2.ranking_metrics(scores, names, [["x"], "x"], local=[["x", "y"], ["w", "z", "x"]])
    assert result["hit@1"] == 0.5 and result["mrr@1"] == 0.5 and result["mrr@5"] == 0.75


def test_bad_inputs_are_named():
    scores, names = np.zeros((1, 2)), ["a", "b"]
    with pytest.raises(UserError, match="NaN"):
        mmeb_v2.ranking_metrics(np.array([[0.0, np.nan]]), names, [["a"]])
    assert mmeb_v2.ranking_metrics(scores, names, [["q"]])["hit@10"] == 0.0  # a gold no ranking holds: a miss
    with pytest.raises(UserError, match="query 0's candidate 'q'"):
        mmeb_v2.ranking_metrics(scores, names, [["a"]], local=[["a", "q"]])
    with pytest.raises(UserError, match="de-duplicated"):
        mmeb_v2.ranking_metrics(scores, ["a", "a"], [["a"]])
    with pytest.raises(UserError, match="3 columns"):
        mmeb_v2.ranking_metrics(np.zeros((1, 3)), names, [["a"]])
    with pytest.raises(UserError, match="query 0: 2 labels"):
        mmeb_v2.ranking_metrics(scores, names, [["a", "b"]], rel_scores=[[1]])


def test_the_task_table():
    assert len(V2_TASKS) == 78 and {m: len(n) for m, n in MODALITIES.items()} == {"image": 36, "video": 18,
                                                                                   "visdoc": 24}
    assert set(MODALITIES["image"]) == set(MMEB_DATASETS)  # the image.yaml keys are MMEB v1's names
    assert all(V2_TASKS[n].family == MMEB_DATASETS[n][0] for n in MODALITIES["image"])
    assert {f: len(n) for f, n in FAMILIES.items()} == {
        "Classification": 10, "VQA": 10, "Retrieval": 12, "Visual Grounding": 4, "VID_CLS": 5, "VID_QA": 5,
        "VID_RET": 5, "VID_MRET": 3, "ViDoRe_v1": 10, "ViDoRe_v2": 4, "VisRAG": 6, "OOD": 4}
    assert {t.metric for t in V2_TASKS.values() if t.modality != "visdoc"} == {"hit@1"}
    assert {t.metric for t in V2_TASKS.values() if t.modality == "visdoc"} == {"ndcg_linear@5"}
    local = {n for n, t in V2_TASKS.items() if t.eval_type == "local"}
    assert local == set(MODALITIES["image"]) | {"SmthSmthV2", "MVBench", "Video-MME", "NExTQA", "EgoSchema",
                                                 "ActivityNetQA", "QVHighlight", "Charades-STA", "MomentSeeker"}
    assert mmeb_v2.task_key("ViDoSeek-page-fixed") == "ViDoSeek-page" == mmeb_v2.task_key("ViDoSeek-page")
    assert mmeb_v2.task_key("MomentSeeker_1k8") is None and set(mmeb_v2.RENAMED) <= set(FAMILIES["OOD"])


def result(value, metric="hit@1"):
    return {metric: value, "num_data": 10}


def test_a_partial_run_says_n_of_78_and_names_what_is_missing():
    per_task = {"K700": result(0.4), "MSR-VTT": result(0.5), "ViDoSeek-page-fixed": result(0.6, "ndcg_linear@5"),
                "MomentSeeker_1k8": result(0.9)}
    summary = mmeb_v2.aggregate_v2(per_task)
    assert not summary["complete"] and summary["not_scored"] == ["MomentSeeker_1k8"]
    assert summary["all"]["mean"] == pytest.approx(50.0)
    assert summary["all"]["label"].startswith("mean of 3 of 78 tasks") and len(summary["all"]["missing"]) == 75
    assert summary["modalities"]["video"]["label"] == "video: 2 of 18 tasks"
    assert summary["families"]["OOD"]["missing"] == ["ViDoSeek-doc", "MMLongBench-page", "MMLongBench-doc"]
    assert summary["modalities"]["image"]["mean"] is None
    table = mmeb_v2.format_table_v2(per_task, "MMEB-V2, a test model")
    assert "overall" not in table.lower() and "3 of 78" in table and "visdoc: 1 of 24 tasks" in table
    assert "MMLongBench-doc" in table and "SmthSmthV2" in table  # the missing ones, named
    with pytest.raises(UserError, match="fraction"):
        mmeb_v2.aggregate_v2({"K700": result(40.0)})
    with pytest.raises(UserError, match="twice"):
        mmeb_v2.aggregate_v2({"ViDoSeek-page": result(0.1, "ndcg_linear@5"),
                      "ViDoSeek-page-fixed": result(0.1, "ndcg_linear@5")})


def test_the_full_run_is_the_overall_and_modality_means_are_over_tasks():
    per_task = {name: result(0.0, task.metric) for name, task in V2_TASKS.items()}
    per_task.update({name: result(1.0) for name in FAMILIES["VID_CLS"]})  # 5 of the 18 video tasks at 100
    summary = mmeb_v2.aggregate_v2(per_task)
    assert summary["complete"] and summary["all"]["label"] == "MMEB-V2 overall: all 78 tasks"
    video = summary["modalities"]["video"]["mean"]
    family_means = [summary["families"][f]["mean"] for f in ("VID_CLS", "VID_QA", "VID_RET", "VID_MRET")]
    assert video == pytest.approx(100 * 5 / 18) and video != pytest.approx(sum(family_means) / 4)
    assert summary["all"]["mean"] == pytest.approx(100 * 5 / 78)
    assert "MMEB-V2 overall: all 78 tasks" in mmeb_v2.format_table_v2(per_task, "MMEB-V2")
