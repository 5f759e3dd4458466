"""
readers/mmeb_v2_rows.py and readers/mmeb_v2_data.py on miniature MMEB-V2 downloads (tests/downloads.py): per parser, the query and candidate
texts, names, labels, local lists and pool that VLM2Vec-V2's parser builds from the same rows (the expected values
written out from reading src/data/eval_dataset/*.py), the annotation files chosen (README configs, folders, split
words), frames, pages from files or bytes, and bad rows.

    python -m pytest -q tests/test_mmeb_v2_data.py
"""
import os

import pyarrow as pa
import pytest
from PIL import Image

from common import UserError
from readers.mmeb_v2_data import MVBENCH_SUBSETS, find_v2_tasks
from readers.mmeb_v2_rows import read_v2_task
from tests import downloads

P = ("Given a video and a question, select the most accurate answer from the provided candidates. Return only the "
     "exact text of your chosen answer. Question: ")  # the QA parsers' TASK_PROMPT
FRAMES = "video-tasks/frames"
CLIP = "<|video_1|> Understand the content of the provided video."


@pytest.fixture(scope="module")
def v2(tmp_path_factory):
    base = str(tmp_path_factory.mktemp("v2"))
    root = downloads.mmeb_v2_video(base)
    downloads.mmeb_v2_visdoc(base)
    downloads.parquet(f"{root}/annotations/HMDB51/data/test-00000-of-00001.parquet",
                      [{"video_id": "v", "pos_text": "wave"}], [("video_id", pa.string()), ("pos_text", pa.string())])
    downloads.frame_folder(f"{root}/{FRAMES}/video_cls/UCF101/v_Kayaking_g01_c01")  # frames, no annotations
    return root


def frames(folder):
    return [f"{folder}/frame_1.jpg", f"{folder}/frame_2.jpg", f"{folder}/frame_10.jpg"]  # natural order


def test_find_lists_the_tasks_present_and_what_the_others_lack(v2):
    present, partial = find_v2_tasks(v2)
    assert present == ["SmthSmthV2", "Breakfast", "MSR-VTT", "MSVD", "DiDeMo", "YouCook2", "VATEX", "QVHighlight",
                       "Charades-STA", "MomentSeeker", "Video-MME", "NExTQA", "EgoSchema", "MVBench", "ActivityNetQA",
                       "ViDoRe_arxivqa", "ViDoRe_esg_reports_v2", "ViDoRe_esg_reports_v2_multilingual",
                       "VisRAG_ArxivQA", "MMLongBench-doc"]
    assert partial["HMDB51"].startswith(f"no frames at {v2}/{FRAMES}/video_cls/HMDB51")
    assert partial["UCF101"].startswith(f"no annotations at {v2}/annotations/UCF101")
    assert "VLM2Vec/UCF101" in partial["UCF101"] and len(partial) == 2


def test_ssv2_reads_the_first_1000_test_rows_each_scored_on_its_own_choices(v2):
    task = read_v2_task(v2, "SmthSmthV2")
    assert len(task["queries"]) == 1000 and task["report"]["rows"] == 1000  # of 1,002; train.jsonl never read
    assert task["queries"][1] == {
        "text": "<|video_1|> What actions or object interactions are being performed by the person in the video?",
        "image": None, "video": frames(f"{v2}/{FRAMES}/video_cls/SSv2/1100")}
    assert task["labels"][:2] == [["Pushing something from left to right"], ["Closing something"]]
    assert task["local"][1] == ["Opening something", "Closing something", "Pulling something from right to left"]
    assert task["candidate_names"] == ["Pushing something from left to right", "Pulling something from right to left",
                                       "Closing something", "Opening something"]  # first seen, once each
    assert task["candidates"][3] == {"text": "Opening something", "image": None, "video": None}
    assert task["query_ids"][:3] == ["0", "1", "2"] and task["rel_scores"] is None


def test_classification_pools_the_rows_labels_then_every_class(v2):
    task = read_v2_task(v2, "Breakfast")
    assert task["queries"][0]["text"] == \
        "<|video_1|> Recognize the breakfast type that the person is cooking in the video. "  # its trailing space
    assert task["candidate_names"] == ["coffee", "tea", "pancake", "cereal", "sandwich", "scrambledegg", "friedegg",
                                       "milk", "juice", "salad"]
    assert task["labels"] == [["coffee"], ["tea"]] and task["local"] is None


