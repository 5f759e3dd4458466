"""
The README's toy table with its spread: the main job (config/shapes_stage1.py, shapes_stage2.py, shapes_eval.py, as
the README runs them) over several seeds, each checkpoint of the table evaluated, then mean ± std over the seeds; and
how far floating-point order moves it: the first seed again at another torch thread count (another summation order,
as another CPU's kernels have), its figures and both stages' losses (step by step) set beside the one-thread run's.

    python -m shapes.spread                                        # seeds 1337-1339 at 1 thread, seed 1337 at 2
    python -m shapes.spread --seeds="[1337]" --threads="[1]"       # one run of the main job, no spread

Written under --out_dir (default out/spread): t<threads>_s<seed>/{stage1,stage2}/ (train.py's out_dirs), their
evaluations t<T>_s<S>/eval_*.json, and spread.md / spread.json. Resumes as shapes/study.py does (a finished job
is not run again). The data is the main job's (python -m shapes.prepare writes it when missing).
"""
import json
import os
import subprocess
import sys
import types

import configurator
from common import install_error_hook, write_json, write_text
from shapes.prepare import DATA_DIR, ROOT
from shapes.study import flag, mean_std, run_jobs

CHECKPOINTS = (("Stage I, step 100 (Stage II starts here)", "stage1", "step_000100"),
               ("Stage I, step 150 (its end)", "stage1", "export"), ("Stage II, step 150", "stage2", "export"))
COLUMNS = (("CLS", "Classification"), ("VQA", "VQA"), ("retrieval", "Retrieval"), ("grounding", "Visual Grounding"),
           ("IND", None), ("OOD", None), ("all", None))  # the table's image columns: eval.py's meta-tasks and means

seeds = [1337, 1338, 1339]  # train.py seeds of the spread
threads = [1, 2]  # torch threads: the spread at the first, the first seed again at each other (float order)
out_dir = os.path.join(ROOT, "out", "spread")
data_dir = DATA_DIR
parallel = 2  # jobs at a time


def jobs(seed, count, out, data):
    """The main job's runs at one seed and thread count, as shapes/study.py's job dicts: two stages, three evals."""
    folder, common = os.path.join(out, f"t{count}_s{seed}"), [flag("seed", seed), flag("threads", count)]
    where = [flag("train_data", [os.path.join(data, name) for name in ("train.jsonl", "train_video.jsonl",
                                                                      "train_docs.jsonl")]),
             flag("image_dir", os.path.join(data, "images"))]
    stage = lambda name: os.path.join(folder, name)  # noqa: E731
    train = lambda name, config, *args, needs=(): {  # noqa: E731
        "name": f"t{count} s{seed} {name}", "done": os.path.join(stage(name), "export", "pace.json"),
        "command": [sys.executable, "train.py", os.path.join("config", config), *common, *where,
                    flag("out_dir", stage(name)), *args], "needs": list(needs), "cost": 160,
        "log": stage(name) + ".log"}
    found = [train("stage1", "shapes_stage1.py", flag("init_from", os.path.join(data, "tiny-qwen3.5"))),
             train("stage2", "shapes_stage2.py", flag("init_from", os.path.join(stage("stage1"), "step_000100")),
                   needs=[os.path.join(stage("stage1"), "step_000100")])]
    for k, (_, name, checkpoint) in enumerate(CHECKPOINTS):
        result = os.path.join(folder, f"eval_{k}.json")
        found.append({"name": f"t{count} s{seed} eval {k}", "done": result, "cost": 40, "log": result + ".log",
                      "needs": [os.path.join(stage(name), "export", "pace.json")],
                      "command": [sys.executable, "eval.py", os.path.join("config", "shapes_eval.py"),
                                  flag("threads", count), flag("init_from", os.path.join(stage(name), checkpoint)),
                                  flag("mmeb_dir", os.path.join(data, "eval")), flag("image_dir",
                                  os.path.join(data, "images")), flag("v2_dir", os.path.join(data, "v2")),
                                  flag("geometry", False), flag("out", result)]})
    return found


def figures(path):
    """An evaluation's JSON -> {column: value}: the image meta-tasks and means (P@1), each own video or page task's
    MMEB-V2 metric x 100."""
    with open(path) as f:
        result = json.load(f)
    values = {column: result["meta_tasks"][task] if task else result[{"all": "overall"}.get(column, column)]
              for column, task in COLUMNS}
    return {**values, **{task: 100 * own[own["metric"]] for task, own in sorted(result.get("own_v2", {}).items())}}


