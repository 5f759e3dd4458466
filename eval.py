"""
eval.py: MMEB Precision@1 of an embedder, per dataset and as the paper's Table 8; MMEB-V2's 78 tasks as VLM2Vec-V2
scores them.

    python eval.py --init_from=out/stage2/export --mmeb_dir=data/MMEB-eval --image_dir=data/eval_images
    torchrun --nproc_per_node=8 eval.py --init_from=out/stage2/step_002000 --mmeb_dir=... --image_dir=...
    python eval.py config/shapes_eval.py                          # the toy: ten image datasets, three of video, pages
    python eval.py --mmeb_dir=data/MMEB-eval --image_dir=data/eval_images --check_data=True   # no model
    python -m tools.geometry out/shapes_eval.json                 # then the geometry diagnostics, drawn

    python eval.py --init_from=out/stage2/export --mmeb_dir=data/MMEB-V2/annotations \
        --image_dir=data/MMEB-V2/image-tasks --v2_dir=data/MMEB-V2         # MMEB-V2: image, video, visual documents
    python eval.py --init_from=... --v2_dir=data/MMEB-V2 --v2_tasks="['VID_QA']"   # one family (or task, or 'video')

init_from is a Hugging Face folder (a release or an export/) or a training step folder. The config globals below
are the defaults; main() resolves config files and --key=value over them and passes the values on explicitly.

Which datasets: by default MMEB's 36, every one of them found in mmeb_dir (an MMEB-eval download also holds
CIFAR-100, which no MMEB score includes). A folder that is not one of the 36 (CIFAR-100, your own) is scored only
when named in `datasets`, and then in a part of its own, never in MMEB's meta-task, IND, OOD or overall means; a
folder holding no MMEB dataset at all (the toy) is scored whole, with its own aggregate. When some of the 36 are
missing, the table and the JSON say 'N of 36' and name them: that is not an MMEB overall score.

Precision@1: a query is a hit when its gold candidate (index 0) scores strictly above every other candidate
of its row; a tie with the gold is a miss (a model that maps everything to one vector scores 0, not 100), and
tied rows are counted. precision_at_1_argmax is the official MMEB scorer's reading (np.argmax, the first of
equal scores, so a tie goes to the gold), to set beside published numbers. Scores are s_dot (eq. 2) or s_cos
(eq. 1): by default the checkpoint's own, its embedding spec's (PACE ranks by the dot product). Queries carry the
paper's instructions (instructions='paper', readers/mmeb.py) or their datasets' own ('dataset'); per dataset the
JSON says how many were rewritten or kept, and which layout (v1, or MMEB-V2's instruction columns) was read.

Speed: MMEB rows share candidates heavily, so each dataset's distinct (text, image) items are encoded once,
in length-sorted batches. Under torchrun each rank encodes a strided share and the shares are gathered; every
rank scores all rows, rank 0 prints and writes. Each finished dataset is kept in <stem>_datasets/, keyed to the
checkpoint, its embedding spec and every setting that changes a score: a rerun reads it back.

MMEB-V2 (v2_dir): its video and visual-document tasks (readers/mmeb_v2_rows.py) are ranked as VLM2Vec-V2 ranks
them, over a task's de-duplicated pool or each row's own candidates, and scored by its metrics (readers/mmeb_v2.py:
hit@1 for video, nDCG@5 with the qrels' grades for documents, and the rest at 1, 5 and 10); an image task's hit@1
comes from its P@1 run, whose scores it ranks. The table and the JSON's "mmeb_v2" give family, modality and
all-task means, and name what is missing: only all 78 tasks make "MMEB-V2 overall". Your own tasks in those layouts
(v2_dir/own_tasks.json names the task whose layout each takes: readers/mmeb_v2_data.own_tasks; the toy's three) are
read and scored as that task is, and reported apart (a table of their own, the JSON's "own_v2"), in no MMEB-V2 mean.

Beside the scores it keeps what the tools draw from: with geometry=True, a sample of each dataset's embeddings
(<stem>_datasets/<name>.geometry.safetensors) for tools/geometry.py, the paper's geometry diagnostics; with
sheet_queries > 0, each dataset's sampled queries and their top candidates, which python -m tools.plot draws.
"""
import math
import os
import sys
import time
import zlib
from collections.abc import Sequence

