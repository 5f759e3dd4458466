"""shapes/study.py's own logic: the table's arithmetic from fake eval JSONs (the video and page tasks' metrics too),
the jobs' flags (the image rows alone, or the video and page rows beside them), the jobs it skips and the order it
runs the rest in (a fake process), and one tiny end-to-end study (one method, one seed, 2 steps) that a second run
skips entirely.

    python -m pytest -q tests/test_study.py               # -m "not slow": all but the end-to-end study, in seconds
"""
import json
import os

import pytest

from common import UserError
from shapes import study
from shapes.media_tasks import TASKS as MEDIA_TASKS, TRAIN_FILES



def fake_eval(path, overall, ind, ood, r, cos, r2=(None, None), own=None):
    """An eval.py JSON (own: {task: its headline metric, a fraction} of the video and page tasks) and the
    tools/geometry.py JSON beside it."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    metrics = dict(zip(MEDIA_TASKS, ("hit@1", "hit@1", "ndcg_linear@5")))
    with open(path, "w") as f:
        json.dump({"overall": overall, "IND": ind, "OOD": ood, **({"own_v2": {
            task: {"hit@1": -1.0, "metric": metrics[task], metrics[task]: value} for task, value in own.items()}}
            if own else {})}, f)
    with open(path[:-len(".json")] + "_geometry.json", "w") as f:
        json.dump({"norm_cos_pearson_r": r, "random_pair_mean_cos": cos,
                   "norm_from_direction_r2": {"2": r2[0], "10": r2[1]}}, f)


def test_table_is_mean_and_sample_std_over_seeds(tmp_path):
    for seed, overall, r in ((1, 20.0, -0.5), (2, 30.0, None), (3, 40.0, -0.7)):
        fake_eval(study.eval_path(str(tmp_path), seed, "pace"), overall, overall + 5, overall - 5, r, 0.1 * seed,
                  (0.1 * seed, 0.9), own={"Shapes-VID-RET": 0.01 * seed, "Shapes-VID-QA": 0.2,
                                          "Shapes-DOC-RET": 0.1 * seed})
        fake_eval(study.eval_path(str(tmp_path), seed, "vlm2vec"), 10.0, 10.0, 10.0, None, 0.5)
    fake_eval(study.eval_path(str(tmp_path), 1, "direct_dot"), 15.0, 16.0, 14.0, -0.8, 0.9)  # one seed only
    table = study.summarise(str(tmp_path), [1, 2, 3], ["pace", "vlm2vec", "direct_dot"])
    pace = table["pace"]
    assert pace["seeds"] == [1, 2, 3]
    assert pace["overall"]["mean"] == pytest.approx(30.0) and pace["overall"]["std"] == pytest.approx(10.0)
    assert pace["IND"]["mean"] == pytest.approx(35.0) and pace["OOD"]["mean"] == pytest.approx(25.0)
    assert pace["norm_cos_pearson_r"]["n"] == 2 and pace["norm_cos_pearson_r"]["mean"] == pytest.approx(-0.6)
    assert pace["random_pair_mean_cos"]["std"] == pytest.approx(0.1)
    assert table["vlm2vec"]["overall"]["std"] == 0.0 and table["vlm2vec"]["norm_cos_pearson_r"]["mean"] is None
    assert table["direct_dot"]["seeds"] == [1] and table["direct_dot"]["overall"]["std"] is None
    text = study.markdown(table, {"batch_size": 16, "start_step": 40, "stage2_steps": 60})
    assert pace["Shapes-DOC-RET"]["mean"] == pytest.approx(20.0)  # nDCG@5, the metric the result names, x 100
    assert ("| PACE | 30.0 ± 10.0 | 35.0 ± 10.0 | 25.0 ± 10.0 | -0.60 ± 0.14 | 0.20 ± 0.10 | 0.90 ± 0.00 | 0.20 ± 0.10 "
            "| 2.0 ± 1.0 | 20.0 ± 0.0 | 20.0 ± 10.0 | 3 |") in text
    assert ("| VLM2Vec (cos, LoRA, InfoNCE) | 10.0 ± 0.0 | 10.0 ± 0.0 | 10.0 ± 0.0 | – | – | – | 0.50 ± 0.00 | – | – "
            "| – | 3 |") in text  # an evaluation without the video and page tasks: '–'
    assert "| direct dot (dot, full, InfoNCE) | 15.0 | 16.0 | 14.0 | -0.80 | – | – | 0.90 | – | – | – | 1 |" in text


def test_jobs_share_stage1_runs_and_follow_the_paper():
    args = study.parse_args(["--seeds=5", "--out_dir=/tmp/study", "--data_dir=/tmp/shapes"])
    jobs = study.seed_jobs(5, args)
    assert len(jobs) == len(study.STAGE_I) + 8 + len(study.METHODS)  # shared Stage I runs, eight Stage II, all evals
    flags = {job["name"]: dict(a[2:].split("=", 1) for a in job["command"] if a.startswith("--")) for job in jobs}
    pace_stage1, pace = flags["seed 5 Stage I cos_lora_focal"], flags["seed 5 Stage II pace"]
    assert (pace_stage1["similarity"], pace_stage1["temperature"], pace_stage1["lora_rank"]) == ("cos", "0.1", "16")
    assert (pace_stage1["max_iters"], pace_stage1["keep_checkpoints"], pace_stage1["seed"]) == ("200", "[100]", "5")
    assert (pace["similarity"], pace["temperature"], pace["lora_rank"]) == ("dot", "6.4", "0")
    assert (pace["learning_rate"], pace_stage1["learning_rate"]) == ("0.0005", "0.003")  # full vs LoRA, as the toy
    assert pace["init_from"].endswith("stage1_cos_lora_focal/step_000100") and pace["max_iters"] == "100"
    assert flags["seed 5 Stage II no_focal"]["init_from"].endswith("stage1_cos_lora_plain/step_000100")
    assert flags["seed 5 Stage I dot_full_plain"]["focal_gamma"] == "0.0"
    assert flags["seed 5 eval pace"]["init_from"].endswith("stage2_pace/export")
    weighted = eval(flags["seed 5 Stage I cos_lora_focal_weighted"]["train_data"])  # the mixtures of the field
    assert [(os.path.basename(e["path"]), e["weight"]) for e in weighted] == [
        ("CLS.jsonl", 1), ("VQA.jsonl", 2), ("T2I.jsonl", 2), ("I2T.jsonl", 2), ("GRD.jsonl", 1)]
    assert flags["seed 5 Stage I cos_lora_focal_same"]["homogeneous_batch"] == "8"
    assert flags["seed 5 Stage II pace_mrl"]["matryoshka_dims"] == "[16, 32]"
    assert flags["seed 5 Stage II pace_mrl"]["init_from"].endswith("stage1_cos_lora_focal_mrl/step_000100")
    images, media = ["/tmp/shapes/train.jsonl"], ["/tmp/shapes/" + name for name in TRAIN_FILES.values()]
    assert eval(pace_stage1["train_data"]) == eval(pace["train_data"]) == images  # the image rows alone, as before
    assert eval(flags["seed 5 Stage I cos_lora_focal_media"]["train_data"]) == images + media  # and the videos, pages
    assert eval(flags["seed 5 Stage II media_pace"]["train_data"]) == images + media
    assert flags["seed 5 Stage II media_pace"]["init_from"].endswith("stage1_cos_lora_focal_media/step_000100")
    assert not {"media"} & (flags["seed 5 Stage II media_pace"].keys() | flags["seed 5 Stage I cos_lora_focal_media"])
    assert all(f["v2_dir"] == "/tmp/shapes/v2" for name, f in flags.items() if " eval " in name)  # every method
    with_dims = study.seed_jobs(5, study.parse_args(["--seeds=5", "--methods=pace", "--dims=[16, 32]",
                                                      "--out_dir=/tmp/study", "--data_dir=/tmp/shapes"]))
    assert [j["command"][-1] for j in with_dims if j["name"].startswith("seed 5 eval")] == [
        "--dim=0", "--dim=16", "--dim=32"]


class FakeProcess:
    """Stands in for subprocess.Popen: records the command and writes the file its job is known done by."""
    launched = []

    def __init__(self, command, **kwargs):
        FakeProcess.launched.append(command)
        out = next(a.split("=", 1)[1] for a in command if a.startswith(("--out_dir=", "--out=")))
        path = out if out.endswith(".json") else os.path.join(out, "export", "pace.json")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, "w").close()
        self.returncode = 0

    def poll(self):
        return 0


def test_existing_results_are_skipped_and_the_rest_wait_for_their_inputs(tmp_path, monkeypatch):
    args = study.parse_args(["--seeds=1", "--methods=pace,vlm2vec", f"--out_dir={tmp_path}", "--start_step=2"])
    jobs = study.seed_jobs(1, args)
    for job in jobs:  # everything done but PACE's Stage II and its evaluation
        if job["name"] not in ("seed 1 Stage II pace", "seed 1 eval pace"):
            os.makedirs(os.path.dirname(job["done"]), exist_ok=True)
            open(job["done"], "w").close()
    os.makedirs(os.path.join(tmp_path, "seed1", "stage1_cos_lora_focal", "step_000002"))
    monkeypatch.setattr(study.subprocess, "Popen", FakeProcess)
    FakeProcess.launched = []
    assert study.run_jobs(jobs, parallel=2) == 2
    assert [c[1] for c in FakeProcess.launched] == ["train.py", "eval.py"]  # the evaluation waited for the export
    assert study.run_jobs(jobs, parallel=2) == 0 and len(FakeProcess.launched) == 2


@pytest.mark.slow  # the study runs train.py, eval.py and tools/geometry.py as its jobs
def test_tiny_study_end_to_end_then_resumed(tmp_path, monkeypatch, tiny_checkpoint):
    import shutil
    from shapes.prepare import prepare
    data_dir = str(tmp_path / "shapes")
    prepare(data_dir, seed=0, num_train=120, num_eval=12, num_media=36)
    shutil.copytree(tiny_checkpoint, os.path.join(data_dir, "tiny-qwen3.5"))
    # one method of one stage: the real train.py and eval.py jobs and the geometry drawn from them (the two-stage
    # chaining of flags is test_jobs_share_stage1_runs_and_follow_the_paper's)
    argv = ["--seeds=7", "--methods=vlm2vec", f"--data_dir={data_dir}", f"--out_dir={tmp_path / 'study'}",
            "--batch_size=4", "--start_step=1", "--stage2_steps=1"]
    study.main(argv)
    with open(tmp_path / "study" / "results.json") as f:
        vlm2vec = json.load(f)["methods"]["vlm2vec"]
    assert vlm2vec["seeds"] == [7] and 0 <= vlm2vec["overall"]["mean"] <= 100
    assert vlm2vec["random_pair_mean_cos"]["mean"] is not None  # tools/geometry.py's, drawn from eval.py's sample
    assert all(0 <= vlm2vec[task]["mean"] <= 100 for task in MEDIA_TASKS)  # the video and page tasks, scored
    assert os.path.isfile(tmp_path / "study" / "geometry.png") and os.path.isfile(tmp_path / "study" / "results.md")
    monkeypatch.setattr(study.subprocess, "Popen", None)  # a second run must start nothing
    study.main(argv)
    with pytest.raises(UserError, match="another --out_dir"):
        study.main(argv[:-1] + ["--stage2_steps=2"])
