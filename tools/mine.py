"""
tools/mine.py: hard negatives mined with an embedder and, if asked, judged by a generative VLM, UniME-V2's recipe (Gu
et al., AAAI 2026: global retrieval, MLLM-as-a-judge, refined sampling), written in the mmE5 layout train.py reads.

    python -m tools.mine --init_from=out/shapes_stage1/export --train_data=data/shapes/train.jsonl \\
        --image_dir=data/shapes/images --out=out/mined
    python -m tools.mine ... --judge_from=/models/Qwen3.5-2B --num_hard_negatives=8   # with the judge's scores
    torchrun --nproc_per_node=8 -m tools.mine ...                                    # every rank a share
    python train.py config/shapes_stage1.py --train_data=out/mined --image_dir=data/shapes/images

Rows are read as train.py reads train_data (its prepared table, readers/training.py; no negatives, instructions
not rewritten) and each distinct query and candidate embedded once (eval.encode_shared). Global retrieval: each query ranks its
subset's positives (data.py fills from the same subset too) by the embedder's similarity (loss.similarity_matrix:
the checkpoint's, cosine for a plain release) but its own positive and the positive's near-duplicates (cosine
above duplicate_threshold); the best pool_size stay, hardest first (UniME-V2: 50). Without a judge a row's
negatives are the first num_hard_negatives. With judge_from, the judge scores the query against its positive and
each pooled candidate, s = e_yes / (e_yes + e_no) (tools/judge.py), and refined sampling (refined_picks) keeps those
with s <= s(positive) - judge_margin, hardest first, cyclically when fewer remain: the rest are false negatives.
The judge runs in chunks of judge_chunk_rows rows, each written to <out>.judge/ when done (atomically, named by a
digest of its pairs, the judge and the prompt); a rerun skips the chunks it finds, and says so.

Written: out/<subset>/train.parquet per subset (out reads back as a download root, train_data=out, its subsets
named as before): qry, qry_image_path, pos_text, pos_image_path, neg_text, neg_image_path (Python list literals,
as mmE5 writes them), neg_score (the retrieval scores) and, judged, pos_judge (a float) and neg_judge (a list
literal); image paths relative to image_dir, so train.py reads out with the same image_dir. Under torchrun each
rank embeds, retrieves and judges a share, and rank 0 writes.
"""
import math
import os
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import torch
import torch.distributed as dist

import common
import configurator
import data
import eval as evaluation
import loss
from common import UserError
from readers import training
from runs.checkpoint import fingerprint
from runs.export import load_for_inference
from tools.judge import Judge, gathered_scores, judge_chunks

# -----------------------------------------------------------------------------
# config: every default can be overridden by a config file or --key=value
init_from = ""  # the embedder that mines: a Hugging Face folder, an export/ folder or a training step folder
train_data = []  # as train.py's: files, subset folders, download roots, or {'path', 'image_dir', 'max_rows'} dicts
image_dir = ""  # as train.py's: where the rows' image paths are relative to; the mined paths are written relative to it
train_split = "original"  # as train.py's: the split a subset folder is read through
table_dir = "data/tables"  # as train.py's: where train_data is converted, once, into the prepared table
out = "out/mined"  # a folder: out/<subset>/train.parquet per subset, read back with train_data=out
pool_size = 50  # candidates retrieved per query, the pool its negatives come from (UniME-V2: 50)
num_hard_negatives = 5  # negatives written per row (k), hardest first
duplicate_threshold = 0.99  # a candidate whose cosine to the row's positive is above this is a near-duplicate: dropped
similarity = ""  # 'dot' (eq. 2) or 'cos' (eq. 1) to retrieve by; '' = what the checkpoint was trained with
judge_from = ""  # a local generative Qwen-VL folder (e.g. Qwen3.5-2B) that judges each pair; '' = no judge
judge_margin = 0.01  # beta: a candidate the judge scores above the positive's score minus beta is a false negative
judge_chunk_rows = 256  # rows per resumable judge chunk (<out>.judge/chunk_NNNNNN_<digest>.json)
judge_batch_size = 8  # (query, candidate) pairs per judge forward pass
batch_size = 16  # items per embedding forward pass
num_workers = 4  # DataLoader worker processes per rank (decode, resize, tokenise); at most the rank's share of cores
max_pixels = 0  # image pixel budget of the embedder and the judge; 0 = each one's own (a release: 1,605,632)
max_length = 0  # tokens per item (per side for the judge), text truncated; 0 = each one's own (a release: 8,192)
skip_bad_rows = False  # as train.py's: skip and count malformed rows instead of stopping with an error
allow_any_image_path = False  # as train.py's: rows may name images outside image_dir (written as absolute paths)
allow_eval_datasets = False  # as train.py's: read rows of MMEB's out-of-distribution evaluation datasets
device = "cuda" if torch.cuda.is_available() else "cpu"  # 'cuda' or 'cpu'
dtype = "bfloat16" if torch.cuda.is_available() else "float32"  # compute dtype of the embedder and the judge
threads = 0  # torch threads on a CPU (0: torch's default)
timeout_minutes = 30.0  # a collective (or rank 0's wait for judge chunks) that waits longer ends the run
# -----------------------------------------------------------------------------


