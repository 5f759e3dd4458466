"""
eval.py: MMEB Precision@1 of an embedder, per dataset and as the paper's Table 8, with the geometry
diagnostics of Sections 3.2 and 6 and Appendix C.2.

    python eval.py --init_from=out/stage2/export --mmeb_dir=MMEB-eval --image_dir=MMEB-eval/images
    torchrun --nproc_per_node=8 eval.py --init_from=out/stage2/step_002000 --mmeb_dir=... --image_dir=...
    python eval.py config/shapes_eval.py                          # the toy benchmark, the toy's Stage II export

init_from is a Hugging Face folder (a release or an export/) or a training step folder. The config globals
below are set by config files and --key=value, as in train.py.

Precision@1: a query is a hit when its gold candidate (index 0) scores strictly above every other candidate
of its row; a tie with the gold is a miss (a model that maps everything to one vector scores 0, not 100), and
tied rows are counted. precision_at_1_argmax is the official MMEB scorer's reading (np.argmax, the first of
equal scores, so a tie goes to the gold), to set beside published numbers. Scores are s_dot (eq. 2) or s_cos
(eq. 1): by default the one the checkpoint was trained with (PACE ranks by the dot product). Queries carry the
paper's instructions (instructions='paper', mmeb.py) or their datasets' own ('dataset').

Speed: MMEB rows share candidates heavily, so each dataset's distinct (text, image) items are encoded once,
in length-sorted batches. Under torchrun each rank encodes a strided share and the shares are gathered; every
rank scores all rows, rank 0 prints and writes. Aggregates as Table 8: the mean over datasets per meta task,
over IND, over OOD and over all. A folder not among MMEB's 36 keeps its name; it is OOD when the name ends in
"-OOD"; its meta task comes from the last word before that (CLS, VQA, T2I / I2T / RET, GRD), else "Other".

Geometry (geometry=True): the Pearson r between the standardised log norm product log(|q| |c+|) and
cos(q, c+) over matched query-gold pairs (Section 6: -0.78 after direct dot training, -0.11 after PACE), the
cosine of random query-candidate pairs (directional anisotropy, Figures 2b and 4b), norm statistics, and the
PCA of l2-normalised embeddings coloured by norm percentile (Figures 2a, 7, 9), drawn in one PNG beside
`out` (<stem>_geometry.png), the numbers to redraw it in the JSON. The paper measures them on 5,000 training
instances: geometry_train_data (train.py's files) does that too, into <stem>_geometry_train.png.
"""
import json
import math
import os
import random
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import checkpoint
import configurator
import data
import mmeb
import plot
from configurator import compute_init, kernel_report
from model import load_embedder

# -----------------------------------------------------------------------------
# config: every default can be overridden by a config file or --key=value
init_from = ""  # checkpoint: a Hugging Face folder, an export/ folder or a training step folder
mmeb_dir = ""  # MMEB-eval folder: one subfolder of Parquet files per dataset
image_dir = ""  # root that the rows' image paths are relative to
datasets = []  # dataset folder names to evaluate, e.g. ['ImageNet-1K', 'N24News']; [] = all in mmeb_dir
allow_missing_datasets = False  # a dataset folder without Parquet files: listed as omitted instead of an error
similarity = ""  # 'dot' (eq. 2) or 'cos' (eq. 1); '' = what the checkpoint was trained with
instructions = "paper"  # queries: 'paper' = Table 5's instruction per task format (mmeb.py), 'dataset' = their own
batch_size = 16  # items per forward pass
num_workers = 4  # DataLoader worker processes per rank (decode, resize, tokenise)
max_pixels = 1605632  # image pixel budget (paper: 1,605,632); 0 = the checkpoint's own
max_length = 8192  # tokens per item; text is truncated, never image placeholders or the template
skip_bad_rows = False  # skip and count malformed rows instead of stopping with an error
allow_any_image_path = False  # let rows name images outside image_dir
out = "out/eval.json"  # results as JSON; the pictures go beside it (<stem>_geometry.png, <stem>_sheet_*.png)
geometry = True  # compute the geometry diagnostics and draw them
geometry_samples = 5000  # queries (and as many candidates) sampled for the PCA and the random pairs
geometry_train_data = []  # training files (train.py's train_data) to measure the geometry on, as the paper does
geometry_image_dir = ""  # their image_dir ('' = image_dir)
sheet_queries = 0  # > 0: a retrieval sheet per dataset, this many queries with their top candidates
sheet_top_k = 3  # candidates a sheet shows per query
seed = 0  # seeds the geometry samples and the sheets' queries
device = "cuda" if torch.cuda.is_available() else "cpu"  # 'cuda' or 'cpu'
dtype = "bfloat16" if torch.cuda.is_available() else "float32"  # compute dtype of the model
threads = 0  # torch threads on a CPU (0: torch's default)
timeout_minutes = 10.0  # a collective that waits longer (a stopped or dead rank) ends the run
wandb_log = False  # log the results to the W&B run of the checkpoint's out_dir
wandb_project = "pace"  # W&B project
DEFAULTS = configurator.config_keys(globals())  # main() starts from these each call, so tests can call it twice
# -----------------------------------------------------------------------------