def test_msrvtt_reads_its_readme_config_and_keeps_the_first_of_a_repeated_video(v2):
    task = read_v2_task(v2, "MSR-VTT")
    assert [q["text"] for q in task["queries"]] == [
        "Find a video that contains the following visual content: a woman creating a fondant baby and flower",
        "Find a video that contains the following visual content: a boy plays grand theft auto 5",
        "Find a video that contains the following visual content: a woman is making a cake"]
    assert task["queries"][0]["video"] is None and task["queries"][0]["image"] is None
    assert task["candidate_names"] == ["video7020", "video7021"]
    assert task["labels"] == [["video7020"], ["video7021"], ["video7020"]] and task["local"] is None
    assert task["candidates"][0] == {"text": CLIP, "image": None,
                                     "video": frames(f"{v2}/{FRAMES}/video_ret/MSR-VTT/video7020")}  # no ._ or .txt
    assert task["report"]["chosen_by"] == "README.md configs"
    assert list(task["report"]["files"]) == [f"{v2}/annotations/MSR-VTT/msrvtt_test_1k.json"]


@pytest.mark.parametrize("name, text, video, folder", [
    ("MSVD", "Find the video snippet that corresponds to the given summary: a squirrel is eating a peanut",
     "-4wsuPCjDBc_5_15", "video_ret/data/ziyan/video_retrieval/MSVD/frames"),  # Qwen3-VL-Embedding's nesting
    ("DiDeMo", "Find a video that includes the following described scenes: a girl in a pink shirt walks away",
     "10015567@N08_3655084291", "video_ret/DiDeMo"),
    ("YouCook2", ("Find a video that demonstrates the following action while making a recipe: spread margarine on "
                  "two slices of white bread"), "GLd3aX16zBg_0", "video_ret/YouCook2"),  # val, not the test file
    ("VATEX", "Select a video that fits the description provided: a man is playing the drums",
     "G9zN5TTuGO4_000179_000189", "video_ret/VATEX")])
def test_video_retrieval_texts_and_names(v2, name, text, video, folder):
    task = read_v2_task(v2, name)
    assert [q["text"] for q in task["queries"]] == [text]
    assert task["candidate_names"] == [video] and task["labels"] == [[video]]
    assert task["candidates"][0] == {"text": CLIP, "image": None, "video": frames(f"{v2}/{FRAMES}/{folder}/{video}")}


@pytest.mark.parametrize("name, folder, clips, text", [
    ("QVHighlight", "QVHighlight/NUsG9BgSes0_210.0_360.0", ["negative_2", "negative_10", "positive_0"],
     "a man talks to the camera"),
    ("Charades-STA", "Charades-STA/3MSZA", ["negative_0", "positive"], "person opens the door")])  # Qwen's spelling
def test_moment_retrieval_ranks_the_clips_beside_the_query_video(v2, name, folder, clips, text):
    task = read_v2_task(v2, name)
    video = f"{v2}/{FRAMES}/video_mret/{folder}"
    assert task["queries"] == [{"text": "<|video_1|> Find the clip that corresponds to the described scene in the "
                                        f"given video: {text}", "image": None, "video": frames(f"{video}/query")}]
    names = [f"{video}/{clip}" for clip in clips]  # named by their frame folders, in natural order; meta.json no clip
    assert task["local"] == [names] and task["candidate_names"] == names
    assert task["labels"] == [[next(n for n in names if os.path.basename(n).startswith("positive"))]]
    assert task["candidates"][0] == {"text": CLIP, "image": None, "video": frames(names[0])}


def test_momentseeker_reads_its_three_query_kinds_and_several_positives(v2):
    task = read_v2_task(v2, "MomentSeeker")
    seeker = f"{v2}/{FRAMES}/video_mret/MomentSeeker"

    def clip(name):
        return f"{seeker}/video_frames/clips_{name}"
    assert task["queries"] == [
        {"text": "Find the clip that corresponds to the given text: the dog jumps into the lake", "image": None,
         "video": None},
        {"text": "<|image_1|> Select the video clip that aligns with the given text and image: what happens next to "
                 "this cup", "image": f"{seeker}/query_cup_17.jpg", "video": None},
        {"text": "<|video_1|> Find the clip that corresponds to the given sentence and video segment: the same man "
                 "later", "image": None, "video": frames(f"{seeker}/video_frames/queries_movie101_77")}]
    assert task["labels"] == [[clip("ego4d_a_pos")], [clip("movie_b_pos1"), clip("movie_b_pos2")],
                              [clip("movie_c_pos")]]
    assert task["local"] == [[clip("ego4d_a_pos"), clip("ego4d_a_neg1"), clip("ego4d_a_neg2")],
                             [clip("movie_b_pos1"), clip("movie_b_pos2"), clip("ego4d_a_neg1")],
                             [clip("movie_c_pos"), clip("movie_b_pos1")]]
    assert task["candidate_names"] == [clip(n) for n in ("ego4d_a_pos", "ego4d_a_neg1", "ego4d_a_neg2",
                                                         "movie_b_pos1", "movie_b_pos2", "movie_c_pos")]
    assert task["candidates"][0]["text"] == "<|video_1|> Understand the content of the provided video clip."
    assert task["report"]["frame_budget"] == {"query": "all", "candidates": "all"}  # VLM2Vec's load_frames


