"""
shapes/spread.py, the README toy table's spread: its jobs are the main job's commands at each seed, thread count and
instruction set, and its summary is the mean ± std over seeds and instruction sets of what eval.py wrote, with the
moves of the first seed at another thread count or instruction set.

    python -m pytest -q tests/test_spread.py
"""
import json
import os
import re
import types

import pytest

from shapes import spread


def write_run(folder, values, losses, steps):
    """A finished run's three evaluations (eval.py's JSON: meta-tasks, means, own tasks) and both stages' logs."""
    os.makedirs(folder)
    for k, v in enumerate(values):
        result = {"meta_tasks": {"Classification": v, "VQA": v + 1, "Retrieval": v + 2, "Visual Grounding": v + 3},
                  "IND": v + 4, "OOD": v + 5, "overall": v + 6,
                  "own_v2": {"Shapes-VID-RET": {"metric": "hit@1", "hit@1": v / 100}}}
        with open(os.path.join(folder, f"eval_{k}.json"), "w") as f:
            json.dump(result, f)
    for stage, scale in (("stage1", 1.0), ("stage2", 0.5)):
        os.makedirs(os.path.join(folder, stage))
        with open(os.path.join(folder, stage, "log.jsonl"), "w") as f:
            f.writelines(json.dumps({"step": step, "loss": scale * loss}) + "\n" for step, loss in zip(steps, losses))


def test_the_jobs_are_the_main_jobs_commands_at_each_seed_and_thread_count(tmp_path):
    jobs = spread.jobs(1338, 2, str(tmp_path), "/data")
    commands = [" ".join(job["command"]) for job in jobs]
    assert [os.path.basename(job["command"][1]) for job in jobs] == ["train.py", "train.py"] + ["eval.py"] * 3
    assert all("--seed=1338" in c and "--threads=2" in c for c in commands[:2]) and "--threads=2" in commands[2]
    assert "config/shapes_stage1.py" in commands[0] and "--init_from=/data/tiny-qwen3.5" in commands[0]
    assert f"--init_from={tmp_path}/t2_s1338/stage1/step_000100" in commands[1]  # Stage II from step 100
    assert [c.split("--init_from=")[1].split()[0] for c in commands[2:]] == [
        f"{tmp_path}/t2_s1338/stage1/step_000100", f"{tmp_path}/t2_s1338/stage1/export",
        f"{tmp_path}/t2_s1338/stage2/export"]
    assert jobs[1]["needs"] == [f"{tmp_path}/t2_s1338/stage1/step_000100"]
    assert all(job["env"] == {} for job in jobs)  # this CPU's own kernels
    other = spread.jobs(1338, 1, str(tmp_path), "/data", "default")
    assert all(job["env"] == {"ATEN_CPU_CAPABILITY": "default"} for job in other)
    assert f"--out_dir={tmp_path}/t1_default_s1338/stage1" in other[0]["command"]
    # on other kernels the whole main job: a toy prepared there, its backbone pretrained there, read by every job
    prepare = spread.prepare_job(str(tmp_path), "default")
    assert prepare["command"][1:] == ["-m", "shapes.prepare", f"--out_dir={tmp_path}/toy_default"]
    assert prepare["env"] == {"ATEN_CPU_CAPABILITY": "default"} and other[0]["needs"] == [prepare["done"]]
    assert f"--init_from={tmp_path}/toy_default/tiny-qwen3.5" in other[0]["command"]
    assert all("/data" not in " ".join(job["command"]) for job in other)


def test_the_runs_are_every_seed_on_every_instruction_set_then_the_first_seed_at_other_thread_counts():
    args = types.SimpleNamespace(seeds=[1, 2], threads=[1, 2, 4], capabilities=["", "default"])
    assert spread.runs_of(args) == [(1, 1, ""), (2, 1, ""), (1, 1, "default"), (2, 1, "default"), (1, 2, ""),
                                    (1, 4, "")]


def test_the_summary_is_the_mean_and_spread_over_seeds_and_kernels_and_the_moves_of_another_float_order(tmp_path):
    for seed, base in ((1, 40.0), (2, 42.0), (3, 44.0)):
        write_run(str(tmp_path / f"t1_s{seed}"), [base, base + 10, base + 20], [3.0, 2.5, 2.0, 1.9],
                  steps=(1, 3, 5, 7))
    for seed, base in ((1, 39.0), (2, 43.0), (3, 46.0)):  # the same seeds on the default kernels
        write_run(str(tmp_path / f"t1_default_s{seed}"), [base, base + 10, base + 20], [3.0, 2.5, 2.0, 1.8],
                  steps=(1, 3, 5, 7))
    # the two-thread run logged an extra step 2 (a slow run logs by time too): losses are matched by step
    write_run(str(tmp_path / "t2_s1"), [41.0, 49.5, 60.0], [3.0, 2.7, 2.5, 2.0001, 1.9], steps=(1, 2, 3, 5, 7))
    text, numbers = spread.summary(types.SimpleNamespace(seeds=[1, 2, 3], threads=[1, 2],
                                                         capabilities=["", "default"], out_dir=str(tmp_path)))
    first = numbers["table"][spread.CHECKPOINTS[0][0]]
    six = [40.0, 42.0, 44.0, 39.0, 43.0, 46.0]  # the spread is over all six runs
    assert first["CLS"]["mean"] == pytest.approx(42.333333) and first["CLS"]["std"] == pytest.approx(
        (sum((v - 42.333333) ** 2 for v in six) / 5) ** 0.5)
    assert (first["CLS"]["low"], first["CLS"]["high"]) == (39.0, 46.0)
    assert first["all"]["mean"] == pytest.approx(48.333333) and first["Shapes-VID-RET"]["mean"] == pytest.approx(
        42.333333)
    assert "| Stage II, step 150 | 62.3 ± 2.6 | 63.3 ± 2.6 |" in text and "| Stage II, step 150 | 59.0-66.0 |" in text
    kernels = numbers["order"]["t1_default_s1"]
    assert kernels["largest_move"] == pytest.approx(1.0) and kernels["loss_gaps"]["stage1"] == (7, pytest.approx(0.1))
    assert "Seed 1 at ATEN_CPU_CAPABILITY=default against t1_s1" in text
    order = numbers["order"]["t2_s1"]
    assert order["loss_gaps"]["stage1"] == (5, pytest.approx(1e-4)) and order["largest_move"] == pytest.approx(1.0)
    assert order["loss_gaps"]["stage2"] == (5, pytest.approx(5e-5))
    assert order["moved"][spread.CHECKPOINTS[1][0]]["CLS"] == pytest.approx(-0.5)
    assert ("Stage I's losses differ by at most 1.0e-04 (first at step 5), Stage II's differ by at most 5.0e-05 "
            "(first at step 5); a figure moves by at most 1.0 points") in text