META_TASKS = ("Classification", "VQA", "Retrieval", "Visual Grounding")
META_TASK_WORDS = {"CLS": "Classification", "VQA": "VQA", "T2I": "Retrieval", "I2T": "Retrieval",
                   "RET": "Retrieval", "GRD": "Visual Grounding"}  # last word of a non-MMEB dataset name


def dataset_group(name):
    """-> (meta task, 'IND' | 'OOD') of a dataset folder name (the rule is in the file docstring)."""
    if name in mmeb.MMEB_DATASETS:
        return mmeb.MMEB_DATASETS[name]
    split = "OOD" if name.endswith("-OOD") else "IND"
    base = name[:-len("-OOD")] if split == "OOD" else name
    return META_TASK_WORDS.get(base.replace("_", "-").split("-")[-1].upper(), "Other"), split


# -----------------------------------------------------------------------------
# distinct items, encoding, scoring

def distinct_items(rows):
    """Rows -> (items, query_index (Q,), candidate_index (Q, K)): each distinct (text, image) once, queries and
    candidates alike; the indices point into items, -1 pads rows with fewer candidates."""
    items, position = [], {}

    def index(side):
        image = side.get("image")
        key = (side.get("text") or "", os.fspath(image) if isinstance(image, (str, os.PathLike)) else id(image))
        if key not in position:
            position[key] = len(items)
            items.append(side)
        return position[key]

    query_index = torch.tensor([index(row["query"]) for row in rows], dtype=torch.long)
    candidate_index = torch.full((len(rows), max(len(row["candidates"]) for row in rows)), -1, dtype=torch.long)
    for r, row in enumerate(rows):
        candidate_index[r, :len(row["candidates"])] = torch.tensor([index(c) for c in row["candidates"]])
    return items, query_index, candidate_index


def encode_shared(embedder, items, batch_size, num_workers, rank=0, world_size=1, label=""):
    """Embeddings (N, D) of all items; under torchrun rank r encodes items[r::world_size] and the shares are
    gathered, so every rank ends with all N. label: rank 0 prints progress under it."""
    share = items[rank::world_size]
    mine = torch.empty(0, embedder.dim)  # (n_rank, D)
    if share:
        mine = embedder.encode(share, batch_size, num_workers, progress=label if rank == 0 else "")
    if world_size == 1:
        return mine
    shares = [None] * world_size
    dist.all_gather_object(shares, mine)  # CPU tensors, pickled: no padding to equal sizes needed
    embeddings = torch.empty(len(items), embedder.dim)
    for r, part in enumerate(shares):
        embeddings[r::world_size] = part
    return embeddings


