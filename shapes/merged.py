"""
shapes/merged.py: the toy's merge row. The main job's Stage II exports of two seeds averaged by tools/merge.py,
every pair of the seeds given, each merge evaluated as the main job evaluates and set beside the seeds' own
figures.

    python -m shapes.spread --seeds="[1337, 1338, 1339]" --threads="[1]" --capabilities="['']"   # the seeds' runs
    python -m shapes.merged                                                                      # then the merges

Reads --out_dir's t1_s<seed>/stage2/export and eval_2.json (shapes/spread.py's); writes there merged_s<a>_s<b>/
(the merged export, eval.json and their logs) and merged.md / merged.json. Two kinds of runs are merged: each
seed's own main job ("own": its own Stage I, so its own LoRA start), and Stage II at each seed from the first seed's
Stage I step 100 ("shared": one start, another data order; written to shared_s<seed>/). Per column: the seeds' mean
± std, the merges' mean ± std, and each merge against the mean of its two runs. Resumes as shapes/study.py does.
"""
import itertools
import os
import sys
import types

import configurator
from common import UserError, install_error_hook
from shapes.prepare import DATA_DIR, ROOT
from shapes.spread import eval_job, figures, run_name, train_job
from shapes.study import flag, mean_std, run_jobs, write_tables

# -----------------------------------------------------------------------------
seeds = [1337, 1338, 1339]  # the seeds whose Stage II exports are merged, every pair of them
out_dir = os.path.join(ROOT, "out", "spread")  # shapes/spread.py's, where the seeds' runs are
data_dir = DATA_DIR  # the toy the runs were trained and are evaluated on
parallel = 2  # jobs at a time
# -----------------------------------------------------------------------------


KINDS = {"own": "each seed's own main job (its own Stage I)", "shared": "Stage II at each seed from the first seed's "
         "Stage I step 100 (one start, another data order)"}


def run_files(out, kind, seed, first):
    """-> (a run's Stage II export, its evaluation): shapes/spread.py's main job, or a Stage II from the first seed's
    Stage I (the first seed's own Stage II is that already)."""
    if kind == "own" or seed == first:
        return (os.path.join(out, run_name(seed, 1), "stage2", "export"),
                os.path.join(out, run_name(seed, 1), "eval_2.json"))
    return os.path.join(out, f"shared_s{seed}", "stage2", "export"), os.path.join(out, f"shared_s{seed}", "eval.json")


def shared_jobs(out, data, seed, first):
    """Stage II at seed from the first seed's Stage I step 100, as the main job runs it, then its evaluation."""
    export, result = run_files(out, "shared", seed, first)
    start = os.path.join(out, run_name(first, 1), "stage1", "step_000100")
    train = train_job(f"shared s{seed} stage2", "shapes_stage2.py", os.path.dirname(export), data, seed, 1, start,
                      [start])
    return [train, eval_job(f"eval shared s{seed}", data, export, result, [train["done"]])]


def jobs(out, data, kind, a, b, first):
    """A merge of two runs' Stage II exports (tools/merge.py, equal weights), then its evaluation."""
    folder = os.path.join(out, f"merged_{kind}_s{a}_s{b}")
    inputs = [run_files(out, kind, seed, first)[0] for seed in (a, b)]
    merge = {"name": f"merge {kind} s{a} s{b}", "cost": 20, "done": os.path.join(folder, "export", "pace.json"),
             "needs": [os.path.join(i, "pace.json") for i in inputs], "log": folder + ".log",
             "command": [sys.executable, "-m", "tools.merge", flag("inputs", inputs),
                         flag("out", os.path.join(folder, "export"))]}
    return [merge, eval_job(f"eval merged {kind} s{a} s{b}", data, os.path.join(folder, "export"),
                            os.path.join(folder, "eval.json"), [merge["done"]])]


def summary(out, chosen):
    """-> (merged.md's text, merged.json's dict)."""
    pairs, first, table, found, said = list(itertools.combinations(chosen, 2)), chosen[0], {}, {}, []
    for kind, words in KINDS.items():
        singles = {seed: figures(run_files(out, kind, seed, first)[1]) for seed in chosen}
        merges = {p: figures(os.path.join(out, f"merged_{kind}_s{p[0]}_s{p[1]}", "eval.json")) for p in pairs}
        names = list(singles[first])
        table[f"{kind}: one seed"] = {n: mean_std([singles[s][n] for s in chosen]) for n in names}
        table[f"{kind}: two seeds merged"] = {n: mean_std([merges[p][n] for p in pairs]) for n in names}
        table[f"{kind}: merged minus its two seeds' mean"] = {n: mean_std(
            [merges[p][n] - (singles[p[0]][n] + singles[p[1]][n]) / 2 for p in pairs]) for n in names}
        found[kind] = {"singles": singles, "merges": {f"s{a}_s{b}": merges[(a, b)] for a, b in pairs}}
        said.append(f"{kind} ({words}): " + "; ".join(
            f"s{a}+s{b} all {merges[(a, b)]['all']:.1f} (seeds {singles[a]['all']:.1f}, {singles[b]['all']:.1f})"
            for a, b in pairs))
    cell = lambda s: f"{s['mean']:.1f}" + (f" ± {s['std']:.1f}" if s["std"] is not None else "")  # noqa: E731
    lines = [f"Stage II at seeds {', '.join(map(str, chosen))} and every pair of them merged with equal weights "
             f"({len(pairs)} merges a kind): mean ± sample standard deviation", "",
             "| toy checkpoint | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    lines += [f"| {label} | " + " | ".join(cell(row[n]) for n in names) + " |" for label, row in table.items()]
    lines += [""] + said
    return "\n".join(lines) + "\n", {"seeds": chosen, "table": table, "runs": found}


def main(argv=None):
    args = types.SimpleNamespace(**configurator.configure(globals(), sys.argv[1:] if argv is None else argv))
    out, data = os.path.abspath(args.out_dir), os.path.abspath(args.data_dir)
    first = args.seeds[0]
    missing = [run_files(out, "own", seed, first)[0] for seed in args.seeds
               if not os.path.isfile(os.path.join(run_files(out, "own", seed, first)[0], "pace.json"))]
    if missing:
        raise UserError(f"no Stage II export at {', '.join(missing)}: run python -m shapes.spread "
                         f"--seeds=\"{args.seeds}\" --threads=\"[1]\" --capabilities=\"['']\" first")
    run_jobs([job for seed in args.seeds[1:] for job in shared_jobs(out, data, seed, first)]
             + [job for kind in KINDS for a, b in itertools.combinations(args.seeds, 2)
                for job in jobs(out, data, kind, a, b, first)], args.parallel)
    text, numbers = summary(out, args.seeds)
    write_tables(out, "merged", text, numbers)
    print(text, flush=True)


if __name__ == "__main__":
    install_error_hook()
    main()