import torch
import torch.distributed as dist

import common
import configurator
import loss
import rerank
from common import UserError
from readers import mmeb, mmeb_v2
from readers.evaluation import check_datasets, read_eval_dataset, which_datasets
from readers.mmeb_v2_data import v2_reader
from readers.mmeb_v2_rows import check_v2_tasks, read_v2_task, select_v2_tasks
from readers.reports import summary
from runs.checkpoint import fingerprint
from runs.export import changed_settings, dim_line, load_for_inference
from runs.reranker import load_reranker
from runs.results import (dataset_key, geometry_sample, keep_result, kept_results, report, scores_section,
                          sheet_rows, v2_section)

# -----------------------------------------------------------------------------
# config: every default can be overridden by a config file or --key=value
init_from = ""  # checkpoint: a Hugging Face folder, an export/ folder or a training step folder
mmeb_dir = ""  # an MMEB-eval download (or MMEB-V2 image tasks): one folder of Parquet files per dataset
image_dir = ""  # where the rows' image paths are relative to: where images.zip was unzipped
v2_dir = ""  # an MMEB-V2 download (video-tasks/, visdoc-tasks/, annotations/): its video and visual-document tasks
v2_tasks = []  # of those: task keys, families (VID_QA, ViDoRe_v1, ...) or 'video' / 'visdoc'; [] = every one found
datasets = []  # dataset folder names to score, e.g. ['ImageNet-1K', 'CIFAR-100']; [] = MMEB's 36 (all, if none is MMEB's)
allow_missing_datasets = False  # a dataset folder without Parquet files: listed as omitted instead of an error
check_data = False  # read every dataset and image path as the evaluation would, report and exit (0: it would run)
similarity = ""  # 'dot' (eq. 2) or 'cos' (eq. 1); '' = the checkpoint's own (its embedding spec's)
instructions = "paper"  # queries: 'paper' = Table 5's instruction per task format (readers/mmeb.py), 'dataset' = their own
batch_size = 16  # items per forward pass
num_workers = 4  # DataLoader worker processes per rank (decode, resize, tokenise); at most the rank's share of the cores
max_pixels = 0  # image pixel budget; 0 = the checkpoint's own (its spec's; a release: the paper's 1,605,632)
video_frames = 0  # frames a video keeps, spread evenly (VLM2Vec-V2: 8, Qwen3-VL-Embedding: 64); 0 = the checkpoint's
video_max_pixels = 0  # a video's pixel budget over all its kept frames (t * h * w); 0 = the checkpoint's own
max_length = 0  # tokens per item, text truncated (never the image or template); 0 = the checkpoint's own (8,192)
dim = 0  # the vectors' first dim dimensions (Matryoshka: see the spec's matryoshka_dims); 0 = the checkpoint's
skip_bad_rows = False  # skip and count malformed rows instead of stopping with an error
allow_any_image_path = False  # let rows name images outside image_dir
rerank_from = ""  # a reranker (train.py objective='rerank'): each query's top rerank_top rescored by it, scores before and after
rerank_top = 10  # how many of the embedder's best candidates of each query the reranker rescores
keep_card = False  # leave an export's model card as it is (else a whole-benchmark run at its own settings updates it)
out = "out/eval.json"  # results as JSON; what the tools draw from goes beside it (<stem>_datasets/)
overwrite = False  # recompute every dataset, also those an earlier run finished (kept in <stem>_datasets/) with the same key
geometry = True  # keep a sample of each dataset's embeddings for python -m tools.geometry OUT
geometry_samples = 5000  # queries (and as many candidates) sampled over all datasets for the geometry
sheet_queries = 0  # > 0: keep this many queries a dataset with their top candidates, drawn by python -m tools.plot OUT
sheet_top_k = 3  # candidates a sheet shows per query
seed = 0  # seeds the geometry samples and the sheets' queries
device = "cuda" if torch.cuda.is_available() else "cpu"  # 'cuda' or 'cpu'
dtype = "bfloat16" if torch.cuda.is_available() else "float32"  # compute dtype of the model
threads = 0  # torch threads on a CPU (0: torch's default)
timeout_minutes = 10.0  # a collective that waits longer (a stopped or dead rank) ends the run
wandb_log = False  # log the results to the W&B run of the checkpoint's out_dir
wandb_project = "pace"  # W&B project
# -----------------------------------------------------------------------------


