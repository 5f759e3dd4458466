"""
Tests of eval.py on MMEB-V2's video and visual-document tasks: a whole run on fixtures in the real download
layouts (tests/downloads.py) with its table, JSON and kept results; the ranking it scores equals VLM2Vec's
metrics on the same matrix; planted embeddings score 1 where they should; task selection; --check_data.

    python -m pytest -q tests/test_eval_v2.py
"""
import json
import os
import shlex
import shutil

import pytest
import torch

import eval as evaluation
from common import UserError
from readers import mmeb_v2
from readers.mmeb_v2_data import V2_TASKS as V2_READERS
from readers.mmeb_v2_rows import read_v2_task, select_v2_tasks
from runs import results
from tests import downloads
from tests.toyrun import ROOT

slow = pytest.mark.slow


@pytest.fixture(scope="module")
def v2_dir(tmp_path_factory):
    """base/data/MMEB-V2 with its image tasks, a task of every video parser and three document sets."""
    base = str(tmp_path_factory.mktemp("v2"))
    downloads.mmeb_v2(base)
    downloads.mmeb_v2_visdoc(base)
    return downloads.mmeb_v2_video(base)


def readme_v2_commands():
    """The README's MMEB-V2 eval.py lines (the whole benchmark, then one family), as argument lists."""
    with open(os.path.join(ROOT, "README.md")) as f:
        lines = [line.strip() for line in f if line.startswith("python eval.py") and "--v2_dir=" in line]
    return [shlex.split(line.split("#")[0])[2:] for line in lines]


@slow
def test_the_readmes_commands_score_every_family_and_say_what_they_cover(tiny_checkpoint, v2_dir, capsys,
                                                                         monkeypatch):
    whole, family = readme_v2_commands()
    assert "--mmeb_dir=data/MMEB-V2/annotations" in whole and "--v2_tasks=['VID_QA']" in family
    monkeypatch.chdir(os.path.dirname(os.path.dirname(v2_dir)))  # where data/MMEB-V2 is
    speed = ["--device=cpu", "--dtype=float32", "--num_workers=0", "--batch_size=4", "--max_pixels=4096",
             "--geometry=False", f"--init_from={tiny_checkpoint}"]
    output = evaluation.main(whole + speed)
    v2 = output["mmeb_v2"]
    families = {mmeb_v2.V2_TASKS[n].family for n in v2["results"]}
    videos_and_documents = {f for f, names in mmeb_v2.FAMILIES.items()
                            if mmeb_v2.V2_TASKS[names[0]].modality != "image"}
    assert videos_and_documents <= families, families  # every video and visdoc family of the benchmark
    images = [n for n in v2["results"] if mmeb_v2.V2_TASKS[n].modality == "image"]
    assert images and images == [n for n in output["datasets"] if n in mmeb_v2.V2_TASKS]  # MMEB-V2's image rows
    for name, result in v2["results"].items():
        metric = mmeb_v2.V2_TASKS[name].metric
        assert 0 <= result[metric] <= 1 and result["num_queries"] > 0, name
        if name not in images:
            assert result["metric"] == metric and result["seconds_per_1000_items"] > 0
    scored = len(v2["results"])
    assert not v2["complete"] and v2["all"]["label"].startswith(f"mean of {scored} of 78 tasks")
    table = capsys.readouterr().out
    assert "MMEB-V2 overall" not in table and f"mean of {scored} of 78 tasks (partial" in table
    with open(output["config"]["out"]) as f:
        assert json.load(f)["mmeb_v2"]["all"]["present"] == v2["all"]["present"]
    # one family: the kept results read back, not encoded again
    monkeypatch.setattr(evaluation, "evaluate_v2_task", lambda *a, **k: pytest.fail("encoded again"))
    again = evaluation.main(family + speed)["mmeb_v2"]
    assert set(again["results"]) == set(mmeb_v2.FAMILIES["VID_QA"])
    assert again["families"]["VID_QA"]["mean"] == pytest.approx(v2["families"]["VID_QA"]["mean"])


def planted(task, dim=8):
    """Embeddings (queries then pool) where each query is the sum of its golds' vectors: every gold on top."""
    names = task["candidate_names"]
    pool = torch.eye(len(names), max(dim, len(names)))  # (M, D), one direction a candidate
    queries = torch.stack([sum(pool[names.index(g)] for g in gold) for gold in task["labels"]])  # (Q, D)
    return torch.cat([queries, pool])


