"""
The toy study: PACE against the VLM2Vec baseline, direct dot-product training, its ablations and the reversed
schedules on the shapes benchmark, over several seeds, in one command on 2 CPU cores: one table, one figure.

    python -m shapes.study                                               # 3 seeds, about 48 minutes on 2 cores
    python -m shapes.study --seeds=1337,1338,1339,1340,1341 --out_dir=out/study5
    python -m shapes.study --methods=pace,vlm2vec --seeds=1337           # a subset

Every method is run as the paper runs it, at the toy's scale, with the toy's recipe (config/shapes_stage1.py and
shapes_stage2.py, read from those files): cosine logits at tau 0.1, dot-product logits at the toy's tau 6.4 (its
norms are 8, so dot / 6.4 matches cos / 0.1 in scale), LoRA at lr 3e-3, full fine-tuning at lr 5e-4, focal gamma 2:

    PACE                        Stage I cos + LoRA + focal; Stage II from its step --start_step: merged,
                                full, dot, focal
    VLM2Vec                     cos + LoRA + plain InfoNCE (gamma 0), one stage
    direct dot                  dot + full fine-tuning from the backbone, gamma 0, one stage
    PACE Stage I alone          PACE's Stage I run to its end, for the same steps as PACE's two stages
    PACE w/o focal              both stages gamma 0 (Stage I: the VLM2Vec run's step --start_step, as in the paper)
    PACE w/o dot                Stage II keeps cosine logits
    PACE w/ Stage II LoRA       Stage II trains fresh LoRA on the merged model instead of the whole language model
    reversed dot -> cos         Stage I dot + LoRA, then Stage II cos + full
    reversed full -> LoRA       Stage I cos + full, then Stage II dot + LoRA
    weighted, same-source       PACE's Stage I on the five training families as the sources of a mixture: weighed
                                VQA, T2I, I2T 2 to CLS, GRD 1; or equal, in same-source groups of 8 queries
    MRL                         PACE's Stage I, and PACE, with Matryoshka's prefixes 16 and 32 of the 64 dimensions
                                (--dims=16,32 evaluates every method at those prefixes too)
    + video and page rows       PACE's Stage I, and PACE (both stages), on the video and page rows
                                (shapes/media_tasks.py) beside the image rows; every other method reads the image
                                rows alone (train.jsonl), as the toy did before those families

Every method is evaluated on the toy's video and page tasks too (Shapes-VID-RET, Shapes-VID-QA, Shapes-DOC-RET:
MMEB-V2's hit@1 and nDCG@5, eval.py's own tasks), so the table says what training on those rows does to them.

Every method trains --start_step + --stage2_steps steps at --batch_size (a Stage I run is that long too; PACE's
Stage II starts from its checkpoint at --start_step, before Stage I ends, as the paper's does) and is evaluated by
eval.py on the toy's ten datasets, ranked with the similarity it was trained with. The seeds are train.py's seed
(data order, LoRA init); the data and the tiny model are the same for every run (prepare.py's seed 0, written to
--data_dir when missing), so the methods meet the same backbone and the same evaluation queries and the spread
over seeds is that of training alone.

It resumes: a training run whose export/ exists and an evaluation whose JSON exists are skipped, an interrupted
training continues from its newest checkpoint (train.py --resume=True). Jobs run --parallel at a time, each with
one torch thread. Measured on 2 cores: two one-thread jobs at once make 1.9x the steps of one alone and 1.6x those
of one two-thread job; and a two-thread job on a busy machine is 15-70x slower, a one-thread job hardly at all.

Written under --out_dir (default out/study):
    seed<S>/stage1_<recipe>/, seed<S>/stage2_<method>/   train.py's out_dirs (checkpoints, log.jsonl, export/)
    seed<S>/eval/<method>.json                           eval.py's results; <method>_geometry.json and .png
                                                         beside it, tools/geometry.py's, drawn from them
    seed<S>/*.log, seed<S>/eval/*.log                    each job's output
    results.md, results.json                             P@1 overall / IND / OOD, Pearson r of log norm product vs
                                                         cosine, mean random-pair cosine, the video and page tasks'
                                                         scores: mean +- std over seeds
    geometry.png                                         the geometry pictures of VLM2Vec, direct dot and PACE
                                                         (the first seed), one row each
    study.json                                           the scale, so a resumed study cannot mix two scales
"""
import json
import os
import statistics
import subprocess
import sys
import time
import types

