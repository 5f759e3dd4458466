"""
tools/geometry.py: the paper's geometry diagnostics of an embedding space (Sections 3.2 and 6, Appendix C.2), on
the evaluation data (the sample eval.py keeps of each dataset) and, as the paper does, on training rows.

    python eval.py config/shapes_eval.py && python -m tools.geometry out/shapes_eval.json
    python -m tools.geometry --init_from=out/direct_dot/export --train_data=data/mmE5/mmE5-synthetic \\
        --image_dir=data/mmE5 --out=out/direct_dot_train.json        # 5,000 training rows, as Section 3.2
    numbers = summary([eval.geometry_sample(...), ...])             # in Python: the numbers, pictures apart

For eval.py's out/X.json it writes out/X_geometry.json (the numbers, and what redraws the picture) and
out/X_geometry.png (tools/plot.py); for training rows, --out's stem.

- norm entanglement: the Pearson r between the standardised log norm product log(|q| |c+|) and cos(q, c+) over
  matched query-gold pairs (Section 6: -0.78 after direct dot training, -0.11 after PACE; Figure 4a);
- norm from direction: the cross-validated R^2 of a linear fit of the standardised log norm on the first k
  principal components of the l2-normalised embeddings, k = 2 (the PCA picture's axes) and k = 10. The paper's
  Figures 2a, 7 and 9 say that after direct dot training "embedding magnitude is largely predictable from
  direction alone": R^2 near 1 says that, near 0 that direction does not tell the norm (this measure is this
  codebase's; the paper draws the picture but gives no number);
- anisotropy: the mean cosine of random query-candidate pairs (Figures 2b, 4b), over every pair of the sampled
  queries and candidates (mean(q^) . mean(c^), exactly); the histogram draws one random pair per sampled query;
- the PCA of the normalised embeddings coloured by norm percentile (Figures 2a, 7, 9), and norm statistics.
When every embedding has the same norm (a LoRA-only cosine run keeps Qwen3.5's final RMSNorm weight, and a model
whose weight is uniform gives every embedding the norm sqrt(D)), r and R^2 are undefined: the numbers say
"all norms N" instead, and the pictures say so rather than plot rounding noise.
"""
import json
import math
import os
import random
import sys

import torch
import torch.nn.functional as F

import common
import configurator
from common import UserError

# -----------------------------------------------------------------------------
# config of the command line (every default can be overridden by --key=value)
results = []  # eval.py JSON files whose datasets' samples to measure (bare arguments go here)
init_from = ""  # or: a checkpoint whose embeddings of training rows to measure (with train_data)
train_data = []  # as train.py's: the training rows to sample
image_dir = ""  # as train.py's: where the rows' image paths are relative to
train_split = "original"  # as train.py's: the split a subset folder is read through
instructions = "paper"  # as train.py's: the queries' instructions, 'paper' (Table 5's) or 'dataset' (their own)
skip_bad_rows = False  # as train.py's: sample the rows that read well instead of refusing a source with bad rows
allow_any_image_path = False  # as train.py's: let rows name images outside image_dir
table_dir = "data/tables"  # as train.py's: where train_data is converted, once, into the prepared table
samples = 5000  # training rows sampled (the paper's 5,000), and points in a picture
out = "out/geometry.json"  # with init_from: the numbers (and beside it the picture, <stem>.png)
batch_size = 16  # items per forward pass
num_workers = 4  # DataLoader worker processes (decode, resize, tokenise)
seed = 0  # seeds the sample of training rows
device = "cuda" if torch.cuda.is_available() else "cpu"  # 'cuda' or 'cpu'
dtype = "bfloat16" if torch.cuda.is_available() else "float32"  # compute dtype of the model
# -----------------------------------------------------------------------------

FOLDS = 5  # cross-validation folds of the R^2
COMPONENTS = (2, 10)  # principal components the norm is fitted on
EQUAL_NORMS = 1e-4  # norms within this relative spread of each other are one norm (float32 rounding)


def equal_norms(norms):
    """True when every norm is the same up to float32 rounding."""
    norms = norms.double()
    return len(norms) < 2 or float((norms.max() - norms.min()) / norms.mean().clamp_min(1e-30)) < EQUAL_NORMS


def pearson(x, y):
    """Pearson r of two (N,) tensors; None when either is constant to float32 precision (e.g. a model whose final
    RMSNorm gives every embedding the same norm), where r would be rounding noise."""
    x, y = x.double() - x.double().mean(), y.double() - y.double().mean()
    if len(x) < 2 or x.abs().max() < 1e-5 or y.abs().max() < 1e-5:
        return None
    return float((x * y).sum() / (x.norm() * y.norm()))


