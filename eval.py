"""
eval.py: MMEB Precision@1 of an embedder, per dataset and as the paper's Table 8, with the geometry
diagnostics of Sections 3.2 and 6 and Appendix C.2.

    python eval.py --init_from=out/stage2/export --mmeb_dir=MMEB-eval --image_dir=MMEB-eval/images
    torchrun --nproc_per_node=8 eval.py --init_from=out/stage2/step_002000 --mmeb_dir=... --image_dir=...
    python eval.py config/shapes_eval.py --init_from=out/shapes_stage2/export     # the toy benchmark

init_from is a Hugging Face folder (a release or an export/) or a training step folder. Options are
the config globals below, set by config files and --key=value exactly as in train.py.

Precision@1: a query is a hit when its gold candidate (index 0) scores strictly above every other
candidate of its row. A tie with the gold is a miss (a model that maps everything to one vector scores
0, not 100); the tied rows are counted and reported. Scores are s_dot (eq. 2) or s_cos (eq. 1); by
default the one the checkpoint was trained with (PACE ranks by the dot product, as in the paper).

Speed: MMEB rows share candidates heavily, so each dataset's distinct (text, image) items, queries
and candidates together, are encoded once, in length-sorted batches (model.Embedder.encode). Under
torchrun each rank encodes a strided share of them and the shares are gathered; every rank then scores
all rows (cheap: batched products of gathered embeddings) and rank 0 prints and writes.

Aggregates as Table 8: the mean over datasets per meta task, over IND, over OOD and over all. A dataset
folder not among data.MMEB_DATASETS keeps its own name; its split is OOD when the name ends in
"-OOD", IND otherwise; its meta task comes from the last word of the rest of the name (CLS ->
Classification, VQA -> VQA, T2I / I2T / RET -> Retrieval, GRD -> Visual Grounding), else "Other". The
toy benchmark's Shapes-CLS ... Shapes-GRD-OOD land this way.

Geometry (geometry=True), over the evaluated pairs, pooled over datasets:
- Pearson r between the standardised log norm product log(|q| |c+|) and cos(q, c+), over every
  matched query-gold pair (Section 6: -0.78 after direct dot training, -0.11 after PACE);
- the mean cosine of random query-candidate pairs (directional anisotropy, Section 3.2);
- norm statistics of queries and candidates;
- a PNG next to `out`: PCA of l2-normalised embeddings coloured by norm percentile, circles for
  queries and triangles for candidates (Figures 2a, 7, 9). A seeded sample of about geometry_samples
  queries and as many candidates (the paper uses 5,000), spread evenly over the datasets.
"""
import json
import math
import os
import sys
import time
import types

import torch
import torch.distributed as dist
import torch.nn.functional as F
from PIL import Image, ImageDraw, ImageFont

import data
from configurator import config_keys, configure, print_config
from model import compute_init, load_embedder

# -----------------------------------------------------------------------------
# config: every default can be overridden by a config file or --key=value
init_from = ""  # checkpoint: a Hugging Face folder, an export/ folder or a training step folder
mmeb_dir = ""  # MMEB-eval folder: one subfolder of Parquet files per dataset
image_dir = ""  # root that the rows' image paths are relative to
datasets = []  # dataset folder names to evaluate, e.g. ['ImageNet-1K', 'N24News']; [] = all in mmeb_dir
similarity = ""  # 'dot' (eq. 2) or 'cos' (eq. 1); '' = what the checkpoint was trained with
batch_size = 16  # items per forward pass
num_workers = 4  # DataLoader worker processes per rank (decode, resize, tokenise)
max_pixels = 1605632  # image pixel budget (paper: 1,605,632); 0 = the checkpoint's own
max_length = 8192  # tokens per item; text is truncated, never image placeholders or the template
skip_bad_rows = False  # skip and count malformed rows instead of stopping with an error
out = "out/eval.json"  # results as JSON; the PCA picture goes beside it (<stem>_pca.png)
geometry = True  # compute the geometry diagnostics and draw the PCA picture
geometry_samples = 5000  # queries (and as many candidates) sampled for the PCA and random pairs
seed = 0  # seeds the geometry sample
device = "cuda" if torch.cuda.is_available() else "cpu"  # 'cuda' or 'cpu'
dtype = "bfloat16" if torch.cuda.is_available() else "float32"  # compute dtype of the model
_DEFAULTS = config_keys(globals())  # main() starts from these each call, so tests can call it twice
# -----------------------------------------------------------------------------

