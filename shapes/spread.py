"""
The README's toy table with its spread: the main job (config/shapes_stage1.py, shapes_stage2.py, shapes_eval.py, as
the README runs them) over several seeds and instruction sets, each checkpoint of the table evaluated, then mean ± std
over every run; and how far floating-point order moves it: the first seed again at another torch thread count or
another instruction set (ATEN_CPU_CAPABILITY, the kernels another CPU runs: there the whole main job, the toy's
pretraining included), its figures and both stages' losses (step by step) set beside the first run's.

    python -m shapes.spread        # seeds 1337-1339 on this CPU's kernels and on the default ones, 1337 at 2 threads
    python -m shapes.spread --seeds="[1337]" --threads="[1]" --capabilities="['']"   # one run of the main job

Written under --out_dir (default out/spread): t<threads>[_<capability>]_s<seed>/{stage1,stage2}/ (train.py's out_dirs),
their evaluations .../eval_*.json, toy_<capability>/ (the toy prepared on those kernels), and spread.md / spread.json. Resumes as shapes/study.py does (a finished job
is not run again). The data is the main job's (python -m shapes.prepare writes it when missing).
"""
import json
import os
import subprocess
import sys
import types

import configurator
from common import install_error_hook
from shapes.prepare import DATA_DIR, ROOT
from shapes.study import flag, mean_std, run_jobs, write_tables

CHECKPOINTS = (("Stage I, step 100 (Stage II starts here)", "stage1", "step_000100"),
               ("Stage I, step 150 (its end)", "stage1", "export"), ("Stage II, step 150", "stage2", "export"))
COLUMNS = (("CLS", "Classification"), ("VQA", "VQA"), ("retrieval", "Retrieval"), ("grounding", "Visual Grounding"),
           ("IND", None), ("OOD", None), ("all", None))  # the table's image columns: eval.py's meta-tasks and means

seeds = [1337, 1338, 1339]  # train.py seeds of the spread
threads = [1, 2]  # torch threads: the spread at the first, the first seed again at each other (float order)
capabilities = ["", "default"]  # ATEN_CPU_CAPABILITY of the spread's runs ("": this CPU's own; or avx2, avx512)
out_dir = os.path.join(ROOT, "out", "spread")
data_dir = DATA_DIR
parallel = 2  # jobs at a time


def run_name(seed, count, capability=""):
    """The folder of one run of the main job: t<threads>_s<seed>, or t<threads>_<capability>_s<seed>."""
    return f"t{count}_{capability}_s{seed}" if capability else f"t{count}_s{seed}"


def runs_of(args):
    """-> [(seed, threads, capability)]: every seed on every instruction set at the first thread count (the spread),
    then the first seed at each other thread count on this CPU's own kernels (floating-point order alone)."""
    first, others = args.threads[0], args.threads[1:]
    return ([(seed, first, capability) for capability in args.capabilities for seed in args.seeds]
            + [(args.seeds[0], count, "") for count in others])


def toy_dir(out, data, capability):
    """The toy a run reads: the main job's, or on other kernels one prepared under them, its backbone pretrained
    there (the pretraining's float order is another CPU's too; the pictures and rows are the same)."""
    return os.path.join(out, f"toy_{capability}") if capability else data


def prepare_job(out, capability):
    """python -m shapes.prepare under ATEN_CPU_CAPABILITY=capability, as a job: toy_dir's toy."""
    folder = toy_dir(out, None, capability)
    return {"name": f"prepare {capability}", "env": {"ATEN_CPU_CAPABILITY": capability}, "cost": 200, "needs": [],
            "done": os.path.join(folder, "prepared.json"), "log": folder + ".log",
            "command": [sys.executable, "-m", "shapes.prepare", flag("out_dir", folder)]}


def train_job(name, config, out_dir, data, seed, threads, init_from, needs=(), env=None):
    """A train.py run of config on the toy at data (its three training files, its images), as a shapes/study.py
    job dict: done when out_dir's export is written."""
    train_data = [os.path.join(data, name) for name in ("train.jsonl", "train_video.jsonl", "train_docs.jsonl")]
    return {"name": name, "env": env or {}, "done": os.path.join(out_dir, "export", "pace.json"), "cost": 160,
            "needs": list(needs), "log": out_dir + ".log",
            "command": [sys.executable, "train.py", os.path.join("config", config), flag("seed", seed),
                        flag("threads", threads), flag("train_data", train_data),
                        flag("image_dir", os.path.join(data, "images")), flag("out_dir", out_dir),
                        flag("init_from", init_from)]}


def eval_job(name, data, checkpoint, result, needs, threads=1, env=None):
    """An eval.py run of config/shapes_eval.py on checkpoint, on the toy at data, written to result."""
    return {"name": name, "env": env or {}, "done": result, "cost": 40, "log": result + ".log", "needs": list(needs),
            "command": [sys.executable, "eval.py", os.path.join("config", "shapes_eval.py"), flag("threads", threads),
                        flag("init_from", checkpoint), flag("mmeb_dir", os.path.join(data, "eval")),
                        flag("image_dir", os.path.join(data, "images")), flag("v2_dir", os.path.join(data, "v2")),
                        flag("geometry", False), flag("out", result)]}


