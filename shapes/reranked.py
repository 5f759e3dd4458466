"""
shapes/reranked.py: the toy's reranker and distillation rows. At each seed, beside the main job (shapes/spread.py's
run of it): a reranker trained on the toy's rows (config/shapes_rerank.py), Stage II's evaluation with its top 10
reranked (eval.py --rerank_from), the reranker's scores of the image rows (tools/distill.py), a third stage
distilled from them (config/shapes_distill.py) and its control (the same steps on the same rows without the
teacher), each evaluated as the main job is; then mean ± std over the seeds.

    python -m shapes.reranked                  # seeds 1337-1339; runs the main job first where it is missing

Written under --out_dir (default out/spread, shapes/spread.py's): t1_s<seed>/{rerank,distill_rows,distill,continued}/
and eval_reranked.json, eval_distill.json, eval_continued.json, and reranked.md / reranked.json. Resumes as
shapes/study.py does.
"""
import os
import sys
import types

import configurator
from common import install_error_hook
from shapes.prepare import DATA_DIR, ROOT
from shapes.spread import eval_job, figures, jobs as main_jobs, run_name, train_job
from shapes.study import flag, mean_std, run_jobs, write_tables

# -----------------------------------------------------------------------------
seeds = [1337, 1338, 1339]  # train.py seeds
rerank_top = 10  # of Stage II's candidates, the reranker rescores each query's best this many
out_dir = os.path.join(ROOT, "out", "spread")  # shapes/spread.py's, where the seeds' main jobs are
data_dir = DATA_DIR  # the toy
parallel = 2  # jobs at a time
# -----------------------------------------------------------------------------


def jobs(out, data, seed, top):
    """One seed's reranker, its reranking of Stage II, the distillation rows and stage, and their evaluations."""
    folder = os.path.join(out, run_name(seed, 1))
    at = lambda *names: os.path.join(folder, *names)  # noqa: E731
    stage2, reranker = at("stage2", "export"), at("rerank", "export")
    train = train_job(f"s{seed} rerank", "shapes_rerank.py", at("rerank"), data, seed, 1,
                      os.path.join(data, "tiny-qwen3.5"))
    reranked = eval_job(f"s{seed} eval reranked", data, stage2, at("eval_reranked.json"),
                        [os.path.join(stage2, "pace.json"), train["done"]])
    reranked["command"] += [flag("rerank_from", reranker), flag("rerank_top", top)]
    reranked["cost"] = 200
    rows = at("distill_rows")
    score = {"name": f"s{seed} distill rows", "cost": 60, "done": os.path.join(rows, "train", "train.parquet"),
             "needs": [train["done"]], "log": rows + ".log", "env": {},
             "command": [sys.executable, "-m", "tools.distill", flag("rerank_from", reranker),
                         flag("train_data", [os.path.join(data, "train.jsonl")]),
                         flag("image_dir", os.path.join(data, "images")), flag("num_hard_negatives", 3),
                         flag("out", rows), flag("threads", 1), flag("num_workers", 1), flag("max_pixels", 128 * 192),
                         flag("max_length", 512), flag("table_dir", os.path.join(out, "tables"))]}
    distill = train_job(f"s{seed} distill", "shapes_distill.py", at("distill"), data, seed, 1, stage2,
                        [score["done"], os.path.join(stage2, "pace.json")])
    distill["command"] += [flag("train_data", [rows])]  # the scored rows, not the toy's three files
    evaluated = eval_job(f"s{seed} eval distill", data, at("distill", "export"), at("eval_distill.json"),
                         [distill["done"]])
    # the control: the same steps on the same rows without the teacher, so the row shows what the scores add
    control = train_job(f"s{seed} continued", "shapes_distill.py", at("continued"), data, seed, 1, stage2,
                        [score["done"], os.path.join(stage2, "pace.json")])
    control["command"] += [flag("train_data", [rows]), flag("soft_labels", "none")]
    controlled = eval_job(f"s{seed} eval continued", data, at("continued", "export"), at("eval_continued.json"),
                          [control["done"]])
    return [train, reranked, score, distill, evaluated, control, controlled]


def reranked_figures(path):
    """eval_reranked.json -> {column: value} of the reranked scores: each image meta-task's and the overall mean P@1
    after reranking, each own video or page task's metric after."""
    import json
    with open(path) as f:
        result = json.load(f)
    by_task = {}
    for name, r in result["datasets"].items():
        by_task.setdefault(r["meta_task"], []).append(r["reranked"]["precision_at_1"])
    split = lambda ood: [r["reranked"]["precision_at_1"] for r in result["datasets"].values()  # noqa: E731
                         if r["split"] == ("OOD" if ood else "IND")]
    mean = lambda values: sum(values) / len(values)  # noqa: E731
    values = {"CLS": mean(by_task["Classification"]), "VQA": mean(by_task["VQA"]),
              "retrieval": mean(by_task["Retrieval"]), "grounding": mean(by_task["Visual Grounding"]),
              "IND": mean(split(False)), "OOD": mean(split(True)),
              "all": mean([r["reranked"]["precision_at_1"] for r in result["datasets"].values()])}
    own = {task: 100 * r["reranked"][r["metric"]] for task, r in sorted(result.get("own_v2", {}).items())}
    return {**values, **own}


def summary(out, chosen):
    """-> (reranked.md's text, reranked.json's dict)."""
    rows = {"Stage II (the main job)": [figures(os.path.join(out, run_name(s, 1), "eval_2.json")) for s in chosen],
            f"Stage II, its top {rerank_top} reranked": [reranked_figures(os.path.join(out, run_name(s, 1),
                                                                                       "eval_reranked.json")) for s in chosen],
            "Stage II + 50 steps on the scored rows, no teacher": [
                figures(os.path.join(out, run_name(s, 1), "eval_continued.json")) for s in chosen],
            "Stage III, distilled from the reranker (those 50 steps with the teacher)": [
                figures(os.path.join(out, run_name(s, 1), "eval_distill.json")) for s in chosen]}
    names = list(rows["Stage II (the main job)"][0])
    table = {label: {n: mean_std([run[n] for run in runs]) for n in names} for label, runs in rows.items()}
    cell = lambda s: f"{s['mean']:.1f}" + (f" ± {s['std']:.1f}" if s["std"] is not None else "")  # noqa: E731
    lines = [f"Seeds {', '.join(map(str, chosen))}: mean ± sample standard deviation", "",
             "| toy checkpoint | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    lines += [f"| {label} | " + " | ".join(cell(row[n]) for n in names) + " |" for label, row in table.items()]
    return "\n".join(lines) + "\n", {"seeds": chosen, "table": table, "runs": rows}


def main(argv=None):
    args = types.SimpleNamespace(**configurator.configure(globals(), sys.argv[1:] if argv is None else argv))
    out, data = os.path.abspath(args.out_dir), os.path.abspath(args.data_dir)
    run_jobs([job for seed in args.seeds for job in main_jobs(seed, 1, out, data) + jobs(out, data, seed,
                                                                                          args.rerank_top)],
             args.parallel)
    text, numbers = summary(out, args.seeds)
    write_tables(out, "reranked", text, numbers)
    print(text, flush=True)


if __name__ == "__main__":
    install_error_hook()
    main()