META_TASKS = ("Classification", "VQA", "Retrieval", "Visual Grounding")
META_TASK_WORDS = {"CLS": "Classification", "VQA": "VQA", "T2I": "Retrieval", "I2T": "Retrieval",
                   "RET": "Retrieval", "GRD": "Visual Grounding"}  # last word of a non-MMEB dataset name
PCA_IMAGE_SIZE = (640, 520)  # (width, height) of the PCA picture


def dataset_group(name):
    """-> (meta task, 'IND' | 'OOD') of a dataset folder name (the rule is in the file docstring)."""
    if name in data.MMEB_DATASETS:
        return data.MMEB_DATASETS[name]
    split = "OOD" if name.endswith("-OOD") else "IND"
    base = name[:-len("-OOD")] if split == "OOD" else name
    last_word = base.replace("_", "-").split("-")[-1].upper()
    return META_TASK_WORDS.get(last_word, "Other"), split


# -----------------------------------------------------------------------------
# distinct items, encoding, scoring

def distinct_items(rows):
    """Rows -> (items, query_index (Q,), candidate_index (Q, K)): each distinct (text, image) once,
    queries and candidates alike; the indices point into items, -1 pads rows with fewer candidates."""
    items, position = [], {}

    def index(side):
        image = side.get("image")
        key = (side.get("text") or "", os.fspath(image) if isinstance(image, (str, os.PathLike)) else id(image))
        if key not in position:
            position[key] = len(items)
            items.append(side)
        return position[key]

    query_index = torch.tensor([index(row["query"]) for row in rows], dtype=torch.long)
    width = max(len(row["candidates"]) for row in rows)
    candidate_index = torch.full((len(rows), width), -1, dtype=torch.long)
    for r, row in enumerate(rows):
        candidate_index[r, :len(row["candidates"])] = torch.tensor([index(c) for c in row["candidates"]])
    return items, query_index, candidate_index


def encode_shared(embedder, items, batch_size, num_workers, rank=0, world_size=1):
    """Embeddings (N, D) of all items; under torchrun rank r encodes items[r::world_size] and the shares
    are gathered, so every rank ends with all N."""
    share = items[rank::world_size]
    mine = torch.empty(0, embedder.dim)  # (n_rank, D)
    if share:
        mine = embedder.encode(share, batch_size, num_workers, progress=rank == 0)
    if world_size == 1:
        return mine
    shares = [None] * world_size
    dist.all_gather_object(shares, mine)  # CPU tensors, pickled: no padding to equal sizes needed
    out = torch.empty(len(items), embedder.dim)
    for r, part in enumerate(shares):
        out[r::world_size] = part
    return out