def jobs(seed, count, out, data, capability=""):
    """The main job's runs at one seed, thread count and instruction set, as shapes/study.py's job dicts: two
    stages, three evals."""
    data = toy_dir(out, data, capability)
    folder = os.path.join(out, run_name(seed, count, capability))
    stage = lambda name: os.path.join(folder, name)  # noqa: E731
    label, env = " ".join(filter(None, (f"t{count}", capability, f"s{seed}"))), (
        {"ATEN_CPU_CAPABILITY": capability} if capability else {})
    toy = [os.path.join(data, "prepared.json")] if capability else []  # its own toy, prepared first
    step_100 = os.path.join(stage("stage1"), "step_000100")
    found = [train_job(f"{label} stage1", "shapes_stage1.py", stage("stage1"), data, seed, count,
                       os.path.join(data, "tiny-qwen3.5"), toy, env),
             train_job(f"{label} stage2", "shapes_stage2.py", stage("stage2"), data, seed, count, step_100, [step_100],
                       env)]
    for k, (_, name, checkpoint) in enumerate(CHECKPOINTS):
        found.append(eval_job(f"{label} eval {k}", data, os.path.join(stage(name), checkpoint),
                              os.path.join(folder, f"eval_{k}.json"),
                              [os.path.join(stage(name), "export", "pace.json")], count, env))
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
    base, first = (args.seeds[0], args.threads[0], args.capabilities[0]), args.threads[0]
    runs = {run: [figures(os.path.join(args.out_dir, run_name(*run), f"eval_{k}.json"))
                  for k in range(len(CHECKPOINTS))] for run in runs_of(args)}
    spread_runs = [run for run in runs if run[1] == first]  # every seed on every instruction set
    names = list(runs[base][0])
    cell = lambda s: f"{s['mean']:.1f}" + (f" ± {s['std']:.1f}" if s["std"] is not None else "")  # noqa: E731
    kernels = " and ".join(c or "this CPU's own kernels" for c in args.capabilities)
    lines = [f"The main job over seeds {', '.join(map(str, args.seeds))} at {first} torch thread(s), on {kernels} "
             f"({len(spread_runs)} runs): mean ± sample standard deviation, then lowest to highest", "",
             "| toy checkpoint | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    table, ranges = {}, []
    for k, (label, _, _) in enumerate(CHECKPOINTS):
        values = {name: [runs[run][k][name] for run in spread_runs] for name in names}
        table[label] = {name: {**mean_std(v), "low": min(v), "high": max(v)} for name, v in values.items()}
        lines.append(f"| {label} | " + " | ".join(cell(table[label][name]) for name in names) + " |")
        ranges.append(f"| {label} | " + " | ".join(f"{min(v):.1f}-{max(v):.1f}" for v in values.values()) + " |")
    lines += ["", "| toy checkpoint | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|", *ranges]
    order = {}
    for run in [run for run in runs if run[0] == base[0] and run != base]:  # the first seed, another float order
        a, b = runs[base], runs[run]
        moved = {label: {name: b[k][name] - a[k][name] for name in names}
                 for k, (label, _, _) in enumerate(CHECKPOINTS)}
        gaps = {stage: loss_gap(*(os.path.join(args.out_dir, run_name(*r), stage) for r in (base, run)))
                for stage in ("stage1", "stage2")}
        largest = max(abs(v) for row in moved.values() for v in row.values())
        order[run_name(*run)] = {"moved": moved, "loss_gaps": gaps, "largest_move": largest}
        said = lambda stage: (f"differ by at most {gaps[stage][1]:.1e} (first at step {gaps[stage][0]})"  # noqa: E731
                              if gaps[stage][0] else "are equal")
        how = f"{run[1]} threads" if run[1] != first else f"ATEN_CPU_CAPABILITY={run[2] or 'its own'}"
        lines += ["", f"Seed {run[0]} at {how} against {run_name(*base)}: Stage I's losses {said('stage1')}, "
                      f"Stage II's {said('stage2')}; a figure moves by at most {largest:.1f} points (" + "; ".join(
                          f"{label.split(' (')[0]}: " + ", ".join(f"{n} {v:+.1f}" for n, v in row.items())
                          for label, row in moved.items()) + ")"]
    numbers = {"seeds": args.seeds, "threads": args.threads, "capabilities": args.capabilities, "table": table,
               "order": order}
    return "\n".join(lines) + "\n", numbers


def main(argv=None):
    args = configurator.configure(globals(), sys.argv[1:] if argv is None else argv)
    args = types.SimpleNamespace(**args)
    if not os.path.isfile(os.path.join(args.data_dir, "train_docs.jsonl")):
        subprocess.run([sys.executable, "-m", "shapes.prepare", f"--out_dir={args.data_dir}"], cwd=ROOT, check=True)
    out, data = os.path.abspath(args.out_dir), os.path.abspath(args.data_dir)
    run_jobs([prepare_job(out, capability) for capability in args.capabilities if capability]
             + [job for seed, count, capability in runs_of(args) for job in jobs(seed, count, out, data, capability)],
             args.parallel)
    text, numbers = summary(args)
    write_tables(args.out_dir, "spread", text, numbers)
    print(text, flush=True)


if __name__ == "__main__":
    install_error_hook()
    main()