def candidate_scores(query_emb, cand_emb, cand_index, similarity):
    """query_emb (Q, D), cand_emb (M, D), cand_index (Q, K) into cand_emb (-1: no candidate) -> scores (Q, K),
    -inf where there is no candidate. Row chunks bound the gathered (b, K, D) block."""
    if similarity not in ("cos", "dot"):
        raise ValueError(f"similarity must be 'cos' or 'dot', got {similarity!r}")
    if similarity == "cos":  # eq. (1): compare directions only
        query_emb, cand_emb = F.normalize(query_emb, dim=-1), F.normalize(cand_emb, dim=-1)
    num_rows, width = cand_index.shape
    scores = torch.empty(num_rows, width)
    rows_per_chunk = max(1, 2**25 // max(1, width * cand_emb.shape[1]))  # about 128 MB of float32
    for start in range(0, num_rows, rows_per_chunk):
        index = cand_index[start:start + rows_per_chunk]  # (b, K)
        query = query_emb[start:start + rows_per_chunk, None, :]  # (b, 1, D)
        scores[start:start + rows_per_chunk] = (query * cand_emb[index.clamp(min=0)]).sum(-1)  # (b, K), eq. (2) / (1)
    return scores.masked_fill(cand_index < 0, -math.inf)


def precision_at_1(scores):
    """scores (Q, K), the gold at column 0 -> (strict hits, ties, argmax hits). Strict: the gold scores above
    every other candidate. A tie: the best other equals the gold. argmax: np.argmax's reading, where a tie goes
    to the gold, the first index (the official MMEB scorer)."""
    gold = scores[:, 0]  # (Q,)
    best_other = scores[:, 1:].amax(dim=1) if scores.shape[1] > 1 else torch.full_like(gold, -math.inf)
    return int((gold > best_other).sum()), int((gold == best_other).sum()), int((gold >= best_other).sum())


def evaluate_dataset(embedder, rows, similarity, batch_size=16, num_workers=0, rank=0, world_size=1, label=""):
    """One dataset's rows -> (result dict, embeddings (N, D), query_index, cand_index, scores (Q, K)). The result
    holds precision_at_1 and precision_at_1_argmax (percent), num_queries, ties, the candidate-count range and the
    speed figures. Non-finite embeddings are an error naming the dataset."""
    if not rows:
        raise ValueError(f"{label or 'a dataset'}: no rows")
    items, query_index, cand_index = distinct_items(rows)
    start = time.time()
    embeddings = encode_shared(embedder, items, batch_size, num_workers, rank, world_size, label)  # (N, D)
    seconds = time.time() - start
    bad = (~torch.isfinite(embeddings).all(dim=1)).nonzero().flatten()
    if len(bad):
        item = items[int(bad[0])]
        raise ValueError(f"{label or 'dataset'}: the model gave non-finite embeddings for {len(bad)} of its "
                         f"{len(items)} items, e.g. {item.get('text', '')[:60]!r} (image {item.get('image')})")
    scores = candidate_scores(embeddings[query_index], embeddings, cand_index, similarity)  # (Q, K)
    hits, ties, argmax_hits = precision_at_1(scores)
    counts = (cand_index >= 0).sum(dim=1)  # (Q,) candidates a row
    result = {"precision_at_1": 100.0 * hits / len(rows), "precision_at_1_argmax": 100.0 * argmax_hits / len(rows),
              "num_queries": len(rows), "ties": ties, "candidates": [int(counts.min()), int(counts.max())],
              "distinct_items": len(items), "dedup_factor": (len(rows) + int(counts.sum())) / len(items),
              "seconds": seconds, "items_per_second": len(items) / max(seconds, 1e-9)}
    return result, embeddings, query_index, cand_index, scores


# -----------------------------------------------------------------------------
# aggregates and the table

def mean(values):
    return sum(values) / len(values) if values else None


def aggregate(per_dataset, key="precision_at_1"):
    """{name: {key, "meta_task", "split", ...}} -> {"meta_tasks": {task: mean}, "IND", "OOD", "overall"}: each an
    unweighted mean over its datasets, as in Table 8 (None when empty)."""
    tasks = [t for t in META_TASKS if any(r["meta_task"] == t for r in per_dataset.values())]
    tasks += sorted({r["meta_task"] for r in per_dataset.values()} - set(META_TASKS))
    scores = lambda keep: [r[key] for r in per_dataset.values() if keep(r)]  # noqa: E731
    return {"meta_tasks": {t: mean(scores(lambda r: r["meta_task"] == t)) for t in tasks},
            "IND": mean(scores(lambda r: r["split"] == "IND")), "OOD": mean(scores(lambda r: r["split"] == "OOD")),
            "overall": mean(scores(lambda r: True))}


def format_table(per_dataset, summary, argmax_summary=None, omitted=()):
    """Table 8's shape: datasets by meta task (OOD marked *), meta-task means, the final score; strict P@1 and,
    beside it, the official argmax reading."""
    number = lambda x: "-" if x is None else f"{x:.1f}"  # noqa: E731
    argmax_summary = argmax_summary or aggregate(per_dataset, "precision_at_1_argmax")
    lines = [f"{'dataset':<28}{'P@1':>7}{'argmax':>8}{'queries':>9}{'ties':>7}{'candidates':>12}"]
    for task, task_mean in summary["meta_tasks"].items():
        names = [n for n, r in per_dataset.items() if r["meta_task"] == task]
        lines.append(f"{task} ({len(names)} datasets)")
        for name in names:
            r = per_dataset[name]
            label, (low, high) = name + ("*" if r["split"] == "OOD" else ""), r.get("candidates", ("-", "-"))
            lines.append(f"  {label:<26}{number(r['precision_at_1']):>7}{number(r.get('precision_at_1_argmax')):>8}"
                         f"{r['num_queries']:>9}{r['ties']:>7}{low if low == high else f'{low}-{high}':>12}")
        lines.append(f"{'All ' + task:<28}{number(task_mean):>7}{number(argmax_summary['meta_tasks'][task]):>8}")
    lines.append(f"Final score ({len(per_dataset)} datasets)")
    for label, key in (("All IND", "IND"), ("All OOD", "OOD"), ("All", "overall")):
        lines.append(f"{label:<28}{number(summary[key]):>7}{number(argmax_summary[key]):>8}")
    lines.append("* out of distribution; P@1: ties are misses; argmax: the official scorer, ties go to the gold")
    lines += [f"omitted (no Parquet files): {', '.join(omitted)}"] if omitted else []
    return "\n".join(lines)


# -----------------------------------------------------------------------------
# geometry diagnostics

def geometry_pairs(query_emb, positive_emb, candidate_emb, size, generator=None):
    """What the diagnostics need from one dataset: query_emb (Q, D) and positive_emb (Q, D) row by row (matched
    pairs), candidate_emb (M, D) its distinct candidates. Per-pair scalars for every row; vectors only for a
    random sample of `size` queries and `size` candidates."""
    query_norm, positive_norm = query_emb.norm(dim=1), positive_emb.norm(dim=1)  # (Q,), (Q,)
    query_pick = torch.randperm(len(query_emb), generator=generator)[:size]
    candidate_pick = torch.randperm(len(candidate_emb), generator=generator)[:size]
    return {"log_norm_product": query_norm.clamp_min(1e-30).log() + positive_norm.clamp_min(1e-30).log(),  # (Q,)
            "cos_positive": F.cosine_similarity(query_emb, positive_emb, dim=1),  # (Q,)
            "query_norms": query_norm, "candidate_norms": candidate_emb.norm(dim=1),  # (Q,), (M,)
            "queries": query_emb[query_pick], "candidates": candidate_emb[candidate_pick]}  # (s, D), (s', D)


def pearson(x, y):
    """Pearson r of two (N,) tensors; None when either is constant to float32 precision (e.g. a model whose final
    RMSNorm gives every embedding the same norm), where r would be rounding noise."""
    x, y = x.double() - x.double().mean(), y.double() - y.double().mean()
    if len(x) < 2 or x.abs().max() < 1e-5 or y.abs().max() < 1e-5:
        return None
    return float((x * y).sum() / (x.norm() * y.norm()))


def norm_stats(norms):
    percentiles = torch.quantile(norms.double(), torch.tensor([0.05, 0.5, 0.95], dtype=torch.float64))
    return {"mean": norms.mean().item(), "std": norms.std().item() if len(norms) > 1 else 0.0,
            "min": norms.min().item(), "max": norms.max().item(), "p5_p50_p95": percentiles.tolist()}


def geometry_summary(samples, max_points=5000, title=""):
    """Pool geometry_pairs() of the evaluated datasets -> (summary dict with the numbers to redraw the pictures,
    the picture: the random-pair cosine histogram, log norm product against cosine, the PCA)."""
    pooled = {key: torch.cat([s[key] for s in samples]) for key in samples[0]}
    queries, candidates = pooled["queries"], pooled["candidates"]  # (S, D), (S', D)
    directions_q, directions_c = F.normalize(queries, dim=1), F.normalize(candidates, dim=1)
    # random pairs: each sampled query with a sampled candidate drawn at random (a matched one is rare and harmless);
    # their mean over ALL (query, candidate) sample pairs is exactly mean(q_hat) . mean(c_hat)
    order = torch.randint(len(directions_c), (len(directions_q),), generator=torch.Generator().manual_seed(0))
    random_cos = (directions_q * directions_c[order]).sum(dim=1)  # (S,)
    log_product, cos_positive = pooled["log_norm_product"], pooled["cos_positive"]  # (P,), (P,)
    r = pearson(log_product, cos_positive)
    # Fig. 4a's x axis; when every norm is the same (r undefined) there is nothing to standardise but rounding
    standardised = torch.zeros_like(log_product) if r is None else (log_product - log_product.mean()) / log_product.std()
    points = torch.cat([directions_q, directions_c]).double()  # (N, D) on the unit sphere
    centred = points - points.mean(0)
    _, singular, v_transposed = torch.linalg.svd(centred, full_matrices=False)
    projected = F.pad(centred @ v_transposed[:2].T, (0, max(0, 2 - v_transposed.shape[0])))  # (N, 2) even when D = 1
    variance = singular ** 2
    norms = torch.cat([queries.norm(dim=1), candidates.norm(dim=1)])  # (N,) of the original embeddings
    percentile = (norms.argsort().argsort().double() / max(len(norms) - 1, 1)).tolist()  # (N,) in [0, 1]
    is_query = [i < len(queries) for i in range(len(points))]
    keep = torch.randperm(len(log_product), generator=torch.Generator().manual_seed(1))[:max_points]
    summary = {"norm_cos_pearson_r": r, "num_matched_pairs": len(log_product),
               "random_pair_mean_cos": float(directions_q.mean(0) @ directions_c.mean(0)),
               "num_random_pairs": len(queries) * len(candidates),
               "query_norm": norm_stats(pooled["query_norms"]), "candidate_norm": norm_stats(pooled["candidate_norms"]),
               "pca_explained_variance": [float(v / variance.sum().clamp_min(1e-30)) for v in variance[:2]],
               "pca": {"x": projected[:, 0].tolist(), "y": projected[:, 1].tolist(), "norm_percentile": percentile,
                       "is_query": is_query},
               "random_pair_cos": random_cos.tolist(),
               "pairs": {"standardised_log_norm_product": standardised[keep].tolist(),
                         "cos_positive": cos_positive[keep].tolist()}}
    explained = summary["pca_explained_variance"] + [0.0]
    picture = plot.grid([
        plot.histogram([{"label": "random pairs", "values": summary["random_pair_cos"]}], value_range=(-1, 1),
                       title="cosine of random query-candidate pairs", x_label="cos"),
        plot.scatter(summary["pairs"]["standardised_log_norm_product"], summary["pairs"]["cos_positive"],
                     title="matched pairs", x_label="standardised log(|q| |c+|)", y_label="cos(q, c+)",
                     note="r = -" if r is None else f"r = {r:.2f}"),
        plot.scatter(summary["pca"]["x"], summary["pca"]["y"], colour=percentile, equal_axes=True,
                     marker=["circle" if q else "triangle" for q in is_query], title="PCA of normalised embeddings",
                     x_label=f"PC1 {100 * explained[0]:.0f}%", y_label=f"PC2 {100 * explained[1]:.0f}%",
                     note="colour: norm percentile; o query, ^ candidate")], columns=3, title=title)
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in summary.items()}, picture