def losses(folder):
    """-> {step: loss} of a train.py out_dir's log.jsonl (a slow run logs extra steps: match them by step)."""
    with open(os.path.join(folder, "log.jsonl")) as f:
        return {record["step"]: record["loss"] for record in map(json.loads, f) if "loss" in record}


def loss_gap(folder, other):
    """-> (first step whose losses differ or None, largest |difference|) over the steps both runs logged."""
    a, b = losses(folder), losses(other)
    gaps = [(step, abs(a[step] - b[step])) for step in sorted(set(a) & set(b))]
    return next((step for step, gap in gaps if gap), None), max((gap for _, gap in gaps), default=0.0)


def summary(args):
    """-> (spread.md's text, spread.json's dict)."""
    base = args.threads[0]
    runs = {(count, seed): [figures(os.path.join(args.out_dir, f"t{count}_s{seed}", f"eval_{k}.json"))
                            for k in range(len(CHECKPOINTS))]
            for count in args.threads for seed in (args.seeds if count == base else args.seeds[:1])}
    names = list(runs[base, args.seeds[0]][0])
    cell = lambda s: f"{s['mean']:.1f}" + (f" ± {s['std']:.1f}" if s["std"] is not None else "")  # noqa: E731
    lines = [f"The main job over seeds {', '.join(map(str, args.seeds))} at {base} torch thread(s): mean ± sample "
             "standard deviation", "", "| toy checkpoint | " + " | ".join(names) + " |",
             "|---" * (len(names) + 1) + "|"]
    table = {}
    for k, (label, _, _) in enumerate(CHECKPOINTS):
        table[label] = {name: mean_std([runs[base, seed][k][name] for seed in args.seeds]) for name in names}
        lines.append(f"| {label} | " + " | ".join(cell(table[label][name]) for name in names) + " |")
    order = {}
    for count in args.threads[1:]:  # the same seed at another thread count: another floating-point order
        seed, a, b = args.seeds[0], runs[base, args.seeds[0]], runs[count, args.seeds[0]]
        moved = {label: {name: b[k][name] - a[k][name] for name in names}
                 for k, (label, _, _) in enumerate(CHECKPOINTS)}
        gaps = {stage: loss_gap(*(os.path.join(args.out_dir, f"t{c}_s{seed}", stage) for c in (base, count)))
                for stage in ("stage1", "stage2")}
        largest = max(abs(v) for row in moved.values() for v in row.values())
        order[count] = {"moved": moved, "loss_gaps": gaps, "largest_move": largest}
        said = lambda stage: (f"differ by at most {gaps[stage][1]:.1e} (first at step {gaps[stage][0]})"  # noqa: E731
                              if gaps[stage][0] else "are equal")
        lines += ["", f"Seed {seed} at {count} threads against {base}: Stage I's losses {said('stage1')}, Stage II's "
                      f"{said('stage2')}; a figure moves by at most {largest:.1f} points (" + "; ".join(
                          f"{label.split(' (')[0]}: " + ", ".join(f"{n} {v:+.1f}" for n, v in row.items())
                          for label, row in moved.items()) + ")"]
    return "\n".join(lines) + "\n", {"seeds": args.seeds, "threads": args.threads, "table": table, "order": order}


def main(argv=None):
    args = configurator.configure(globals(), sys.argv[1:] if argv is None else argv)
    args = types.SimpleNamespace(**args)
    if not os.path.isfile(os.path.join(args.data_dir, "train_docs.jsonl")):
        subprocess.run([sys.executable, "-m", "shapes.prepare", f"--out_dir={args.data_dir}"], cwd=ROOT, check=True)
    run_jobs([job for count in args.threads for seed in (args.seeds if count == args.threads[0] else args.seeds[:1])
              for job in jobs(seed, count, os.path.abspath(args.out_dir), os.path.abspath(args.data_dir))],
             args.parallel)
    text, numbers = summary(args)
    write_text(os.path.join(args.out_dir, "spread.md"), text)
    write_json(os.path.join(args.out_dir, "spread.json"), numbers)
    print(text, flush=True)


if __name__ == "__main__":
    install_error_hook()
    main()