def norm_from_direction_r2(embeddings, components=COMPONENTS, folds=FOLDS, seed=0):
    """Cross-validated R^2 of a least-squares fit (with intercept) of the standardised log norm of embeddings (N, D)
    on the first k principal components of their l2-normalised directions, for each k in components, the PCA fitted
    on each training fold alone (one SVD a fold serves every k). R^2 = 1 - sum (y - y_out_of_fold)^2 /
    sum (y - mean y)^2, pooled over the folds. -> {str(k): R^2}, None where every norm is the same (nothing to
    predict) or there are too few points for k components."""
    x = embeddings.double()
    norms = x.norm(dim=1)
    fitted = [k for k in components if not equal_norms(norms) and len(x) >= folds * (k + 2)]
    results = {str(k): None for k in components}
    if not fitted:
        return results
    target = norms.log()
    target = (target - target.mean()) / target.std()  # (N,) standardised log norm
    directions = F.normalize(x, dim=1)  # (N, D)
    fold = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed)) % folds  # (N,) fold of each point
    predicted = {k: torch.empty_like(target) for k in fitted}
    for f in range(folds):
        train, test = fold != f, fold == f
        mean = directions[train].mean(0)
        _, _, v_transposed = torch.linalg.svd(directions[train] - mean, full_matrices=False)
        for k in fitted:
            basis = v_transposed[:k].T  # (D, k)
            design = lambda rows: F.pad((directions[rows] - mean) @ basis, (1, 0), value=1.0)  # noqa: E731 - (n, 1 + k)
            coefficients = torch.linalg.lstsq(design(train), target[train, None]).solution  # (1 + k, 1)
            predicted[k][test] = (design(test) @ coefficients)[:, 0]
    for k in fitted:
        results[str(k)] = float(1 - ((target - predicted[k]) ** 2).sum() / ((target - target.mean()) ** 2).sum())
    return results


def norm_stats(norms):
    percentiles = torch.quantile(norms.double(), torch.tensor([0.05, 0.5, 0.95], dtype=torch.float64))
    return {"mean": norms.mean().item(), "std": norms.std().item() if len(norms) > 1 else 0.0,
            "min": norms.min().item(), "max": norms.max().item(), "p5_p50_p95": percentiles.tolist(),
            "all_equal": equal_norms(norms)}


def describe(numbers):
    """One line of summary()'s numbers, for the console."""
    norms = numbers["query_norm"]
    text = (f"all norms {norms['mean']:.2f} (r and R^2 undefined)" if numbers["all_norms_equal"] else
            f"r {format_number(numbers['norm_cos_pearson_r'], 3)}, norm-from-direction R^2 (k=2) "
            f"{format_number(numbers['norm_from_direction_r2']['2'])}, (k=10) "
            f"{format_number(numbers['norm_from_direction_r2']['10'])}")
    return (text + f", random-pair cos {numbers['random_pair_mean_cos']:.3f} (mean over "
            f"{numbers['num_random_pairs']:,} sampled pairs)")


def format_number(value, digits=2):
    """A number of summary() for print; "-" where it is undefined (None)."""
    return "-" if value is None else f"{value:.{digits}f}"


def summary(samples, max_points=5000):
    """Pool the samples of the evaluated datasets (eval.geometry_sample's) -> the numbers, with what redraws the
    pictures (tools/plot.py's geometry: the random-pair cosine histogram, the log norm product against cosine, the
    PCA)."""
    pooled = {key: torch.cat([s[key] for s in samples]) for key in samples[0]}
    queries, candidates = pooled["queries"], pooled["candidates"]  # (S, D), (S', D)
    directions_q, directions_c = F.normalize(queries, dim=1), F.normalize(candidates, dim=1)
    # drawn: each sampled query with a sampled candidate drawn at random (a matched one is rare and harmless)
    order = torch.randint(len(directions_c), (len(directions_q),), generator=torch.Generator().manual_seed(0))
    random_cos = (directions_q * directions_c[order]).sum(dim=1)  # (S,)
    log_product, cos_positive = pooled["log_norm_product"], pooled["cos_positive"]  # (P,), (P,)
    sampled = torch.cat([queries, candidates])  # (N, D) the original embeddings
    all_equal = equal_norms(torch.cat([pooled["query_norms"], pooled["candidate_norms"]]))
    r = None if all_equal else pearson(log_product, cos_positive)
    standardised = torch.zeros_like(log_product) if r is None else (log_product - log_product.mean()) / log_product.std()
    points = torch.cat([directions_q, directions_c]).double()  # (N, D) on the unit sphere
    centred = points - points.mean(0)
    _, singular, v_transposed = torch.linalg.svd(centred, full_matrices=False)
    projected = F.pad(centred @ v_transposed[:2].T, (0, max(0, 2 - v_transposed.shape[0])))  # (N, 2) even when D = 1
    variance = singular ** 2
    norms = sampled.norm(dim=1)  # (N,)
    percentile = (norms.argsort().argsort().double() / max(len(norms) - 1, 1)).tolist()  # (N,) in [0, 1]
    is_query = [i < len(queries) for i in range(len(points))]
    keep = torch.randperm(len(log_product), generator=torch.Generator().manual_seed(1))[:max_points]
    numbers = {"norm_cos_pearson_r": r, "num_matched_pairs": len(log_product), "all_norms_equal": all_equal,
               "norm_from_direction_r2": norm_from_direction_r2(sampled),
               "random_pair_mean_cos": float(directions_q.mean(0) @ directions_c.mean(0)),
               "num_random_pairs": len(queries) * len(candidates),
               "query_norm": norm_stats(pooled["query_norms"]), "candidate_norm": norm_stats(pooled["candidate_norms"]),
               "pca_explained_variance": [float(v / variance.sum().clamp_min(1e-30)) for v in variance[:2]],
               "pca": {"x": projected[:, 0].tolist(), "y": projected[:, 1].tolist(),
                       "norm_percentile": None if all_equal else percentile, "is_query": is_query},
               "random_pair_cos": random_cos.tolist(),
               "pairs": {"standardised_log_norm_product": standardised[keep].tolist(),
                         "cos_positive": cos_positive[keep].tolist()}}
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in numbers.items()}