def test_videomme_cuts_the_option_letters_off_its_candidates(v2):
    task = read_v2_task(v2, "Video-MME")
    assert task["queries"][0]["text"] == (
        "<|video_1|> Given a video and a question, select the most accurate answer from the provided candidates. "
        "Return only the exact text of your chosen answer. Question:  Which decoration is most common?\nA. Apples.\n"
        "B. Candles.\nC. Berries.\nD. The same number.")
    assert task["queries"][0]["video"] == frames(f"{v2}/{FRAMES}/video_qa/Video-MME/fFjv93ACGo8")
    assert [c["text"] for c in task["candidates"]] == ["Apples", "Candles", "Berries", "The same number"]
    assert task["local"] == [["A. Apples.", "B. Candles.", "C. Berries.", "D. The same number."]]
    assert task["labels"] == [["C. Berries."]]


def test_nextqa_egoschema_activitynetqa_texts_names_and_labels(v2):
    nextqa = read_v2_task(v2, "NExTQA")  # the MC folder, not OE beside it
    assert nextqa["queries"][0]["text"] == (
        f"<|video_1|> {P} how do the two man play the instrument\nOptions:\n(A) roll the handle\n(B) tap their feet\n"
        "(C) strum the string\n(D) hit with sticks\n(E) pat with hand")
    assert nextqa["queries"][0]["video"] == frames(f"{v2}/{FRAMES}/video_qa/NExTQA/4010069381")
    assert nextqa["local"] == [["roll the handle", "tap their feet", "strum the string", "hit with sticks",
                                "pat with hand"]]
    assert [c["text"] for c in nextqa["candidates"]] == nextqa["local"][0] and nextqa["labels"] == [["tap their feet"]]
    ego = read_v2_task(v2, "EgoSchema")  # Subset, not MC
    assert ego["queries"][0]["text"] == (f"<|video_1|> {P} What is c doing?A. c is cooking B. c is reading C. c is "
                                         "cleaning the table D. c is writing E. c is painting")
    assert [c["text"] for c in ego["candidates"]] == ["c is cooking", "c is reading", "c is cleaning the table",
                                                      "c is writing", "c is painting"]
    assert ego["local"][0][2] == "C. c is cleaning the table" and ego["labels"] == [["C. c is cleaning the table"]]
    anet = read_v2_task(v2, "ActivityNetQA")
    assert anet["queries"][0] == {"text": f"<|video_1|> {P} is the person in the video outdoors? (A) yes; (B) no.",
                                  "image": None, "video": frames(f"{v2}/{FRAMES}/video_qa/ActivityNetQA/v_Rp8ZbRd4Hu8")}
    assert anet["local"] == [["yes", "no"]] and anet["labels"] == [["yes"]]


def test_mvbench_concatenates_its_20_subsets_with_lettered_candidates(v2):
    task = read_v2_task(v2, "MVBench")
    assert len(task["queries"]) == 20 and task["report"]["rows"] == 20
    assert task["queries"][0] == {
        "text": f"<|video_1|> {P} What happened after the person took the food?\nOptions:\n(A) Ate the medicine.\n"
                "(B) Tidied up the blanket.\n(C) Put down the cup.", "image": None,
        "video": frames(f"{v2}/{FRAMES}/video_qa/MVBench/episodic_reasoning/episodic_reasoning_1.mp4")}
    assert task["labels"][0] == ["(B) Tidied up the blanket."]
    antonym = MVBENCH_SUBSETS.index("action_antonym")
    assert task["local"][antonym] == ["(A) not sure", "(B) throwing", "(C) throwing"]
    assert task["labels"][antonym] == ["(C) throwing"]  # qa_template keeps the last equal candidate
    assert task["candidate_names"] == ["(A) Ate the medicine.", "(B) Tidied up the blanket.", "(C) Put down the cup.",
                                       "(A) not sure", "(B) throwing", "(C) throwing"]
    assert task["queries"][19]["video"] == \
        frames(f"{v2}/{FRAMES}/video_qa/MVBench/counterfactual_inference/counterfactual_inference_1.mp4")