@pytest.mark.parametrize("name", ["MSR-VTT", "Video-MME", "ViDoRe_arxivqa"])
def test_the_matrix_eval_builds_is_ranked_as_vlm2vec_ranks_it(v2_dir, name, monkeypatch):
    task = read_v2_task(v2_dir, name)
    embeddings = planted(task) + 0.01 * torch.randn(len(task["queries"]) + len(task["candidates"]),
                                                     planted(task).shape[1], generator=torch.Generator().manual_seed(0))
    monkeypatch.setattr(evaluation, "encode_shared", lambda embedder, items, *a, **k: (embeddings[:len(items)], 0))
    result = evaluation.evaluate_v2_task(None, task, "dot")
    q = len(task["queries"])
    expected = mmeb_v2.ranking_metrics((embeddings[:q] @ embeddings[q:].T).numpy(), task["candidate_names"],
                                       task["labels"], task["rel_scores"], task["local"])
    assert {k: result[k] for k in expected} == pytest.approx(expected, abs=1e-9)
    assert result["hit@1"] == 1.0  # each query's gold is its nearest candidate
    # the golds moved to the worst places: hit@1 0 (local tasks rank the row's own candidates only)
    monkeypatch.setattr(evaluation, "encode_shared", lambda embedder, items, *a, **k: (
        torch.cat([-embeddings[:q], embeddings[q:]]), 0))
    assert evaluation.evaluate_v2_task(None, task, "dot")["hit@1"] == 0.0


def test_image_tasks_carry_vlm2vec_v2s_hit_at_1_beside_p_at_1(tiny_embedder):
    rows = [{"query": {"text": f"item {k}", "image": None},
             "candidates": [{"text": f"item {k}", "image": None}] + [{"text": f"other {j}", "image": None}
                                                                     for j in range(3)]} for k in range(3)]
    result = evaluation.evaluate_dataset(tiny_embedder, rows, "cos")[0]
    assert result["v2_hit_at_1"] == result["precision_at_1"] == 100.0  # a query is its own gold: cos 1, no tie
    section = results.v2_section({}, {"ImageNet-1K": dict(result, num_queries=3)})
    assert section["results"]["ImageNet-1K"]["hit@1"] == 1.0 and section["modalities"]["image"]["present"] == [
        "ImageNet-1K"]


def test_tasks_are_chosen_by_key_family_or_modality(v2_dir):
    log = lambda *a, **k: None  # noqa: E731
    assert select_v2_tasks(v2_dir, ["MSR-VTT"], log) == ["MSR-VTT"]
    qa = select_v2_tasks(v2_dir, ["VID_QA"], log)
    assert qa == [n for n in mmeb_v2.FAMILIES["VID_QA"]]
    everything = select_v2_tasks(v2_dir, [], log)
    assert set(qa) <= set(everything) and all(mmeb_v2.V2_TASKS[n].modality != "image" for n in everything)
    assert "ViDoRe_biomedical_lectures_v2" not in everything  # VLM2Vec runs it, no MMEB-V2 mean has it
    with pytest.raises(UserError, match="image task"):
        select_v2_tasks(v2_dir, ["ImageNet-1K"], log)
    with pytest.raises(UserError, match="no MMEB-V2 video or visdoc task"):
        select_v2_tasks(v2_dir, ["MSRVTT"], log)


def test_check_data_reads_every_task_and_fails_on_a_missing_frame_folder(v2_dir, tmp_path):
    with pytest.raises(SystemExit) as code:
        evaluation.main([f"--v2_dir={v2_dir}", "--v2_tasks=['MSR-VTT', 'ViDoRe_arxivqa']", "--check_data=True"])
    assert code.value.code == 0
    broken = str(tmp_path / "broken")
    shutil.copytree(v2_dir, broken)
    frames = os.path.join(broken, "video-tasks", "frames", "video_ret", "MSR-VTT")
    shutil.rmtree(os.path.join(frames, sorted(os.listdir(frames))[0]))
    with pytest.raises(SystemExit) as code:
        evaluation.main([f"--v2_dir={broken}", "--v2_tasks=['MSR-VTT']", "--check_data=True"])
    assert code.value.code == 1