from PIL import Image, ImageDraw

import configurator
from common import UserError, duration, install_error_hook, replaced_atomically, write_json, write_text
from configurator import file_values
from shapes.media_tasks import TASKS as MEDIA_TASKS, TRAIN_FILES, V2_DIR  # the video and page families
from shapes.prepare import DATA_DIR, ROOT  # the toy's folder, the repository

# the toy's recipe, as its configs set it
TOY_I = file_values(os.path.join(ROOT, "config", "shapes_stage1.py"))
TOY_II = file_values(os.path.join(ROOT, "config", "shapes_stage2.py"))
COS = {"similarity": "cos", "temperature": 0.1}  # eq. (1) at the paper's tau
DOT = {"similarity": "dot", "temperature": TOY_II["temperature"]}  # eq. (2) at the toy's tau
LORA = {"lora_rank": TOY_I["lora_rank"], "lora_alpha": TOY_I["lora_alpha"], "learning_rate": TOY_I["learning_rate"]}
FULL = {"lora_rank": 0, "learning_rate": TOY_II["learning_rate"]}
FOCAL, PLAIN = {"focal_gamma": 2.0}, {"focal_gamma": 0.0}
MRL = {"matryoshka_dims": [16, 32]}  # the tiny model's D is 64
FAMILY_WEIGHTS = {"CLS": 1, "VQA": 2, "T2I": 2, "I2T": 2, "GRD": 1}  # the toy's training families, 400 rows each
MEDIA = {"media": True}  # the video and page rows (train_video.jsonl, train_docs.jsonl) beside the image rows

STAGE_I = {  # Stage I runs, over config/shapes_stage1.py; PACE's and its variants' Stage II start from them
    "cos_lora_focal": {**COS, **LORA, **FOCAL},  # PACE's Stage I
    "cos_lora_plain": {**COS, **LORA, **PLAIN},  # VLM2Vec, and the Stage I of PACE w/o focal
    "dot_full_plain": {**DOT, **FULL, **PLAIN},  # direct dot-product training
    "dot_lora_focal": {**DOT, **LORA, **FOCAL},  # the reversed similarity schedule's Stage I
    "cos_full_focal": {**COS, **FULL, **FOCAL},  # the reversed parameter schedule's Stage I
    # the mixtures of the field (train_data: the toy's five training families as five sources, see family_sources)
    "cos_lora_focal_weighted": {**COS, **LORA, **FOCAL, "sources": FAMILY_WEIGHTS},  # VQA and retrieval weighed 2
    "cos_lora_focal_same": {**COS, **LORA, **FOCAL, "sources": {f: 1 for f in FAMILY_WEIGHTS}, "homogeneous_batch": 8},
    "cos_lora_focal_mrl": {**COS, **LORA, **FOCAL, **MRL},  # Matryoshka's prefixes D/4 and D/2 beside the whole
    "cos_lora_focal_media": {**COS, **LORA, **FOCAL, **MEDIA},  # PACE's Stage I on the images, videos and pages
}
METHODS = {  # name: (label, its Stage I run, its Stage II settings over config/shapes_stage2.py, None: one stage)
    "vlm2vec": ("VLM2Vec (cos, LoRA, InfoNCE)", "cos_lora_plain", None),
    "direct_dot": ("direct dot (dot, full, InfoNCE)", "dot_full_plain", None),
    "pace_stage1": ("PACE Stage I alone (cos, LoRA, focal)", "cos_lora_focal", None),
    "pace": ("PACE", "cos_lora_focal", {**DOT, **FULL, **FOCAL}),
    "no_focal": ("PACE w/o focal", "cos_lora_plain", {**DOT, **FULL, **PLAIN}),
    "no_dot": ("PACE w/o dot (Stage II cos)", "cos_lora_focal", {**COS, **FULL, **FOCAL}),
    "stage2_lora": ("PACE w/ Stage II LoRA", "cos_lora_focal", {**DOT, **LORA, **FOCAL}),
    "dot_to_cos": ("reversed: dot + LoRA, then cos + full", "dot_lora_focal", {**COS, **FULL, **FOCAL}),
    "full_to_lora": ("reversed: cos + full, then dot + LoRA", "cos_full_focal", {**DOT, **LORA, **FOCAL}),
    "weighted": ("Stage I, weighted mixture (VQA, T2I, I2T x2)", "cos_lora_focal_weighted", None),
    "same_source": ("Stage I, same-source groups of 8", "cos_lora_focal_same", None),
    "mrl_stage1": ("Stage I + MRL (16, 32 of 64)", "cos_lora_focal_mrl", None),
    "pace_mrl": ("PACE + MRL, both stages", "cos_lora_focal_mrl", {**DOT, **FULL, **FOCAL, **MRL}),
    "media_stage1": ("PACE Stage I + video and page rows", "cos_lora_focal_media", None),
    "media_pace": ("PACE + video and page rows, both stages", "cos_lora_focal_media",
                   {**DOT, **FULL, **FOCAL, **MEDIA}),
}
FIGURE = ("vlm2vec", "direct_dot", "pace")  # cosine training, direct dot training, PACE
METRICS = (("overall", "P@1 overall", 1), ("IND", "IND", 1), ("OOD", "OOD", 1),
           ("norm_cos_pearson_r", "r(log norm product, cos)", 2), ("r2_2", "R² norm from direction, k=2", 2),
           ("r2_10", "k=10", 2), ("random_pair_mean_cos", "random-pair cos", 2),
           ("Shapes-VID-RET", "video retrieval hit@1", 1), ("Shapes-VID-QA", "video QA hit@1", 1),
           ("Shapes-DOC-RET", "page retrieval nDCG@5", 1))  # the last three: eval.py's own tasks (x 100)