def test_vidore_labels_are_the_graded_qrels_above_0_and_the_pool_the_whole_corpus(v2):
    task = read_v2_task(v2, "ViDoRe_arxivqa")
    assert [q["text"] for q in task["queries"]] == [
        "Find a document image that matches the given query: Which figure shows the loss curve?",
        "Find a document image that matches the given query: What is the accuracy in Table 2?"]
    assert task["query_ids"] == ["0", "1"]
    # page 12's score-0 qrel is no label of query 0; 11's repeated pair keeps its larger score. The grades stay in
    # the qrels' order (11: 1.0, 10: 2.0) and the golds take list(set(int ids))'s order, as VLM2Vec's RankingMetrics
    # pairs them: its published nDCG gives page 10 the grade 1.0 and page 11 the grade 2.0
    assert task["labels"] == [["10", "11"], ["10", "12"]]
    assert task["labels"] == [[str(i) for i in set(ids)] for ids in ([11, 10], [12, 10])]
    assert task["rel_scores"] == [[1.0, 2.0], [1.0, 1.0]]
    assert task["candidate_names"] == ["11", "10", "12", "13"] and len(task["candidates"]) == 4
    page = task["candidates"][0]
    assert page["text"] == "<|image_1|> Understand the content of the provided document image."
    assert isinstance(page["image"], Image.Image) and page["image"].size == (31, 41)  # page 11, from its bytes
    assert task["candidates"][0]["image"] is not page["image"]  # opened afresh on each access
    assert [c["image"].size for c in task["candidates"][1:3]] == [(30, 40), (32, 42)]
    assert task["report"]["pages"] == {"files": 0, "bytes": 4} and task["local"] is None


def test_vidore_v2_filters_by_language_and_takes_pages_from_files_when_there(v2):
    english = read_v2_task(v2, "ViDoRe_esg_reports_v2")
    assert english["query_ids"] == ["0"] and english["labels"] == [["5"]]
    assert english["candidate_names"] == ["5", "6"] and english["report"]["pages"] == {"files": 0, "bytes": 2}
    both = read_v2_task(v2, "ViDoRe_esg_reports_v2_multilingual")
    assert both["query_ids"] == ["0", "1"] and both["labels"] == [["5"], ["5", "6"]]
    assert both["rel_scores"] == [[1.0], [2.0, 1.0]]
    assert [c["image"] for c in both["candidates"]] == [f"{v2}/visdoc-tasks/esg_reports_v2_multilingual/5.png",
                                                        f"{v2}/visdoc-tasks/esg_reports_v2_multilingual/6.png"]


def test_visrag_finds_a_page_file_by_its_md5_name(v2):
    task = read_v2_task(v2, "VisRAG_ArxivQA")
    long_id = "1709.01234_figure_2_a_rather_long_file_name_that_goes_well_past_fifty_characters.png"
    assert task["candidate_names"] == [long_id, "short.jpeg"] and task["labels"] == [[long_id], ["short.jpeg"]]
    assert task["query_ids"] == ["q-1", "q-2"]
    assert task["candidates"][0]["image"] == \
        f"{v2}/visdoc-tasks/images/VisRAG_ArxivQA/1709.01234_figure_2_a_rather_long_file_name_that_g_88505baf.png"
    assert task["candidates"][1]["image"].size == (12, 9)  # short_2b3568f3.jpeg is not there: its bytes


def test_a_missing_frame_folder_is_an_error_naming_it_or_a_counted_skip(tmp_path):
    v2 = downloads.mmeb_v2_video(str(tmp_path), names=["MSR-VTT"])
    missing = f"{v2}/{FRAMES}/video_ret/MSR-VTT/video7021"
    for name in os.listdir(missing):
        os.remove(os.path.join(missing, name))
    os.rmdir(missing)
    with pytest.raises(UserError, match=f"msrvtt_test_1k.json row 1 .*no frame folder {missing}"):
        read_v2_task(v2, "MSR-VTT")
    task = read_v2_task(v2, "MSR-VTT", skip_bad_rows=True)
    assert task["report"]["skipped"] == {"missing frame folder": 1} and task["report"]["rows"] == 3
    assert task["query_ids"] == ["0", "2"] and task["candidate_names"] == ["video7020"]
    os.rename(f"{v2}/{FRAMES}/video_ret/MSR-VTT", f"{v2}/{FRAMES}/video_ret/elsewhere")
    with pytest.raises(UserError, match="no frames at .*video_ret/MSR-VTT or .*video_retrieval/MSR-VTT/frames"):
        read_v2_task(v2, "MSR-VTT")
    with pytest.raises(UserError, match="huggingface-cli download --repo-type dataset VLM2Vec/MSVD"):
        read_v2_task(v2, "MSVD")