def candidate_scores(query_emb, cand_emb, cand_index, similarity):
    """query_emb (Q, D), cand_emb (M, D), cand_index (Q, K) into cand_emb (-1: no candidate) ->
    scores (Q, K), -inf where there is no candidate. Row chunks bound the gathered (b, K, D) block."""
    if similarity not in ("cos", "dot"):
        raise ValueError(f"similarity must be 'cos' or 'dot', got {similarity!r}")
    if similarity == "cos":  # eq. (1): compare directions only
        query_emb, cand_emb = F.normalize(query_emb, dim=-1), F.normalize(cand_emb, dim=-1)
    num_rows, width = cand_index.shape
    scores = torch.empty(num_rows, width)
    rows_per_chunk = max(1, 2**25 // max(1, width * cand_emb.shape[1]))  # about 128 MB of float32
    for start in range(0, num_rows, rows_per_chunk):
        index = cand_index[start:start + rows_per_chunk]  # (b, K)
        candidates = cand_emb[index.clamp(min=0)]  # (b, K, D)
        query = query_emb[start:start + rows_per_chunk, None, :]  # (b, 1, D)
        scores[start:start + rows_per_chunk] = (query * candidates).sum(-1)  # (b, K): eq. (2), or eq. (1) once normalised
    return scores.masked_fill(cand_index < 0, -math.inf)


def precision_at_1(query_emb, cand_emb, cand_index, similarity):
    """Query i is a hit when candidate cand_index[i, 0] (the gold) scores strictly above every other
    candidate of row i; a tie is a miss. -> (hits, ties), ties = rows whose best other equals the gold."""
    scores = candidate_scores(query_emb, cand_emb, cand_index, similarity)  # (Q, K)
    gold = scores[:, 0]  # (Q,)
    best_other = scores[:, 1:].amax(dim=1) if scores.shape[1] > 1 else torch.full_like(gold, -math.inf)
    return int((gold > best_other).sum()), int((gold == best_other).sum())


def evaluate_dataset(embedder, rows, similarity, batch_size=16, num_workers=0, rank=0, world_size=1,
                     geometry_size=0, generator=None):
    """One dataset's rows -> (result dict, geometry sample or None). The result holds precision_at_1
    (percent), num_queries, ties and the speed figures (distinct items, dedup factor, items/s)."""
    if not rows:
        raise ValueError("a dataset with no rows")
    items, query_index, cand_index = distinct_items(rows)
    start = time.time()
    embeddings = encode_shared(embedder, items, batch_size, num_workers, rank, world_size)  # (N, D)
    seconds = time.time() - start
    query_emb = embeddings[query_index]  # (Q, D), one per row
    hits, ties = precision_at_1(query_emb, embeddings, cand_index, similarity)
    references = len(rows) + int((cand_index >= 0).sum())  # every query and candidate a row lists
    result = {"precision_at_1": 100.0 * hits / len(rows), "num_queries": len(rows), "ties": ties,
              "distinct_items": len(items), "dedup_factor": references / len(items),
              "seconds": seconds, "items_per_second": len(items) / max(seconds, 1e-9)}
    sample = None
    if geometry_size:
        candidates = embeddings[cand_index[cand_index >= 0].unique()]  # (M, D), distinct candidates
        sample = geometry_sample(query_emb, embeddings[cand_index[:, 0]], candidates, geometry_size, generator)
    return result, sample


# -----------------------------------------------------------------------------
# aggregates and the table

def mean(values):
    return sum(values) / len(values) if values else None


def aggregate(per_dataset):
    """{name: {"precision_at_1", "meta_task", "split", ...}} -> {"meta_tasks": {task: mean}, "IND",
    "OOD", "overall"}: each an unweighted mean over its datasets, as in Table 8 (None when empty)."""
    tasks = [t for t in META_TASKS if any(r["meta_task"] == t for r in per_dataset.values())]
    tasks += sorted({r["meta_task"] for r in per_dataset.values()} - set(META_TASKS))
    scores = lambda keep: [r["precision_at_1"] for r in per_dataset.values() if keep(r)]  # noqa: E731
    return {"meta_tasks": {t: mean(scores(lambda r: r["meta_task"] == t)) for t in tasks},
            "IND": mean(scores(lambda r: r["split"] == "IND")),
            "OOD": mean(scores(lambda r: r["split"] == "OOD")),
            "overall": mean(scores(lambda r: True))}


def format_table(per_dataset, summary):
    """Table 8's shape: datasets grouped by meta task (OOD marked *), the meta-task means, the final score."""
    number = lambda x: "-" if x is None else f"{x:.1f}"  # noqa: E731
    lines = [f"{'dataset':<28}{'P@1':>7}{'queries':>9}{'ties':>7}"]
    for task, task_mean in summary["meta_tasks"].items():
        names = [n for n, r in per_dataset.items() if r["meta_task"] == task]
        lines.append(f"{task} ({len(names)} datasets)")
        for name in names:
            r = per_dataset[name]
            label = name + ("*" if r["split"] == "OOD" else "")
            lines.append(f"  {label:<26}{number(r['precision_at_1']):>7}{r['num_queries']:>9}{r['ties']:>7}")
        lines.append(f"{'All ' + task:<28}{number(task_mean):>7}")
    lines.append(f"Final score ({len(per_dataset)} datasets)")
    for label, key in (("All IND", "IND"), ("All OOD", "OOD"), ("All", "overall")):
        lines.append(f"{label:<28}{number(summary[key]):>7}")
    lines.append("* out of distribution")
    return "\n".join(lines)


# -----------------------------------------------------------------------------
# geometry diagnostics

def geometry_sample(query_emb, gold_emb, cand_emb, size, generator=None):
    """What the diagnostics need from one dataset: query_emb (Q, D) and gold_emb (Q, D) row by row,
    cand_emb (M, D) its distinct candidates. Per-pair scalars are kept for every row; vectors only
    for a random sample of `size` queries and `size` candidates."""
    query_norm, gold_norm = query_emb.norm(dim=1), gold_emb.norm(dim=1)  # (Q,), (Q,)
    query_pick = torch.randperm(len(query_emb), generator=generator)[:size]
    cand_pick = torch.randperm(len(cand_emb), generator=generator)[:size]
    return {"log_norm_product": query_norm.clamp_min(1e-30).log() + gold_norm.clamp_min(1e-30).log(),  # (Q,)
            "cos_positive": F.cosine_similarity(query_emb, gold_emb, dim=1),  # (Q,)
            "query_norms": query_norm, "candidate_norms": cand_emb.norm(dim=1),  # (Q,), (M,)
            "queries": query_emb[query_pick], "candidates": cand_emb[cand_pick]}  # (s, D), (s, D)


def pearson(x, y):
    """Pearson r of two (N,) tensors; None when either is constant to float32 precision (e.g. a model
    whose final RMSNorm gives every embedding the same norm), where r would be rounding noise."""
    x, y = x.double() - x.double().mean(), y.double() - y.double().mean()
    if len(x) < 2 or x.abs().max() < 1e-5 or y.abs().max() < 1e-5:
        return None
    return float((x * y).sum() / (x.norm() * y.norm()))


def norm_stats(norms):
    return {"mean": norms.mean().item(), "std": norms.std().item() if len(norms) > 1 else 0.0,
            "min": norms.min().item(), "max": norms.max().item()}


def geometry_summary(samples, png_path=None):
    """Pool geometry_sample()s of the evaluated datasets -> summary dict; draws the PCA to png_path."""
    pooled = {key: torch.cat([s[key] for s in samples]) for key in samples[0]}
    log_norm_product = pooled["log_norm_product"]
    queries, candidates = pooled["queries"], pooled["candidates"]  # (S, D), (S', D)
    directions_q, directions_c = F.normalize(queries, dim=1), F.normalize(candidates, dim=1)
    # The mean cosine over ALL sampled (query, candidate) pairs equals mean(q_hat) . mean(c_hat): the
    # samples are drawn independently, so these are random pairs (a matched one is rare and harmless).
    # Fig. 4a standardises the log norm product; r is the same for the raw one, which keeps exact ties visible
    summary = {"norm_cos_pearson_r": pearson(log_norm_product, pooled["cos_positive"]),
               "num_matched_pairs": len(log_norm_product),
               "random_pair_mean_cos": float(directions_q.mean(0) @ directions_c.mean(0)),
               "num_random_pairs": len(queries) * len(candidates),
               "query_norm": norm_stats(pooled["query_norms"]),
               "candidate_norm": norm_stats(pooled["candidate_norms"])}
    points = torch.cat([directions_q, directions_c]).double()  # (N, D) on the unit sphere
    centred = points - points.mean(0)
    _, singular, v_transposed = torch.linalg.svd(centred, full_matrices=False)
    projected = centred @ v_transposed[:2].T  # (N, 2)
    projected = F.pad(projected, (0, 2 - projected.shape[1]))  # (N, 2) also when N or D is 1
    variance = singular**2
    summary["pca_explained_variance"] = [float(v / variance.sum().clamp_min(1e-30)) for v in variance[:2]]
    norms = torch.cat([queries.norm(dim=1), candidates.norm(dim=1)])  # (N,) of the original embeddings
    percentile = norms.argsort().argsort().double() / max(len(norms) - 1, 1)  # (N,) in [0, 1]
    is_query = torch.arange(len(points)) < len(queries)
    if png_path:
        draw_pca(projected, percentile, is_query, png_path, summary["pca_explained_variance"])
        summary["pca_png"] = png_path
    return {key: (None if isinstance(value, float) and not math.isfinite(value) else value)
            for key, value in summary.items()}


def ramp(p):
    """Norm percentile p in [0, 1] -> RGB, blue (low) to red (high)."""
    blue, red = (40, 80, 220), (220, 40, 40)
    return tuple(round(b + (r - b) * p) for b, r in zip(blue, red))


def draw_pca(projected, percentile, is_query, path, explained):
    """Scatter of projected (N, 2) points on a PCA_IMAGE_SIZE canvas with Pillow: colour = norm
    percentile, circle = query, triangle = candidate; a colour bar and a legend on the right."""
    width, height = PCA_IMAGE_SIZE
    image = Image.new("RGB", (width, height), "white")
    draw, font = ImageDraw.Draw(image), ImageFont.load_default()
    left, top, side = 30, 40, 440  # the square plot area
    draw.text((left, 12), "PCA of l2-normalised embeddings, colour = norm percentile", fill="black", font=font)
    draw.rectangle([left, top, left + side, top + side], outline=(160, 160, 160))
    low, high = projected.min(0).values, projected.max(0).values  # (2,), (2,)
    centre, half = (low + high) / 2, float((high - low).max().clamp_min(1e-12)) * 0.55  # one scale for both axes
    order = torch.randperm(len(projected), generator=torch.Generator().manual_seed(0))  # no type drawn on top
    for i in order.tolist():
        x = left + side / 2 + float(projected[i, 0] - centre[0]) / half * side / 2
        y = top + side / 2 - float(projected[i, 1] - centre[1]) / half * side / 2
        colour = ramp(float(percentile[i]))
        if is_query[i]:
            draw.ellipse([x - 3, y - 3, x + 3, y + 3], fill=colour)
        else:
            draw.polygon([(x, y - 4), (x - 4, y + 3), (x + 4, y + 3)], fill=colour)
    draw.text((left, top + side + 10), f"PC1 {100 * explained[0]:.1f}% var, PC2 "
              f"{100 * (explained[1] if len(explained) > 1 else 0):.1f}% var", fill="black", font=font)
    bar_left, bar_top, bar_height = 500, 60, 280  # the colour bar, high percentiles on top
    draw.text((bar_left - 10, bar_top - 20), "norm pct", fill="black", font=font)
    for k in range(bar_height):
        draw.line([bar_left, bar_top + k, bar_left + 16, bar_top + k], fill=ramp(1 - k / (bar_height - 1)))
    for text, y in (("100", bar_top), ("50", bar_top + bar_height // 2), ("0", bar_top + bar_height - 8)):
        draw.text((bar_left + 22, y), text, fill="black", font=font)
    legend_top = bar_top + bar_height + 40
    draw.ellipse([bar_left + 2, legend_top + 2, bar_left + 10, legend_top + 10], fill=(90, 90, 90))
    draw.text((bar_left + 18, legend_top), "query", fill="black", font=font)
    draw.polygon([(bar_left + 6, legend_top + 22), (bar_left + 1, legend_top + 31), (bar_left + 11, legend_top + 31)],
                 fill=(90, 90, 90))
    draw.text((bar_left + 18, legend_top + 20), "candidate", fill="black", font=font)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    image.save(path)


# -----------------------------------------------------------------------------
# the run

def write_json(result, path):
    """Atomic: written aside, then renamed, so a crash never leaves half a file."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    os.replace(path + ".tmp", path)


def main(args=None):
    """Run the evaluation with config overrides `args` (default: the command line). -> the JSON dict"""
    config = configure(dict(_DEFAULTS), sys.argv[1:] if args is None else args)
    c = types.SimpleNamespace(**config)
    rank, _, world_size, run_device = compute_init(c.device)
    log = print if rank == 0 else (lambda *a, **k: None)
    if rank == 0:
        print_config(config)
    for key in ("init_from", "mmeb_dir"):
        if not getattr(c, key):
            raise ValueError(f"set --{key}=...")
    if c.dtype not in ("float32", "bfloat16"):
        raise ValueError(f"dtype must be 'float32' or 'bfloat16', got {c.dtype!r}")
    extra = {"max_pixels": c.max_pixels} if c.max_pixels else {}
    embedder, info = load_embedder(c.init_from, getattr(torch, c.dtype), max_length=c.max_length, **extra)
    embedder.to(run_device).eval()
    similarity = c.similarity or info.get("similarity")
    if not similarity:
        similarity = "cos"
        log(f"{c.init_from} does not say what it was trained with (no pace.json similarity): ranking by cosine")
    if similarity not in ("cos", "dot"):
        raise ValueError(f"similarity must be 'cos' or 'dot', got {similarity!r}")
    names = list(c.datasets) or data.find_mmeb_datasets(c.mmeb_dir)
    missing = [n for n in names if not os.path.isdir(os.path.join(c.mmeb_dir, n))]
    if missing or not names:
        raise FileNotFoundError(f"datasets {missing or '(none)'} not in {c.mmeb_dir}")
    generator = torch.Generator().manual_seed(c.seed)
    geometry_size = math.ceil(c.geometry_samples / len(names)) if c.geometry else 0  # even over datasets
    per_dataset, samples = {}, []
    for name in names:
        rows = data.read_mmeb_dataset(os.path.join(c.mmeb_dir, name), c.image_dir, c.skip_bad_rows)
        result, sample = evaluate_dataset(embedder, rows, similarity, c.batch_size, c.num_workers, rank,
                                          world_size, geometry_size, generator)
        meta_task, split = dataset_group(name)
        per_dataset[name] = dict(result, meta_task=meta_task, split=split, skipped_rows=rows.skipped)
        samples += [sample] if sample else []
        log(f"{name}: P@1 {result['precision_at_1']:.1f} over {result['num_queries']} queries ({ties_text(result)}), "
            f"{result['distinct_items']} distinct items (dedup {result['dedup_factor']:.1f}x), "
            f"{result['items_per_second']:.1f} items/s", flush=True)
    summary = aggregate(per_dataset)
    output = {"datasets": per_dataset, **summary, "similarity": similarity, "init_from": c.init_from, "config": config}
    if rank == 0:
        if samples:
            png_path = os.path.splitext(c.out)[0] + "_pca.png"
            output["geometry"] = geometry_summary(samples, png_path)
            log(f"geometry: {json.dumps({k: v for k, v in output['geometry'].items() if not isinstance(v, dict)})}")
        print(format_table(per_dataset, summary))
        write_json(output, c.out)
        print(f"wrote {c.out}")
    if world_size > 1:
        dist.barrier()
        dist.destroy_process_group()
    return output


def ties_text(result):
    return f"{result['ties']} tied with the gold" if result["ties"] else "no ties"


if __name__ == "__main__":
    main()