# -----------------------------------------------------------------------------
# distinct items, encoding, scoring

class Share(Sequence):
    """items[indices[k]] as the k-th item, looked up when asked: a visual-document pool builds each page when
    it is read, so a rank's share never holds every page's pixels at once."""

    def __init__(self, items, indices):
        self.items, self.indices = items, indices

    def __len__(self):
        return len(self.indices)

    def __getitem__(self, k):
        return self.items[self.indices[k]]


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
    """-> (embeddings (N, D) of all items, how many of their images were shrunk to fit max_length); under torchrun
    rank r encodes items[r::world_size] and the shares are gathered (common.shared_rows), so every rank ends with
    all N. label: rank 0 prints progress under it. An image too large for max_length at the spec's pixel budget
    (a 4000x3000 photo at a release's own) is embedded at the largest grid that fits, where load_for_inference
    loaded the embedder (Preprocessor.fit_images)."""
    preprocessor = embedder.preprocessor

    def encode(indices):
        share = Share(items, indices)
        if not share:
            return torch.empty(0, embedder.dim), torch.empty(0, dtype=torch.bool)  # a rank with nothing to encode
        seen = len(preprocessor.shrunk)  # num_tokens notes each shrunk image once, as it measures the item
        vectors = embedder.encode(share, batch_size, num_workers, progress=label if rank == 0 else "")  # (n_rank, D)
        return vectors, torch.arange(len(share)) < len(preprocessor.shrunk) - seen  # (n_rank,): a count, gathered
    embeddings, shrunk = common.shared_rows(encode, len(items), rank, world_size)
    return embeddings, int(shrunk.sum())


def candidate_scores(query_emb, cand_emb, cand_index, similarity):
    """query_emb (Q, D), cand_emb (M, D), cand_index (Q, K) into cand_emb (-1: no candidate) -> scores (Q, K),
    -inf where there is no candidate: the plain dot products of loss.comparison_vectors vectors, as training scores them.
    Row chunks bound the gathered (b, K, D) block."""
    query_emb, cand_emb = loss.comparison_vectors(query_emb, similarity), loss.comparison_vectors(cand_emb, similarity)
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


def gold_first_metrics(scores):
    """scores (Q, K), the gold at column 0 -> precision_at_1, precision_at_1_argmax (percent) and ties
    (precision_at_1), and v2_hit_at_1: MMEB-V2 scores an image task by hit@1 of VLM2Vec-V2's ranking (its numpy sort:
    ties in its order)."""
    hits, ties, argmax_hits = precision_at_1(scores)
    v2_hit = mmeb_v2.ranking_metrics(scores, [str(k) for k in range(scores.shape[1])], [["0"]] * len(scores), ks=(1,))
    return {"precision_at_1": 100.0 * hits / len(scores), "precision_at_1_argmax": 100.0 * argmax_hits / len(scores),
            "v2_hit_at_1": 100.0 * v2_hit["hit@1"], "ties": ties}