def test_a_query_with_no_qrel_above_0_is_a_bad_row(tmp_path):
    v2 = downloads.mmeb_v2_visdoc(str(tmp_path))
    downloads.parquet(f"{v2}/annotations/arxivqa_test_subsampled_beir/qrels/test-00000-of-00001.parquet",
                      [{"query-id": 0, "corpus-id": 11, "score": 1.0}, {"query-id": 1, "corpus-id": 12, "score": 0.0}],
                      [("query-id", pa.int64()), ("corpus-id", pa.int64()), ("score", pa.float64())])
    with pytest.raises(UserError, match="queries/test-00000-of-00001.parquet row 1 .*1: no qrels with a score above 0"):
        read_v2_task(v2, "ViDoRe_arxivqa")
    task = read_v2_task(v2, "ViDoRe_arxivqa", skip_bad_rows=True)
    assert task["query_ids"] == ["0"] and task["report"]["skipped"] == {"no relevant page": 1}
    assert task["candidate_names"] == ["11", "10", "12", "13"]  # the corpus stays whole
    with pytest.raises(UserError, match="not an MMEB-V2 video or visdoc task"):
        read_v2_task(v2, "ImageNet-1K")


def test_an_answer_none_of_the_options_is_a_miss_as_vlm2vec_scores_it(tmp_path):
    # VLM2Vec keeps such rows: MVBench's qa_template names the gold "(@) answer" (the letter before A), SmthSmthV2's
    # and ActivityNetQA's golds are their label; no ranking holds them, so they count as misses, not as skipped rows
    from readers.mmeb_v2_data import V2_TASKS
    from readers.mmeb_v2_rows import activitynetqa, mvbench, video_classification
    root = str(tmp_path)
    for folder in ("episodic_reasoning/clip.mp4", "v_walk", "ssv2_1"):
        downloads.frame_folder(os.path.join(root, folder))
    _, candidates, gold = mvbench({"subset": "episodic_reasoning", "video": "clip.mp4", "question": "Who?",
                                   "candidates": ["a cat", "a dog"], "answer": "a bird"}, root, V2_TASKS["MVBench"])
    assert gold == ["(@) a bird"] and [n for n, _ in candidates] == ["(A) a cat", "(B) a dog"]
    _, candidates, gold = activitynetqa({"video_name": "walk", "question": "Is it raining", "answer": "maybe"}, root,
                                        V2_TASKS["ActivityNetQA"])
    assert gold == ["maybe"] and [n for n, _ in candidates] == ["yes", "no"]
    _, candidates, gold = video_classification({"video_id": "ssv2_1", "pos_text": "Pushing", "neg_text": ["Pulling"]},
                                               root, V2_TASKS["SmthSmthV2"])
    assert gold == ["Pushing"] and [n for n, _ in candidates] == ["Pulling"]
    from readers import mmeb_v2
    assert mmeb_v2.ranking_metrics([[0.9, 0.1]], ["(A) a cat", "(B) a dog"], [gold]) == pytest.approx(
        mmeb_v2.ranking_metrics([[0.9, 0.1]], ["(A) a cat", "(B) a dog"], [["(C) none"]]))
    assert mmeb_v2.ranking_metrics([[0.9, 0.1]], ["(A) a cat", "(B) a dog"], [gold])["hit@10"] == 0.0


def test_a_json_file_that_does_not_parse_is_named_with_one_line_number(tmp_path):
    from readers.hf_files import json_records
    path = tmp_path / "rows.json"
    path.write_text('[{"a": 1},\n {"b": 2,}]')  # a trailing comma on line 2
    with pytest.raises(UserError) as error:
        list(json_records(str(path)))
    message = str(error.value)
    assert message.startswith(f"{path}: not a JSON array (line 2, column 10: ")
    assert message[len(str(path)):].count("line") == 1