def test_an_english_only_vidore_v2_run_is_taken_by_name_scored_apart_and_in_no_mean(v2_dir, tiny_embedder, tmp_path):
    log = lambda *a, **k: None  # noqa: E731
    english = "ViDoRe_esg_reports_v2"  # VLM2Vec runs it beside the 78
    assert english in mmeb_v2.ENGLISH_ONLY and english not in mmeb_v2.V2_TASKS
    assert {n for n, t in V2_READERS.items() if not t.extra.get("scored", True)} == set(mmeb_v2.ENGLISH_ONLY)
    whole = str(tmp_path / "MMEB-V2")  # the ViDoRe v2 family whole, and the three English-only runs, from one set
    for repo in ("esg_reports_v2", "esg_reports_human_labeled_v2", "biomedical_lectures_v2", "economics_reports_v2"):
        shutil.copytree(os.path.join(v2_dir, "annotations", "esg_reports_v2"), os.path.join(whole, "annotations", repo))
    family = list(mmeb_v2.FAMILIES["ViDoRe_v2"])
    assert select_v2_tasks(whole, ["ViDoRe_v2"], log) == family == select_v2_tasks(whole, [], log)  # the 78's only
    assert select_v2_tasks(whole, list(mmeb_v2.ENGLISH_ONLY), log) == list(mmeb_v2.ENGLISH_ONLY)  # by name
    with pytest.raises(UserError, match="no MMEB-V2 video or visdoc task"):
        select_v2_tasks(whole, ["vidore_esg_reports_v2"], log)  # by its exact name only
    names = select_v2_tasks(whole, ["ViDoRe_v2", english], log)
    settings = {"dtype": "float32", "skip_bad_rows": False, "overwrite": False, "num_workers": 0, "batch_size": 4}
    per_task = evaluation.evaluate_v2(tiny_embedder, names, whole, str(tmp_path / "out"), settings, 0, 1, log, "x")
    assert set(per_task) == set(family) | {english} and per_task[english]["metric"] == "ndcg_linear@5"
    with_it = results.v2_section(per_task, {})
    without = results.v2_section({n: r for n, r in per_task.items() if n != english}, {})
    assert with_it["english_only"] == {english: pytest.approx(100 * per_task[english]["ndcg_linear@5"])}
    assert english not in with_it["tasks"] and english not in with_it["not_scored"] and not without["english_only"]
    for part in ("families", "modalities"):
        assert {k: c["mean"] for k, c in with_it[part].items()} == {k: c["mean"] for k, c in without[part].items()}
    assert with_it["all"] == without["all"] and with_it["families"]["ViDoRe_v2"]["present"] == family
    table = mmeb_v2.format_table_v2(with_it["results"], "MMEB-V2, a test model").splitlines()
    heading = next(i for i, line in enumerate(table) if line.startswith("ViDoRe v2, English-only"))
    rows = [i for i, line in enumerate(table) if line.split()[:1] == [english]]
    assert rows == [heading + 1] and heading > next(i for i, line in enumerate(table) if "visdoc: 4 of 24" in line)


def test_an_option_cut_to_nothing_is_embedded_and_ranked_like_any_other(tiny_embedder, tmp_path):
    # Video-MME's "C.It is a movie." has no space after its letter: VLM2Vec's cut, o[o.find('. '):].strip('. '),
    # leaves '' and VLM2Vec embeds it; eval.py embeds the prompt around nothing and scores the task
    root = str(tmp_path / "MMEB-V2")
    downloads.v2_videomme(root)
    options = ["A. Apples.", "B. Candles.", "C.It is a movie.", "D. The same number."]
    downloads.parquet(f"{root}/annotations/Video-MME/videomme/test-00000-of-00001.parquet", [
        {"question_id": "001-1", "videoID": "fFjv93ACGo8", "question": "Which decoration is most common?",
         "options": options, "answer": "C"}],
        [("question_id", downloads.STRING), ("videoID", downloads.STRING), ("question", downloads.STRING),
         ("options", downloads.STRINGS), ("answer", downloads.STRING)])
    task = read_v2_task(root, "Video-MME")
    texts = [c["text"] for c in task["candidates"]]
    assert "" in texts and task["labels"] == [[options[2]]]  # the empty option is the gold, a candidate like any
    log = lambda *a, **k: None  # noqa: E731
    settings = {"dtype": "float32", "skip_bad_rows": False, "overwrite": False, "num_workers": 0, "batch_size": 4}
    per_task = evaluation.evaluate_v2(tiny_embedder, ["Video-MME"], root, str(tmp_path / "out"), settings, 0, 1, log, "x")
    assert per_task["Video-MME"]["num_queries"] == 1 and per_task["Video-MME"]["candidates"] == 4
    assert 0.0 <= per_task["Video-MME"]["hit@1"] <= 1.0
    empty, apples = tiny_embedder.encode([{"text": "", "image": None}, {"text": "Apples", "image": None}])
    assert torch.isfinite(empty).all() and (empty - apples).abs().max() > 1e-3  # a vector of its own, ranked