def evaluate_dataset(embedder, rows, similarity, batch_size=16, num_workers=0, rank=0, world_size=1, label=""):
    """One dataset's rows -> (result dict, embeddings (N, D), query_index, cand_index, scores (Q, K)). The result
    holds precision_at_1 and precision_at_1_argmax (percent), num_queries, ties, the candidate-count range and the
    speed figures. Non-finite embeddings are an error naming the dataset."""
    if not rows:
        raise UserError(f"{label or 'a dataset'}: no rows")
    items, query_index, cand_index = distinct_items(rows)
    start = time.time()
    embeddings, shrunk = encode_shared(embedder, items, batch_size, num_workers, rank, world_size, label)  # (N, D)
    seconds = time.time() - start
    bad = (~torch.isfinite(embeddings).all(dim=1)).nonzero().flatten()
    if len(bad):
        item = items[int(bad[0])]
        raise UserError(f"{label or 'dataset'}: the model gave non-finite embeddings for {len(bad)} of its "
                        f"{len(items)} items, e.g. {item.get('text', '')[:60]!r} (image {item.get('image')})")
    scores = candidate_scores(embeddings[query_index], embeddings, cand_index, similarity)  # (Q, K)
    counts = (cand_index >= 0).sum(dim=1)  # (Q,) candidates a row
    result = {**gold_first_metrics(scores),
              "num_queries": len(rows), "candidates": [int(counts.min()), int(counts.max())],
              "distinct_items": len(items), "dedup_factor": (len(rows) + int(counts.sum())) / len(items),
              "seconds": seconds, "items_per_second": len(items) / max(seconds, 1e-9), "images_shrunk": shrunk}
    return result, embeddings, query_index, cand_index, scores


# -----------------------------------------------------------------------------
# the run, one dataset after another, each kept as it finishes

SCORE_KEYS = ("instructions", "dtype", "image_dir", "skip_bad_rows", "allow_any_image_path", "geometry", "seed",
              "sheet_queries", "sheet_top_k")  # the settings that change a dataset's result (with the spec, the files)


def reranked_by(settings):
    """What a reranked result's key adds: the reranker (path, fingerprint) and rerank_top; {} without one, so the keys
    of a plain evaluation stay what they were."""
    return {"reranker": settings["reranker"]} if settings.get("reranker") else {}