STARTUP_COST, EVAL_COST = 10, 25  # a process's start and an evaluation take about as long as this many steps


# -----------------------------------------------------------------------------
# the command line (every default can be overridden by --key=value)
seeds = [1337, 1338, 1339]  # train.py seeds (--seeds=1337,1338 also works)
methods = list(METHODS)  # which methods (--methods=pace,vlm2vec also works)
out_dir = os.path.join(ROOT, "out", "study")  # where the runs, the evaluations, the table and the figure go
data_dir = DATA_DIR  # the toy data and tiny model (shapes/prepare.py writes them there when missing)
batch_size = 32  # queries a step
start_step = 100  # Stage II starts from this step of Stage I (the main job's: shapes_stage2.py's init_from)
stage2_steps = 100  # Stage II's steps; every method trains start_step + stage2_steps in all
dims = []  # also evaluate every method at these leading dimensions (eval.py --dim), e.g. [16, 32]: rows method@dim
parallel = 2  # jobs at a time, one torch thread each


def parse_args(argv=None):
    """The command line (argv: a list, default sys.argv) -> its settings, the folders made absolute."""
    config = configurator.configure(globals(), sys.argv[1:] if argv is None else argv)
    config["methods"] = [m for entry in config["methods"] for m in str(entry).split(",") if m]
    unknown = sorted(set(config["methods"]) - set(METHODS))
    if unknown:
        raise UserError(f"unknown methods {unknown}; choose from {', '.join(METHODS)}")
    config["out_dir"], config["data_dir"] = os.path.abspath(config["out_dir"]), os.path.abspath(config["data_dir"])
    return types.SimpleNamespace(**config)


# -----------------------------------------------------------------------------
# the jobs: train.py and eval.py runs, each known done by the file it writes last

def flag(key, value):
    """A --key=value argument for train.py and eval.py (configurator.py reads the value as a Python literal)."""
    return f"--{key}={value if isinstance(value, str) else repr(value)}"


def train_job(name, config_file, out_dir, steps, settings, needs=()):
    """A train.py run of `steps` steps into out_dir; done when its export/ is written."""
    command = [sys.executable, "train.py", os.path.join("config", config_file)]
    command += [flag(k, v) for k, v in {**settings, "out_dir": out_dir, "max_iters": steps}.items()]
    return {"name": name, "command": command, "done": os.path.join(out_dir, "export", "pace.json"),
            "needs": list(needs), "cost": steps + STARTUP_COST, "log": out_dir + ".log"}


def eval_path(out_dir, seed, method):
    """Where eval.py writes one seed's results for one method."""
    return os.path.join(out_dir, f"seed{seed}", "eval", f"{method}.json")