# -----------------------------------------------------------------------------
# the command line

def from_results(path):
    """The diagnostics of an eval.py JSON's datasets, from the samples it kept (<stem>_datasets/<name>.geometry
    .safetensors). -> (numbers, the number of datasets)"""
    from safetensors.torch import load_file
    if not os.path.isfile(path):
        raise UserError(f"no eval.py results {path!r}")
    with open(path) as f:
        output = json.load(f)
    names = list(output.get("datasets", {})) + list(output.get("others", {}).get("datasets", {}))
    folder = output.get("datasets_folder") or os.path.splitext(path)[0] + "_datasets"
    files = [os.path.join(folder, f"{name}.geometry.safetensors") for name in names]
    missing = [f for f in files if not os.path.isfile(f)]
    if missing:
        raise UserError(f"{path}: no geometry sample {missing[0]} (run eval.py with --geometry=True)")
    return summary([load_file(f) for f in files], output["config"].get("geometry_samples", 5000)), len(names)


def from_training_rows(path, table, count, seed, batch_size, num_workers, dtype, device):
    """The diagnostics of `count` rows of the prepared table (data.TrainTable) sampled with seed, embedded by the
    checkpoint at path, as the paper measures them: query-positive pairs for the Pearson r, queries against other
    rows' positives for the random pairs."""
    import data
    from runs import results
    from runs.export import load_for_inference
    picked = random.Random(seed).sample(range(len(table)), min(count, len(table)))
    rows = [data.row_with_negatives(table, i, 0, seed) for i in picked]
    embedder, _ = load_for_inference(path, dtype, common.compute_init(device)[3])
    items = [row["query"] for row in rows] + [row["candidates"][0] for row in rows]
    items = [dict(side, video=data.video_of(side["video"])) if "video" in side else side for side in items]
    embeddings = embedder.encode(items, batch_size, common.worker_count(num_workers), progress="training rows")
    queries, positives = embeddings[:len(rows)], embeddings[len(rows):]
    generator = torch.Generator().manual_seed(seed + 1)
    return summary([results.geometry_sample_of(queries, positives, positives, len(rows), generator)], count)


def main(argv=None):
    """The diagnostics of eval.py results (bare arguments) or of training rows (init_from), printed, written and
    drawn. -> {path written: numbers}"""
    configurator.configure(globals(), sys.argv[1:] if argv is None else argv, positional="results")
    if not results and not (init_from and train_data):
        raise UserError("name eval.py results (python -m tools.geometry out/eval.json) or a checkpoint and its "
                        "training rows (--init_from=... --train_data=...)")
    from tools import plot
    written = {}
    for path in results:
        numbers, count = from_results(path)
        title = f"{path}: {count} evaluation datasets"
        written[write(numbers, stem_of(path), title, plot)] = numbers
    if init_from:
        from readers import training
        table = training.checked_table(train_data, image_dir, table_dir, 0, train_split, instructions,
                                       allow_any_image_path, skip_bad_rows, allow_eval_datasets=True)
        numbers = from_training_rows(init_from, table, samples, seed, batch_size, num_workers, dtype, device)
        written[write(numbers, os.path.splitext(out)[0], f"{init_from}: {samples} training rows", plot)] = numbers
    return written


def stem_of(results):
    """Where the geometry of eval.py's results file out/X.json goes: out/X_geometry (.json and .png)."""
    return os.path.splitext(results)[0] + "_geometry"


def write(numbers, stem, title, plot):
    """<stem>.json and <stem>.png, and one line of the numbers. -> the JSON's path"""
    common.write_json(stem + ".json", numbers)
    picture = plot.save(plot.geometry(numbers, title), stem + ".png")
    print(f"{title}: {describe(numbers)}; wrote {stem}.json, drew {picture}")
    return stem + ".json"


if __name__ == "__main__":
    common.install_error_hook()
    main()