def train_geometry(embedder, rank, world_size, generator):
    """The diagnostics on a sample of geometry_samples training rows, as the paper measures them: query-positive
    pairs for the Pearson r, queries against other rows' positives for the random pairs."""
    rows = data.load_train_rows(geometry_train_data, geometry_image_dir or image_dir, num_hard_negatives=0,
                                seed=seed, skip_bad_rows=skip_bad_rows, allow_any_image_path=allow_any_image_path,
                                instructions=mmeb.Instructions(instructions))
    picked = random.Random(seed).sample(range(len(rows)), min(geometry_samples, len(rows)))
    items = [rows[i]["query"] for i in picked] + [rows[i]["candidates"][0] for i in picked]
    embeddings = encode_shared(embedder, items, batch_size, num_workers, rank, world_size, "training rows")
    queries, positives = embeddings[:len(picked)], embeddings[len(picked):]
    return geometry_pairs(queries, positives, positives, len(picked), generator)


# -----------------------------------------------------------------------------
# the run

def write_json(result, path):
    """Atomic: written aside, then renamed, so a crash never leaves half a file."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    os.replace(path + ".tmp", path)


def retrieval_sheet(name, rows, scores, stem):
    """<stem>_sheet_<name>.png: sheet_queries seeded queries of a dataset with their sheet_top_k best candidates."""
    picked = random.Random(f"{seed}/{name}").sample(range(len(rows)), min(sheet_queries, len(rows)))
    sheet = []
    for r in picked:
        top = [j for j in scores[r].argsort(descending=True).tolist() if math.isfinite(scores[r, j])][:sheet_top_k]
        sheet.append({"query": rows[r]["query"], "results": [dict(rows[r]["candidates"][j], score=float(scores[r, j]),
                                                                    gold=j == 0) for j in top]})
    return plot.save(plot.retrieval_sheet(sheet, title=f"{name}: top {sheet_top_k}"), f"{stem}_sheet_{name}.png")


def which_datasets(log):
    """-> (names to evaluate, names omitted for want of Parquet files). An empty dataset folder is an error unless
    allow_missing_datasets: silently dropping it would change the averages."""
    found, empty = mmeb.find_mmeb_datasets(mmeb_dir, image_dir)
    names = list(datasets) or found
    missing = [n for n in names if not os.path.isdir(os.path.join(mmeb_dir, n))]
    if missing or not names:
        raise FileNotFoundError(f"datasets {missing or '(none)'} not in {mmeb_dir}")
    empty = [n for n in (names if datasets else names + empty) if not mmeb.parquet_files(os.path.join(mmeb_dir, n))]
    if empty and not allow_missing_datasets:
        raise FileNotFoundError(f"dataset folders without Parquet files in {mmeb_dir}: {', '.join(empty)} (download "
                                "them, or pass --allow_missing_datasets=True to list them as omitted)")
    if empty:
        log(f"omitted, no Parquet files: {', '.join(empty)}")
    if not set(names) - set(empty):
        raise FileNotFoundError(f"no dataset with Parquet files to evaluate in {mmeb_dir}")
    return [n for n in names if n not in empty], empty


def evaluate_all(embedder, ranking, names, rank, world_size, log):
    """Every dataset of `names` -> (per-dataset results, (geometry samples of the evaluation data, of the training
    rows), the instructions' counts)."""
    query_instructions, generator = mmeb.Instructions(instructions), torch.Generator().manual_seed(seed)
    geometry_size = math.ceil(geometry_samples / len(names)) if geometry else 0  # spread evenly over the datasets
    per_dataset, samples = {}, []
    for name in names:
        rows = mmeb.read_mmeb_dataset(os.path.join(mmeb_dir, name), image_dir, skip_bad_rows, query_instructions,
                                      allow_any_image_path)
        result, embeddings, query_index, cand_index, scores = evaluate_dataset(
            embedder, rows, ranking, batch_size, num_workers, rank, world_size, label=name)
        meta_task, split = dataset_group(name)
        per_dataset[name] = dict(result, meta_task=meta_task, split=split, skipped_rows=rows.skipped)
        if geometry:
            candidates = embeddings[cand_index[cand_index >= 0].unique()]  # (M, D), distinct candidates
            samples.append(geometry_pairs(embeddings[query_index], embeddings[cand_index[:, 0]], candidates,
                                          geometry_size, generator))
        if sheet_queries and rank == 0:
            per_dataset[name]["sheet_png"] = retrieval_sheet(name, rows, scores, os.path.splitext(out)[0])
        low, high = result["candidates"]
        log(f"{name}: P@1 {result['precision_at_1']:.1f} (argmax {result['precision_at_1_argmax']:.1f}) over "
            f"{result['num_queries']} queries, {result['ties'] or 'no'} tied with the gold, "
            f"{result['distinct_items']} distinct items (dedup {result['dedup_factor']:.1f}x), "
            f"{result['items_per_second']:.1f} items/s" + (f"; WARNING: rows hold {low} to {high} candidates, "
                                                             "not one count" if low != high else ""), flush=True)
    train = [train_geometry(embedder, rank, world_size, generator)] if geometry and geometry_train_data else []
    if query_instructions.counts:
        log(f"instructions='{instructions}' on the queries: {query_instructions.summary()}")
    return per_dataset, (samples, train), dict(query_instructions.counts, mode=instructions)


def report(output, samples, info, config):
    """Rank 0: the geometry pictures, the table, the JSON, the export's model card and W&B."""
    stem = os.path.splitext(out)[0]
    for key, sample, suffix in (("geometry", samples[0], ""), ("geometry_train", samples[1], "_train")):
        if sample:
            output[key], picture = geometry_summary(sample, geometry_samples, f"{init_from}{suffix}")
            output[key]["png"] = plot.save(picture, f"{stem}_geometry{suffix}.png")
            print(f"{key}: r {output[key]['norm_cos_pearson_r']}, random-pair cos "
                  f"{output[key]['random_pair_mean_cos']:.3f}, drawn in {output[key]['png']}")
    table = format_table(output["datasets"], output, output["argmax"], output["omitted"])
    print(table)
    write_json(output, out)
    print(f"wrote {out}")
    if info and checkpoint.add_evaluation(init_from, f"MMEB Precision@1 ({output['similarity']} similarity, "
                                                     f"instructions '{instructions}'), eval.py:\n\n```\n{table}\n```"):
        print(f"added the table to {os.path.join(init_from, 'README.md')}")
    if wandb_log:
        run_dir = os.path.dirname(os.path.abspath(init_from))
        wandb = configurator.start_wandb(run_dir, True, wandb_project, os.path.basename(run_dir), config)
        scores = {**output["meta_tasks"], "IND": output["IND"], "OOD": output["OOD"], "overall": output["overall"]}
        wandb.log({f"eval/{k}": v for k, v in scores.items() if v is not None})
        wandb.finish()


def main(args=None):
    """Run the evaluation with config overrides `args` (default: the command line). -> the JSON dict"""
    config = configurator.configure(dict(DEFAULTS), sys.argv[1:] if args is None else args)
    globals().update(config)  # the config globals above, read by name as in train.py
    rank, _, world_size, run_device = compute_init(device, timeout_minutes)
    if threads:
        torch.set_num_threads(threads)
    log = print if rank == 0 else (lambda *a, **k: None)
    for key in ("init_from", "mmeb_dir"):
        if not config[key]:
            raise ValueError(f"set --{key}=...")
    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"dtype must be 'float32' or 'bfloat16', got {dtype!r}")
    if rank == 0:
        configurator.print_config(config)
        print(kernel_report(run_device))
    embedder, info = load_embedder(init_from, getattr(torch, dtype), max_length=max_length,
                                   **({"max_pixels": max_pixels} if max_pixels else {}))
    embedder.to(run_device).eval()
    ranking = similarity or info.get("similarity") or "cos"
    if not (similarity or info.get("similarity")):
        log(f"{init_from} does not say what it was trained with (no pace.json similarity): ranking by cosine")
    if ranking not in ("cos", "dot"):
        raise ValueError(f"similarity must be 'cos' or 'dot', got {ranking!r}")
    names, omitted = which_datasets(log)
    per_dataset, samples, counts = evaluate_all(embedder, ranking, names, rank, world_size, log)
    output = {"datasets": per_dataset, **aggregate(per_dataset), "argmax": aggregate(per_dataset, "precision_at_1_argmax"),
              "omitted": omitted, "similarity": ranking, "instructions": counts, "init_from": init_from, "config": config}
    if rank == 0:
        report(output, samples, info, config)
    if world_size > 1:
        dist.barrier()
        dist.destroy_process_group()
    return output


if __name__ == "__main__":
    configurator.install_error_hook()
    main()