def with_media(settings, media):
    """A run's settings -> train.py's: MEDIA's flag replaced by `media` (the train_data of the image, video and page
    rows); settings without it as they are."""
    settings = dict(settings)
    return {**settings, **media} if settings.pop("media", False) else settings


def seed_jobs(seed, args):
    """One seed's jobs, Stage I runs first, then Stage II runs, then evaluations: dicts with name, command, done
    (the file it writes last), needs (files it waits for), cost (for the time left) and log."""
    folder, data = os.path.join(args.out_dir, f"seed{seed}"), lambda name: os.path.join(args.data_dir, name)
    common = {"train_data": [data("train.jsonl")], "image_dir": data("images"), "batch_size": args.batch_size,
              "seed": seed, "threads": 1, "resume": True, "checkpoint_interval": args.start_step}
    media = {"train_data": common["train_data"] + [data(name) for name in TRAIN_FILES.values()]}  # MEDIA's
    stage1, stage2, evals = {}, {}, []
    for method in args.methods:
        _, recipe, second = METHODS[method]
        final, settings = os.path.join(folder, f"stage1_{recipe}"), dict(STAGE_I[recipe])
        if "sources" in settings:  # a mixture: the five families' files, each weighed
            files = {family: os.path.join(args.out_dir, "sources", f"{family}.jsonl") for family in FAMILY_WEIGHTS}
            settings["train_data"] = [{"path": files[f], "weight": w} for f, w in settings.pop("sources").items()]
        settings = with_media(settings, media)
        stage1[recipe] = train_job(f"seed {seed} Stage I {recipe}", "shapes_stage1.py", final,
                                   args.start_step + args.stage2_steps, {**common, **settings,
                                   "init_from": data("tiny-qwen3.5"), "keep_checkpoints": [args.start_step]})
        if second is not None:
            start = os.path.join(final, f"step_{args.start_step:06d}")
            final = os.path.join(folder, f"stage2_{method}")
            second = with_media(second, media)
            stage2[method] = train_job(f"seed {seed} Stage II {method}", "shapes_stage2.py", final, args.stage2_steps,
                                       {**common, **second, "init_from": start, "keep_checkpoints": []}, needs=[start])
        for dim in [0] + list(args.dims):  # the whole vector, and each leading dimension asked for
            name = method + (f"@{dim}" if dim else "")
            out = eval_path(args.out_dir, seed, name)
            command = [sys.executable, "eval.py", os.path.join("config", "shapes_eval.py"),
                       flag("init_from", os.path.join(final, "export")), flag("mmeb_dir", data("eval")),
                       flag("image_dir", data("images")), flag("v2_dir", data(V2_DIR)), flag("out", out),
                       flag("dim", dim)]
            evals.append({"name": f"seed {seed} eval {name}", "command": command, "done": out,
                          "needs": [os.path.join(final, "export", "pace.json")], "cost": EVAL_COST,
                          "log": os.path.splitext(out)[0] + ".log"})
    return list(stage1.values()) + list(stage2.values()) + evals


def family_sources(train, folder):
    """The toy's training rows (train.jsonl) in one file a family (CLS, VQA, T2I, I2T, GRD), for a mixture. -> {family:
    its file}; written once."""
    files = {family: os.path.join(folder, f"{family}.jsonl") for family in FAMILY_WEIGHTS}
    if not all(map(os.path.isfile, files.values())):
        with open(train) as f:
            rows = [json.loads(line) for line in f]
        for family, path in files.items():  # a T2I query has no image; the others' paths name their family
            write_text(path, "".join(json.dumps(r) + "\n" for r in rows
                                     if (r["qry_image_path"] or "train/T2I/").split("/")[1] == family))
    return files


def write_tables(folder, stem, text, numbers):
    """A script's result: <stem>.md (text) and <stem>.json (numbers) in folder, written whole."""
    write_text(os.path.join(folder, f"{stem}.md"), text)
    write_json(os.path.join(folder, f"{stem}.json"), numbers)