def test_the_readmes_toy_table_gives_every_figure_with_its_spread():
    readme = open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")).read()
    rows = [line for line in readme.splitlines() if line.startswith(("| Stage I, step", "| Stage II, step"))]
    assert len(rows) == len(spread.CHECKPOINTS)
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")][1:]  # after the checkpoint
        assert len(cells) >= len(spread.COLUMNS) and all(
            re.fullmatch(r"\d+\.\d ± \d+\.\d", c) for c in cells), row
    assert "floating-point order" in readme.lower() and "python -m shapes.spread" in readme


def test_the_merge_rows_merge_every_pair_of_seeds_and_set_each_beside_its_seeds(tmp_path):
    from shapes import merged
    jobs = merged.jobs(str(tmp_path), "/data", "own", 1337, 1338, 1337)
    assert jobs[0]["command"][1:3] == ["-m", "tools.merge"] and jobs[1]["needs"] == [jobs[0]["done"]]
    assert f"--inputs={[f'{tmp_path}/t1_s1337/stage2/export', f'{tmp_path}/t1_s1338/stage2/export']!r}" in \
        jobs[0]["command"]
    assert f"--init_from={tmp_path}/merged_own_s1337_s1338/export" in jobs[1]["command"]
    shared = merged.jobs(str(tmp_path), "/data", "shared", 1337, 1338, 1337)[0]["command"]
    assert f"--inputs={[f'{tmp_path}/t1_s1337/stage2/export', f'{tmp_path}/shared_s1338/stage2/export']!r}" in shared
    train = merged.shared_jobs(str(tmp_path), "/data", 1338, 1337)[0]["command"]  # one start: seed 1337's Stage I
    assert "config/shapes_stage2.py" in train and "--seed=1338" in train
    assert f"--init_from={tmp_path}/t1_s1337/stage1/step_000100" in train
    values = {"own": ((40.0, 44.0, 48.0), (43.0, 45.0, 49.0)), "shared": ((40.0, 42.0, 44.0), (41.0, 42.0, 43.0))}
    write = lambda path, v: json.dump(  # noqa: E731 - eval.py's JSON, every figure v
        {"meta_tasks": {"Classification": v, "VQA": v, "Retrieval": v, "Visual Grounding": v}, "IND": v, "OOD": v,
         "overall": v, "own_v2": {"Shapes-VID-RET": {"metric": "hit@1", "hit@1": v / 100}}}, open(path, "w"))
    for kind, (single, merges) in values.items():
        for seed, v in zip((1, 2, 3), single):
            path = merged.run_files(str(tmp_path), kind, seed, 1)[1]
            os.makedirs(os.path.dirname(path), exist_ok=True)
            if not (kind == "shared" and seed == 1):  # the first seed's shared run is its own run
                write(path, v)
        for (a, b), v in zip(((1, 2), (1, 3), (2, 3)), merges):
            os.makedirs(tmp_path / f"merged_{kind}_s{a}_s{b}")
            write(tmp_path / f"merged_{kind}_s{a}_s{b}" / "eval.json", v)
    text, numbers = merged.summary(str(tmp_path), [1, 2, 3])
    table = numbers["table"]
    assert table["own: one seed"]["all"]["values"] == [40.0, 44.0, 48.0]
    assert table["shared: one seed"]["all"]["values"] == [40.0, 42.0, 44.0]  # seed 1: the own run's figures
    # each merge minus its runs' mean: 43 - 42, 45 - 44, 49 - 46; shared 41 - 41, 42 - 42, 43 - 43
    assert table["own: merged minus its two seeds' mean"]["all"]["values"] == pytest.approx([1.0, 1.0, 3.0])
    assert table["shared: merged minus its two seeds' mean"]["all"]["values"] == pytest.approx([0.0, 0.0, 0.0])
    assert "s1+s2 all 43.0 (seeds 40.0, 44.0)" in text and "| shared: two seeds merged |" in text