def evaluate_all(embedder, names, mmeb_dir, image_dir, stem, settings, rank, world_size, log, checkpoint_id,
                 reranker=None):
    """Every dataset of `names` -> per-dataset results, each kept in <stem>_datasets/ as it finishes (with its
    geometry sample when settings["geometry"]; with a reranker, its rescoring of each row's top settings[
    "rerank_top"] under "reranked"). A dataset an earlier run with the same checkpoint, spec and settings (the
    reranker's among them) finished is read back, not encoded again."""
    folder = stem + "_datasets"
    geometry_size = math.ceil(settings["geometry_samples"] / len(names)) if settings["geometry"] else 0
    keys = {name: dataset_key(name, os.path.join(mmeb_dir, name), embedder.spec, checkpoint_id,
                              dict({k: settings[k] for k in SCORE_KEYS}, geometry_size=geometry_size,
                                   **reranked_by(settings))) for name in names}
    kept = common.on_rank_zero(lambda: kept_results(folder, keys, settings["overwrite"]), rank, world_size)  # all alike
    workers = common.worker_count(settings["num_workers"])
    per_dataset = {}
    for name in names:
        if name in kept:
            per_dataset[name] = kept[name]
            log(f"{name}: P@1 {kept[name]['precision_at_1']:.1f}, kept from an earlier run with the same checkpoint "
                f"and settings ({os.path.join(folder, name + '.json')}; --overwrite=True recomputes it)")
            continue
        generator = torch.Generator().manual_seed(settings["seed"] * 1_000_003 + zlib.crc32(name.encode()))
        rows, report = read_eval_dataset(os.path.join(mmeb_dir, name), image_dir, settings["skip_bad_rows"],
                                         settings["instructions"], settings["allow_any_image_path"])
        result, embeddings, query_index, cand_index, scores = evaluate_dataset(
            embedder, rows, embedder.spec.similarity, settings["batch_size"], workers, rank, world_size, label=name)
        meta_task, split = mmeb.dataset_group(name)
        per_dataset[name] = dict(result, meta_task=meta_task, split=split, layout=report.layout,
                                 instructions=report.instructions["counts"], bad_rows=dict(report.bad))
        if reranker is not None:  # the embedder's top rerank_top of each row, rescored: P@1 and hit@1 after
            pair = lambda q, k: (rows[q]["query"], rows[q]["candidates"][k])  # noqa: E731
            reranked, in_top, cost = rerank.rescore_top(reranker, pair, scores, settings["rerank_top"],
                                                        settings["batch_size"], workers, rank, world_size,
                                                        f"{name}: reranking")
            per_dataset[name]["reranked"] = dict(cost, **gold_first_metrics(reranked),
                                                 gold_in_top=100.0 * float(in_top[:, 0].float().mean()))
        sample = geometry_sample(embeddings, query_index, cand_index, geometry_size, generator) if geometry_size else None
        if settings["sheet_queries"]:
            per_dataset[name]["sheet"] = sheet_rows(name, rows, scores, settings["sheet_queries"],
                                                    settings["sheet_top_k"], settings["seed"])
        if rank == 0:
            keep_result(folder, name, keys[name], per_dataset[name], sample)
        low, high = result["candidates"]
        log(f"{name}: P@1 {result['precision_at_1']:.1f} (argmax {result['precision_at_1_argmax']:.1f}) over "
            f"{result['num_queries']} queries ({result['ties']} tied with the gold), {result['distinct_items']} "
            f"distinct items (dedup {result['dedup_factor']:.1f}x), {result['items_per_second']:.1f} items/s; "
            f"layout {report.layout}, instructions: {summary(report.instructions['counts'])}"
            + (f"; {result['images_shrunk']} images too large for max_length shrunk to fit" if result.get("images_shrunk")
               else "") + (f"; WARNING: rows hold {low} to {high} candidates, not one count" if low != high else ""),
            flush=True)
        if "reranked" in per_dataset[name]:
            after = per_dataset[name]["reranked"]
            log(f"{name}: reranked top {after['top']}: P@1 {result['precision_at_1']:.1f} -> {after['precision_at_1']:.1f} "
                f"(the gold in the top {after['top']}: {after['gold_in_top']:.1f} %), {after['queries_per_second']:.2f} "
                f"queries/s", flush=True)
    return per_dataset


# -----------------------------------------------------------------------------
# MMEB-V2's video and visual-document tasks: read by readers/mmeb_v2_rows.py, ranked and scored as VLM2Vec-V2
# does by readers/mmeb_v2.py; the 36 image tasks are the datasets above, their hit@1 beside their P@1