def run_jobs(jobs, parallel):
    """Run the jobs whose file is missing, `parallel` at a time, each once the files it needs exist, printing
    progress and the time left. A failed job stops the study; running it again resumes. -> jobs run"""
    todo = [job for job in jobs if not os.path.exists(job["done"])]
    print(f"{len(jobs) - len(todo)} of {len(jobs)} jobs already done, {len(todo)} to run", flush=True)
    running, start, done_cost, left_cost, count = [], time.time(), 0, sum(job["cost"] for job in todo), len(todo)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # the jobs set threads=1 too; this also holds their workers to one
    while todo or running:
        for job in [job for job in todo if all(map(os.path.exists, job["needs"]))][:parallel - len(running)]:
            todo.remove(job)
            os.makedirs(os.path.dirname(job["log"]), exist_ok=True)
            with open(job["log"], "w") as log:
                own = {**env, **job.get("env", {})}  # a job's own variables (shapes/spread.py's instruction set)
                running.append((subprocess.Popen(job["command"], cwd=ROOT, env=own, stdout=log,
                                                 stderr=subprocess.STDOUT), job, time.time()))
            print(f"start {job['name']} (output in {job['log']})", flush=True)
        if not running:
            raise UserError(f"{todo[0]['name']} needs {todo[0]['needs']}, which no job writes (runs made "
                            "with another --start_step?)")
        time.sleep(1)
        for process, job, began in [entry for entry in running if entry[0].poll() is not None]:
            running.remove((process, job, began))
            if process.returncode or not os.path.exists(job["done"]):
                for other, _, _ in running:
                    other.terminate()
                raise UserError(f"{job['name']} failed (exit {process.returncode}), see {job['log']}; "
                                "run the study again to resume")
            done_cost, left_cost = done_cost + job["cost"], left_cost - job["cost"]
            elapsed = time.time() - start
            print(f"done {job['name']} in {duration(time.time() - began)} | {count - len(todo) - len(running)}/{count}"
                  f" | {duration(elapsed)} elapsed, ~{duration(elapsed * left_cost / done_cost)} left", flush=True)
    return count


# -----------------------------------------------------------------------------
# the table and the figure

def metrics(result, geometry):
    """eval.py's JSON and tools/geometry.py's -> the table's numbers; None where it has none (r when every norm is
    the same; a video or page task an evaluation did not score). A video or page task's number is its MMEB-V2
    metric (eval.py's own_v2: the metric each result names) x 100."""
    r2, own = geometry.get("norm_from_direction_r2") or {}, result.get("own_v2", {})
    return {"overall": result["overall"], "IND": result["IND"], "OOD": result["OOD"],
            "norm_cos_pearson_r": geometry.get("norm_cos_pearson_r"), "r2_2": r2.get("2"), "r2_10": r2.get("10"),
            "random_pair_mean_cos": geometry.get("random_pair_mean_cos"),
            **{task: 100 * own[task][own[task]["metric"]] if task in own else None for task in MEDIA_TASKS}}


def geometry_of(path):
    """tools/geometry.py's numbers of an eval.py JSON (<stem>_geometry.json), computed and drawn when missing."""
    from tools import geometry
    written = geometry.stem_of(path) + ".json"
    if not os.path.isfile(written):
        geometry.main([path])
    with open(written) as f:
        return json.load(f)


def mean_std(values):
    """-> {"mean", "std", "n", "values"}: mean and sample standard deviation of the values that are not None
    (std None for fewer than two, mean None for none)."""
    kept = [v for v in values if v is not None]
    return {"mean": statistics.mean(kept) if kept else None, "std": statistics.stdev(kept) if len(kept) > 1 else None,
            "n": len(kept), "values": list(values)}


def summarise(out_dir, seeds, methods):
    """-> {method: {"label", "seeds": those evaluated, metric: mean_std(...)}} from the eval JSONs in out_dir."""
    table = {}
    for method in methods:  # a method, or method@dim: its vectors' first dim dimensions
        found = {}
        for seed in seeds:
            path = eval_path(out_dir, seed, method)
            if os.path.isfile(path):
                with open(path) as f:
                    found[seed] = metrics(json.load(f), geometry_of(path))
        label = METHODS[method.split("@")[0]][0] + (f", first {method.split('@')[1]} dims" if "@" in method else "")
        table[method] = {"label": label, "seeds": list(found),
                         **{key: mean_std([m[key] for m in found.values()]) for key, _, _ in METRICS}}
    return table


def cell(stats, digits):
    """'28.3 ± 1.2'; the mean alone from one value; '–' from none."""
    if stats["mean"] is None:
        return "–"
    return f"{stats['mean']:.{digits}f}" + ("" if stats["std"] is None else f" ± {stats['std']:.{digits}f}")