# -----------------------------------------------------------------------------
# retrieval

def subset_blocks(subsets):
    """[(first row, end row, output folder name)] of each subset of the table, in its order."""
    blocks, taken = [], set()
    for subset in subsets:
        name = os.path.splitext(os.path.basename(os.path.normpath(subset["subset"])))[0] or "subset"
        name = name if name not in taken else f"{name}-{len(blocks)}"
        taken.add(name)
        blocks.append((subset["start"], subset["stop"], name))
    return blocks


def retrieve(embeddings, query_index, positive_index, blocks, similarity, pool_size, threshold, device, rows):
    """Rows `rows` (indices) -> (pool (n, pool_size) item indices, hardest first, -1 where none; their scores
    (n, pool_size)). Each query ranks its subset's positives but its own and the positive's near-duplicates."""
    rows = torch.tensor(rows, dtype=torch.long)
    index = torch.full((len(rows), pool_size), -1, dtype=torch.long)
    score = torch.full((len(rows), pool_size), -math.inf)
    for start, end, _ in blocks:
        share = ((rows >= start) & (rows < end)).nonzero().flatten()  # positions in rows
        pool = positive_index[start:end].unique()  # (P,) the subset's distinct positives, item indices
        candidates, k = embeddings[pool].to(device), min(pool_size, len(pool))
        compared, unit = loss.comparison_vectors(candidates, similarity), loss.comparison_vectors(candidates, "cos")  # (P, D) each, once
        pool_on_device = pool.to(device)
        for chunk in share.split(max(1, 2**24 // max(1, len(pool)))):  # (b,) about 64 MB of float32 scores
            r = rows[chunk]
            scores = loss.comparison_vectors(embeddings[query_index[r]].to(device), similarity) @ compared.T  # (b, P) eq. 1/2
            positives = loss.comparison_vectors(embeddings[positive_index[r]].to(device), "cos")
            near = positives @ unit.T > threshold  # (b, P) near-duplicates of the positive
            near |= pool_on_device[None, :] == positive_index[r].to(device)[:, None]  # the positive itself
            top = scores.masked_fill(near, -math.inf).topk(k, dim=1)  # (b, k)
            found = torch.isfinite(top.values).cpu()
            index[chunk, :k] = torch.where(found, pool[top.indices.cpu()], -1)
            score[chunk, :k] = top.values.cpu()
    return index, score


# -----------------------------------------------------------------------------
# the judge's verdicts

def refined_picks(positive_score, pool_scores, k, margin):
    """UniME-V2's refined sampling: positions into the pool (hardest first) of k negatives. A candidate scored above
    positive_score - margin is a false negative; the others are taken in order, cyclically when fewer than k remain.
    When the judge calls every candidate a false negative, the lowest-scored one stands in."""
    kept = [j for j, s in enumerate(pool_scores) if s <= positive_score - margin]
    if not kept and pool_scores:
        kept = [min(range(len(pool_scores)), key=pool_scores.__getitem__)]
    return [kept[m % len(kept)] for m in range(k)] if kept else []


# -----------------------------------------------------------------------------
# writing

def relative(path, root, allow_outside):
    """An image path as the mined file holds it: relative to image_dir ('' for none; absolute if allowed outside)."""
    inside = "" if path is None else os.path.relpath(path, root)
    if inside.startswith(os.pardir + os.sep) or os.path.isabs(inside):
        if not allow_outside:
            raise UserError(f"image {path} lies outside image_dir {root}: mine sources of one image_dir at a time, "
                            "or allow_any_image_path=True (then written as an absolute path)")
        return os.path.abspath(path)
    return inside


def subset_records(rows, items, index, score, judged, start, end, k, margin, root, allow_outside):
    """Rows start..end as the mined file's records, k negatives each (judged: refined sampling at margin), their
    lists written as Python list literals (as mmE5 writes them), image paths relative to root: -> (records, summary)."""
    root = os.path.abspath(root or ".")
    path = lambda side: relative(side["image"], root, allow_outside)  # noqa: E731
    records, counts, summary = [], [], {"rows": end - start, "false_negatives": 0, "pooled": 0, "cycled": 0}
    for i in range(start, end):
        row, pool = rows[i], [j for j in index[i].tolist() if j >= 0]
        picks = list(range(min(k, len(pool))))
        if judged is not None:
            positive_score, pool_scores = judged[i][0], judged[i][1:]
            picks = refined_picks(positive_score, pool_scores, k, margin)
            summary["pooled"] += len(pool_scores)
            summary["false_negatives"] += sum(s > positive_score - margin for s in pool_scores)
            summary["cycled"] += len(set(picks)) < len(picks)
        negatives = [items[pool[p]] for p in picks]
        query, positive = row["query"], row["candidates"][0]
        records.append({"qry": query["text"], "qry_image_path": path(query), "pos_text": positive["text"],
                        "pos_image_path": path(positive), "neg_text": repr([n["text"] for n in negatives]),
                        "neg_image_path": repr([path(n) for n in negatives]),
                        "neg_score": repr([score[i, p].item() for p in picks])})
        if judged is not None:
            records[-1].update(pos_judge=float(positive_score), neg_judge=repr([float(pool_scores[p]) for p in picks]))
        counts.append(len(picks))
    summary["negatives"] = [min(counts, default=0), max(counts, default=0)]
    return records, summary


def write_subsets(rows, items, blocks, index, score, judged, out_dir, **record_args):
    """out_dir/<subset>/train.parquet for each subset, atomically (subset_records(**record_args)). -> {subset: summary}"""
    summaries = {}
    for start, end, name in blocks:
        records, summary = subset_records(rows, items, index, score, judged, start, end, **record_args)
        path = os.path.join(out_dir, name, "train.parquet")
        table = pa.Table.from_pylist(records)
        with common.replaced_atomically(path) as tmp:
            pq.write_table(table, tmp)
        summaries[name] = dict(summary, file=path)
        judge_note = (f"; the judge called {summary['false_negatives']:,} of {summary['pooled']:,} pooled candidates "
                      f"false negatives, {summary['cycled']:,} rows cycled" if judged is not None else "")
        print(f"mine: {path}: {summary['rows']:,} rows, {summary['negatives'][0]} to {summary['negatives'][1]} "
              f"negatives each{judge_note}", flush=True)
    return summaries


# -----------------------------------------------------------------------------
# the run

def embed_and_retrieve(embedder, rows, blocks, pool_size, threshold, batch_size, num_workers, rank, world, run_device):
    """-> (items, pool (N, pool_size) item indices, scores (N, pool_size)), the same on every rank."""
    items, query_index, candidate_index = evaluation.distinct_items(rows)
    embeddings, shrunk = evaluation.encode_shared(embedder, items, batch_size, num_workers, rank, world,
                                                  "mine: embedding")  # (items, D)
    if shrunk and rank == 0:
        print(f"mine: {shrunk} images too large for max_length were shrunk to fit")
    if not torch.isfinite(embeddings).all():
        raise UserError("the embedder gave non-finite embeddings: mining with them would rank at random")
    similarity = embedder.spec.similarity
    index, score = common.shared_rows(lambda share: retrieve(
        embeddings, query_index, candidate_index[:, 0], blocks, similarity, pool_size, threshold, run_device, share),
        len(rows), rank, world)
    if rank == 0:
        print(f"mine: each of {len(rows):,} queries pooled its top {pool_size} of its subset's positives by "
              f"{similarity} similarity ({len(items):,} distinct items embedded)", flush=True)
    return items, index, score


def judge_all(judge, judge_id, rows, items, index, folder, rank, world, chunk_rows, batch_size, workers,
              timeout_minutes):
    """The judge's scores of each row's positive and pooled candidates, in resumable chunks of chunk_rows rows under
    folder, batch_size pairs a forward pass: -> [[s(positive), s(pool)...]] per row on rank 0 (None on the
    others, which rank 0 waits for at most timeout_minutes)."""
    def row_pairs(i):
        row = rows[i]
        return row["query"], [row["candidates"][0]] + [items[j] for j in index[i].tolist() if j >= 0]

    files = judge_chunks(judge, row_pairs, len(rows), folder, chunk_rows, batch_size, workers, judge_id, rank, world)
    return gathered_scores(files, timeout_minutes) if rank == 0 else None


def main(argv=None):
    """Mine with config overrides argv (default: the command line). -> {"out", "subsets": {name: summary}}"""
    configurator.configure(globals(), sys.argv[1:] if argv is None else argv)
    if not (init_from and train_data and out):
        raise UserError("set --init_from=..., --train_data=... and --out=...")
    configurator.check_choice("dtype", dtype, ("float32", "bfloat16"))
    configurator.check_choice("similarity", similarity, ("",) + loss.SIMILARITIES)
    configurator.check_counts(globals(), ("pool_size", "num_hard_negatives", "judge_chunk_rows", "judge_batch_size",
                                          "batch_size"))
    table = training.checked_table(train_data, image_dir, table_dir, 0, train_split, "dataset", allow_any_image_path,
                                  skip_bad_rows, allow_eval_datasets)
    if videos := [s["subset"] for s in table.subsets if s.get("videos")]:  # its output is mmE5's layout: images only
        raise UserError(f"train_data: {', '.join(videos)} hold videos; tools/mine.py mines rows of text and images")
    rank, _, world, run_device = common.compute_init(device, timeout_minutes)
    if threads:
        torch.set_num_threads(threads)
    rows = [data.row_with_negatives(table, i, 0, 0) for i in range(len(table))]  # each row's query and positive
    blocks = subset_blocks(table.subsets)
    embedder, _ = load_for_inference(init_from, dtype, run_device, max_length=max_length, max_pixels=max_pixels,
                                     similarity=similarity)
    items, index, score = embed_and_retrieve(embedder, rows, blocks, pool_size, duplicate_threshold, batch_size,
                                             common.worker_count(num_workers), rank, world, run_device)
    del embedder
    judged = None
    if judge_from:
        judge_id = [os.path.abspath(judge_from), fingerprint(judge_from), dtype, max_pixels, max_length]
        judge = Judge.load(judge_from, getattr(torch, dtype), run_device, max_length, max_pixels)
        judged = judge_all(judge, judge_id, rows, items, index, os.path.normpath(out) + ".judge", rank, world,
                           judge_chunk_rows, judge_batch_size, common.worker_count(num_workers), timeout_minutes)
    summary = {"out": out, "subsets": {}}
    if rank == 0:
        summary["subsets"] = write_subsets(rows, items, blocks, index, score, judged, out, k=num_hard_negatives,
                                           margin=judge_margin, root=image_dir, allow_outside=allow_any_image_path)
    if world > 1:  # no barrier: the last collective was the retrieval's; a judge rank may finish hours apart
        dist.destroy_process_group()
    return summary


if __name__ == "__main__":
    common.install_error_hook()
    main()