def evaluate_v2_task(embedder, task, similarity, batch_size=16, num_workers=0, rank=0, world_size=1, reranker=None,
                     top=10):
    """One video or visual-document task (a readers.mmeb_v2_rows task dict) -> its result: VLM2Vec's metrics
    (fractions: hit@k, ndcg_linear@k, ... for k = 1, 5, 10), the counts and the speed. Its queries and its
    de-duplicated pool are each encoded once (under torchrun a strided share per rank, gathered), scored (Q, M) as
    training scores them, and ranked over the pool (eval_type global) or each row's own candidates (local)."""
    queries, pool = task["queries"], task["candidates"]
    if not queries or not len(pool):
        raise UserError(f"{task['name']}: no queries or no candidates")
    items = Joined(queries, pool)  # (Q + M) items, a visual-document pool's built when read
    start = time.time()
    embeddings, shrunk = encode_shared(embedder, items, batch_size, num_workers, rank, world_size, task["name"])
    seconds = time.time() - start
    if not torch.isfinite(embeddings).all():
        raise UserError(f"{task['name']}: the model gave non-finite embeddings")
    query_emb = loss.comparison_vectors(embeddings[:len(queries)], similarity)  # (Q, D)
    pool_emb = loss.comparison_vectors(embeddings[len(queries):], similarity)  # (M, D)
    scores = (query_emb @ pool_emb.T).float()  # (Q, M), eq. (2) / (1)
    metrics = mmeb_v2.ranking_metrics(scores, task["candidate_names"], task["labels"], task["rel_scores"],
                                      task["local"])
    if reranker is not None:  # each query's top `top` of the pool (of its own candidates, local) rescored
        if task["local"] is not None:
            column = {name: j for j, name in enumerate(task["candidate_names"])}
            own = torch.zeros_like(scores, dtype=torch.bool)
            for q, names in enumerate(task["local"]):
                own[q, [column[n] for n in names]] = True  # ranking_metrics above refused a name not in the pool
            scores = scores.masked_fill(~own, -math.inf)
        reranked, _, cost = rerank.rescore_top(reranker, lambda q, m: (queries[q], pool[m]), scores, top, batch_size,
                                        num_workers, rank, world_size, f"{task['name']}: reranking")
        metrics["reranked"] = dict(cost, **mmeb_v2.ranking_metrics(reranked, task["candidate_names"], task["labels"],
                                                                   task["rel_scores"], task["local"]))
    return dict(metrics, num_queries=len(queries), candidates=len(pool), seconds=seconds,
                items_per_second=len(items) / max(seconds, 1e-9), seconds_per_1000_items=1000 * seconds / len(items),
                images_shrunk=shrunk)


class Joined(Sequence):
    """queries, then a pool that builds its items when asked (a visual-document pool): one sequence."""

    def __init__(self, queries, pool):
        self.queries, self.pool = queries, pool

    def __len__(self):
        return len(self.queries) + len(self.pool)

    def __getitem__(self, k):
        return self.queries[k] if k < len(self.queries) else self.pool[k - len(self.queries)]


def evaluate_v2(embedder, names, v2_dir, stem, settings, rank, world_size, log, checkpoint_id, reranker=None):
    """Every V2 task of `names` -> {name: result}, each kept in <stem>_datasets/v2_<name>.json as it finishes and
    read back by a rerun with the same checkpoint, spec, settings and annotation files."""
    folder, per_task = stem + "_datasets", {}
    workers = common.worker_count(settings["num_workers"])
    keep = {"dtype": settings["dtype"], "skip_bad_rows": settings["skip_bad_rows"], "v2_dir": os.path.abspath(v2_dir),
            **reranked_by(settings)}
    for name in names:
        task = read_v2_task(v2_dir, name, settings["skip_bad_rows"])
        files = sorted(task["report"]["files"])
        key = dataset_key(name, files, embedder.spec, checkpoint_id, keep)
        kept = common.on_rank_zero(lambda: kept_results(folder, {"v2_" + name: key}, settings["overwrite"]), rank,
                                   world_size)
        if kept:
            per_task[name] = kept["v2_" + name]
            log(f"{name}: kept from an earlier run with the same checkpoint and settings "
                f"({os.path.join(folder, 'v2_' + name + '.json')}; --overwrite=True recomputes it)")
            continue
        most, reader = task["report"].get("frames", {}).get("max", 0), v2_reader(v2_dir, name)
        if "all" in reader.extra.get("budget", ()) and most > embedder.spec.video_frames:
            log(f"{name}: WARNING: VLM2Vec-V2 embeds every saved frame of its videos (up to {most} here); "
                f"--video_frames={embedder.spec.video_frames} keeps fewer (--video_frames={most} for its reading)")
        result = evaluate_v2_task(embedder, task, embedder.spec.similarity, settings["batch_size"], workers, rank,
                                  world_size, reranker, settings.get("rerank_top"))
        info = mmeb_v2.v2_task(reader.extra.get("like", name))  # your own task: that of the task whose layout it takes
        unreachable = task["report"].get("unreachable", 0)  # an answer none of its row's options is: VLM2Vec's miss
        per_task[name] = dict(result, family=info.family, metric=info.metric, eval_type=info.eval_type,
                              skipped=task["report"]["skipped"], unreachable_golds=unreachable,
                              **({"layout": reader.extra["like"]} if "like" in reader.extra else {}))
        if rank == 0:
            keep_result(folder, "v2_" + name, key, per_task[name], None)
        log(f"{name}: {info.metric} {100 * result[info.metric]:.1f} ({info.family}, {info.eval_type}) over "
            f"{result['num_queries']} queries and {result['candidates']} candidates, "
            f"{result['seconds_per_1000_items']:.1f} s per 1,000 items" +
            (f"; skipped rows: {summary(task['report']['skipped'])}" if task["report"]["skipped"] else "") +
            (f"; {unreachable} answers none of their options (misses, as VLM2Vec scores them)" if unreachable else ""),
            flush=True)
        if "reranked" in result:
            after = result["reranked"]
            log(f"{name}: reranked top {after['top']}: {info.metric} {100 * result[info.metric]:.1f} -> "
                f"{100 * after[info.metric]:.1f}, {after['queries_per_second']:.2f} queries/s", flush=True)
    return per_task