def markdown(table, scale):
    """summarise()'s table as Markdown, a line on the scale above it and one on the geometry columns below."""
    lines = [f"Toy study: every method trains {scale['start_step'] + scale['stage2_steps']} steps at batch "
             f"{scale['batch_size']} (a Stage II: {scale['stage2_steps']} from Stage I's step {scale['start_step']}); "
             "Precision@1 on the ten toy datasets (chance 10), the video and page tasks by MMEB-V2's metrics (chance "
             "1, 20 and 2.9); mean ± sample standard deviation over the seeds.", "",
             "| method | " + " | ".join(title for _, title, _ in METRICS) + " | seeds |",
             "|---" * (len(METRICS) + 2) + "|"]
    for row in table.values():
        lines.append(f"| {row['label']} | " + " | ".join(cell(row[key], digits) for key, _, digits in METRICS)
                     + f" | {len(row['seeds'])} |")
    lines += ["", "r: Pearson r of the standardised log(|q| |c+|) against cos(q, c+) over matched pairs; R²: the "
              "cross-validated fit of the standardised log norm on the first k principal components of the directions "
              "(tools/geometry.py); '–' where every embedding has the same norm. Random-pair cos: the mean cosine of "
              "random query-candidate pairs."]
    return "\n".join(lines) + "\n"


def figure(out_dir, seed, methods):
    """geometry.png: the geometry pictures (tools/geometry.py's) of FIGURE's methods for one seed, one row each,
    each under its label; -> its path or None"""
    from tools.geometry import stem_of
    pictures = {m: stem_of(eval_path(out_dir, seed, m)) + ".png" for m in FIGURE if m in methods}
    rows = [(METHODS[m][0], Image.open(path).convert("RGB")) for m, path in pictures.items() if os.path.isfile(path)]
    if not rows:
        return None
    band, width = 28, max(picture.width for _, picture in rows)
    sheet = Image.new("RGB", (width, sum(band + picture.height for _, picture in rows)), "white")
    top = 0
    for label, picture in rows:
        ImageDraw.Draw(sheet).text((10, top + 8), f"{label}, seed {seed}", fill="black")
        sheet.paste(picture, (0, top + band))
        top += band + picture.height
    path = os.path.join(out_dir, "geometry.png")
    with replaced_atomically(path) as tmp:
        sheet.save(tmp, format="PNG")
    return path


# -----------------------------------------------------------------------------

def check_scale(out_dir, scale):
    """Write out_dir/study.json, or check that the study there was made at this scale."""
    path = os.path.join(out_dir, "study.json")
    if os.path.isfile(path):
        with open(path) as f:
            earlier = json.load(f)
        if earlier != scale:
            raise UserError(f"{out_dir} holds a study at {earlier}, not {scale}: use another --out_dir")
    write_json(path, scale)


def main(argv=None):
    """Prepare the data if missing, run the jobs not yet done, write the table and the figure."""
    args = parse_args(argv)
    scale = {"batch_size": args.batch_size, "start_step": args.start_step, "stage2_steps": args.stage2_steps,
             "data_dir": args.data_dir}
    check_scale(args.out_dir, scale)
    start = time.time()
    if not all(os.path.exists(os.path.join(args.data_dir, p)) for p in ("train.jsonl", *TRAIN_FILES.values(), "eval",
                                                                       V2_DIR, "tiny-qwen3.5")):
        subprocess.run([sys.executable, "-m", "shapes.prepare", f"--out_dir={args.data_dir}"], cwd=ROOT, check=True)
    family_sources(os.path.join(args.data_dir, "train.jsonl"), os.path.join(args.out_dir, "sources"))
    run_jobs([job for seed in args.seeds for job in seed_jobs(seed, args)], args.parallel)
    table = summarise(args.out_dir, args.seeds, [f"{m}@{d}" if d else m for m in args.methods for d in [0] + args.dims])
    text = markdown(table, scale)
    write_tables(args.out_dir, "results", text, {"scale": scale, "seeds": args.seeds, "methods": table})
    picture = figure(args.out_dir, args.seeds[0], args.methods)
    print(text + f"\nwrote {os.path.join(args.out_dir, 'results.md')}, results.json" +
          (f" and {picture}" if picture else "") + f"; {duration(time.time() - start)} this run", flush=True)


if __name__ == "__main__":
    install_error_hook()
    main()