def card_verdict(init_from, embedder, output, missing):
    """Why this evaluation leaves the export's model card alone ('' when it may write its table there): only a run of
    the whole benchmark at the export's own settings speaks for the card; a part, or other settings, its JSON alone."""
    width = embedder.model.config.text_config.hidden_size
    changed = changed_settings(init_from, width, similarity=similarity, max_length=max_length, max_pixels=max_pixels,
                               video_frames=video_frames, video_max_pixels=video_max_pixels, dim=dim)
    reasons = (["keep_card=True"] if keep_card else []) + [f"{key} {now!r}, not its own {own!r}" for key, (own, now)
                                                            in changed.items()]
    reasons += [f"{key}={value!r} (a part of the benchmark)" for key, value in (("datasets", datasets),
                                                                               ("v2_tasks", v2_tasks)) if value]
    reasons += [f"MMEB's {', '.join(missing)} missing"] if missing else []
    return "; ".join(reasons) + (f"; the results are in {out} only" if reasons else "")


def main(argv=None):
    """Run the evaluation with config overrides argv (default: the command line). -> the JSON dict"""
    config = configurator.configure(globals(), sys.argv[1:] if argv is None else argv)
    configurator.check_choice("dtype", dtype, ("float32", "bfloat16"))
    configurator.check_choice("similarity", similarity, ("",) + loss.SIMILARITIES)
    configurator.check_choice("instructions", instructions, ("paper", "dataset"))
    configurator.check_counts(config, ("rerank_top",))
    if not (mmeb_dir or v2_dir) or not (init_from or check_data):
        raise UserError("set --mmeb_dir=... (MMEB's image tasks) and/or --v2_dir=... (MMEB-V2's video and visual-"
                        "document tasks), and --init_from=...")
    rank, _, world_size, run_device = common.compute_init(device, timeout_minutes)
    log = print if rank == 0 else (lambda *a, **k: None)
    mmeb_names, other_names, omitted, missing = (which_datasets(mmeb_dir, image_dir, datasets, allow_missing_datasets,
                                                                log) if mmeb_dir else ([], [], [], []))
    v2_names = select_v2_tasks(v2_dir, v2_tasks, log) if v2_dir else []
    if check_data:
        code = check_datasets(mmeb_names + other_names, mmeb_dir, image_dir, skip_bad_rows, instructions, allow_any_image_path,
                     log) if mmeb_dir else 0
        problems = check_v2_tasks(v2_names, v2_dir, skip_bad_rows, log)
        if v2_dir:
            verdict = ("the evaluation would NOT run:\n  " + "\n  ".join(problems)) if problems else \
                "the evaluation would run"
            log(f"check_data: {len(v2_names)} MMEB-V2 video and visdoc tasks; {verdict}")
        sys.exit(1 if code or problems else 0)
    if threads:
        torch.set_num_threads(threads)
    if rank == 0:
        configurator.print_config(config)
    started = time.time()
    embedder, info = load_for_inference(init_from, dtype, run_device, max_length=max_length, max_pixels=max_pixels,
                                        similarity=similarity, video_frames=video_frames,
                                        video_max_pixels=video_max_pixels, dim=dim)
    log(dim_line(init_from, embedder))
    reranker = None
    if rerank_from:  # its fingerprint and rerank_top key every reranked result
        reranker = load_reranker(rerank_from, getattr(torch, dtype), max_length=max_length, max_pixels=max_pixels,
                                 video_frames=video_frames, video_max_pixels=video_max_pixels)[0].to(run_device).eval()
        reranker.preprocessor.fit_images = True
    settings = {key: config[key] for key in SCORE_KEYS + ("geometry_samples", "batch_size", "num_workers",
                                                          "overwrite", "rerank_top")}
    settings["reranker"] = [os.path.abspath(rerank_from), fingerprint(rerank_from), rerank_top] if reranker else None
    stem = os.path.splitext(out)[0]
    checkpoint_id = fingerprint(init_from)
    per_dataset = evaluate_all(embedder, mmeb_names + other_names, mmeb_dir, image_dir, stem, settings, rank, world_size,
                               log, checkpoint_id, reranker) if mmeb_dir else {}
    per_task = evaluate_v2(embedder, v2_names, v2_dir, stem, settings, rank, world_size, log, checkpoint_id, reranker)
    main_names = mmeb_names or other_names  # MMEB's datasets; the others apart. Without MMEB's, the others alone
    image_part = scores_section({n: per_dataset[n] for n in main_names}, missing, bool(mmeb_names)) if mmeb_dir else {}
    output = {"benchmark": "MMEB" if mmeb_names else "other" if mmeb_dir else "MMEB-V2", **image_part,
              "omitted": omitted, "similarity": embedder.spec.similarity, "spec": embedder.spec.to_dict(),
              "init_from": init_from, "dim": embedder.dim, "datasets_folder": stem + "_datasets", "config": config}
    own = {n: r for n, r in per_task.items() if "layout" in r}  # v2_dir's own tasks: apart, in no MMEB-V2 mean
    if v2_dir and (len(own) < len(per_task) or mmeb_names or not own):
        output["mmeb_v2"] = v2_section({n: r for n, r in per_task.items() if n not in own},
                                       {n: per_dataset[n] for n in mmeb_names})
    if own:
        output["own_v2"] = own
    if mmeb_names and other_names:
        output["others"] = scores_section({n: per_dataset[n] for n in other_names}, [], False)
    if reranker is not None:  # the embedder's P@1 and the reranked, over every dataset scored
        done = [r for r in per_dataset.values() if "reranked" in r]
        before, after = (sum(f(r) for r in done) / max(len(done), 1) for f in (lambda r: r["precision_at_1"],
                                                                               lambda r: r["reranked"]["precision_at_1"]))
        output["reranked"] = {"rerank_from": rerank_from, "top": rerank_top, "datasets": len(done),
                              "mean_precision_at_1_before": before, "mean_precision_at_1_after": after,
                              "queries_per_second": sum(r["num_queries"] for r in done) / max(
                                  sum(r["reranked"]["seconds"] for r in done), 1e-9)}
        log(f"reranked by {rerank_from}, the top {rerank_top} of each query: mean P@1 over {len(done)} datasets "
            f"{before:.1f} -> {after:.1f}, {output['reranked']['queries_per_second']:.2f} queries/s")
    if rank == 0:
        if own:
            print(mmeb_v2.format_own_v2(own) + "\n")
        card = card_verdict(init_from, embedder, output, missing) if info else ""
        report(output, out, started, init_from if info and not card else "", wandb_project if wandb_log else "")
        if card:
            print(f"the model card of {init_from} is left as it is: {card}")
    if world_size > 1:
        dist.barrier()
        dist.destroy_process_group()
    return output


if __name__ == "__main__":
    common.install_error_hook()
    main()
