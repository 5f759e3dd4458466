"""
tools/distill.py: a reranker's scores of each training row's positive and hard negatives, offline, for distillation
into an embedder (Qwen3-VL-Embedding's and Ovis-VL-Embedding's last stage; docs/rerank.md).

    python -m tools.distill --rerank_from=out/shapes_rerank/export --train_data=data/shapes/train.jsonl \\
        --image_dir=data/shapes/images --num_hard_negatives=3 --out=out/shapes_distill_rows
    torchrun --nproc_per_node=8 -m tools.distill --rerank_from=out/rerank/export ... --out=data/distill_rows
    python train.py config/shapes_distill.py           # soft_labels="judge" reads the scores (loss.py, eqs. U1-U4)

Rows are read as train.py reads train_data (its prepared table, readers/training.py), each with exactly
num_hard_negatives negatives (its own, hardest first, else filled from its subset as data.py fills them, seeded),
and the reranker scores the query (its instructions as the reranker trained on them, `instructions`) against its
positive and each negative: s = log P(yes) -
log P(no) (rerank.py, eq. R1), log-odds, not probabilities. Scoring is slow (a prompt holds both sides), so it
runs in chunks of chunk_rows rows, each written to <out>.scores/ when done (tools/judge.py's, named by a digest
of its pairs and the reranker); a rerun skips the chunks it finds, and under torchrun each rank scores a share.

Written: out/<subset>/train.parquet per subset (the queries as stored: train.py rewrites them once, as it reads
them), in the mmE5 layout tools/mine.py writes (qry, qry_image_path,
pos_text, pos_image_path, neg_text, neg_image_path), with pos_judge (a float) and neg_judge (a list literal) the
scores: read back with train_data=out, the same image_dir and soft_labels="judge", where judge_temperature is the
teacher's temperature over these log-odds (eq. U1).
"""
import os
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import torch
import torch.distributed as dist

import common
import configurator
import data
from common import UserError
from readers import training
from runs.checkpoint import fingerprint
from runs.reranker import load_reranker
from tools.judge import gathered_scores, judge_chunks
from tools.mine import relative, subset_blocks

# -----------------------------------------------------------------------------
# config: every default can be overridden by a config file or --key=value
rerank_from = ""  # the reranker (train.py objective='rerank'): an export or a training step folder
train_data = []  # as train.py's: files, subset folders, download roots, or {'path', 'image_dir', 'max_rows'} dicts
image_dir = ""  # as train.py's: where the rows' image paths are relative to; written relative to it
train_split = "original"  # as train.py's: the split a subset folder is read through
table_dir = "data/tables"  # as train.py's: where train_data is converted, once, into the prepared table
instructions = "paper"  # the queries the reranker scores, as train.py read them for it: 'paper' (readers/mmeb.py) or 'dataset'
out = "out/distill_rows"  # a folder: out/<subset>/train.parquet per subset, read back with train_data=out
num_hard_negatives = 5  # negatives scored and written per row (the distillation stage's num_hard_negatives)
seed = 1337  # as train.py's: seeds the fill of missing negatives
chunk_rows = 256  # rows per resumable chunk (<out>.scores/chunk_NNNNNN_<digest>.json)
batch_size = 8  # (query, candidate) prompts per forward pass
num_workers = 4  # DataLoader worker processes per rank (decode, resize, tokenise)
max_pixels = 0  # image pixel budget; 0 = the reranker's own
max_length = 0  # tokens per side, text truncated; 0 = the reranker's own
skip_bad_rows = False  # as train.py's: leave out malformed rows (a missing image path, an empty query); an image that
# does not decode still stops the scoring, naming it
allow_any_image_path = False  # as train.py's: rows may name images outside image_dir (written as absolute paths)
allow_eval_datasets = False  # as train.py's: read rows of MMEB's out-of-distribution evaluation datasets
device = "cuda" if torch.cuda.is_available() else "cpu"  # 'cuda' or 'cpu'
dtype = "bfloat16" if torch.cuda.is_available() else "float32"  # compute dtype of the reranker
threads = 0  # torch threads on a CPU (0: torch's default)
timeout_minutes = 30.0  # rank 0's wait for the other ranks' chunks
# -----------------------------------------------------------------------------


def write_subsets(rows, scores, blocks, out_dir, root, allow_outside):
    """out_dir/<subset>/train.parquet for each subset, atomically: each row's query, positive and negatives, their
    image paths relative to root, its scores as pos_judge and neg_judge. -> {subset: its file}"""
    root, files = os.path.abspath(root or "."), {}
    path = lambda side: relative(side["image"], root, allow_outside)  # noqa: E731
    for start, end, name in blocks:
        records = []
        for row, (positive_score, *negative_scores) in zip(rows[start:end], scores[start:end]):
            positive, negatives = row["candidates"][0], row["candidates"][1:]
            records.append({"qry": row["query"]["text"], "qry_image_path": path(row["query"]),
                            "pos_text": positive["text"], "pos_image_path": path(positive),
                            "neg_text": repr([n["text"] for n in negatives]),
                            "neg_image_path": repr([path(n) for n in negatives]),
                            "pos_judge": float(positive_score), "neg_judge": repr([float(s) for s in negative_scores])})
        files[name] = os.path.join(out_dir, name, "train.parquet")
        with common.replaced_atomically(files[name]) as tmp:
            pq.write_table(pa.Table.from_pylist(records), tmp)
        print(f"distill: {files[name]}: {len(records):,} rows, a positive and {num_hard_negatives} negatives each, "
              "scored", flush=True)
    return files


def main(argv=None):
    """Score with config overrides argv (default: the command line). -> {"out", "files": {subset: path}}"""
    configurator.configure(globals(), sys.argv[1:] if argv is None else argv)
    if not (rerank_from and train_data and out):
        raise UserError("set --rerank_from=..., --train_data=... and --out=...")
    configurator.check_choice("dtype", dtype, ("float32", "bfloat16"))
    configurator.check_counts(globals(), ("num_hard_negatives", "chunk_rows", "batch_size"))
    configurator.check_choice("instructions", instructions, ("paper", "dataset"))
    table, stored = (training.checked_table(train_data, image_dir, table_dir, num_hard_negatives, train_split, kind,
                                            allow_any_image_path, skip_bad_rows, allow_eval_datasets)
                     for kind in (instructions, "dataset"))  # the same rows, in one order: only queries differ
    if videos := [s["subset"] for s in table.subsets if s.get("videos")]:  # the mmE5 layout holds images only
        raise UserError(f"train_data: {', '.join(videos)} hold videos; tools/distill.py writes rows of text and images")
    rank, _, world, run_device = common.compute_init(device, timeout_minutes)
    if threads:
        torch.set_num_threads(threads)
    rows = [data.row_with_negatives(table, i, num_hard_negatives, seed) for i in range(len(table))]  # as scored
    written = [data.row_with_negatives(stored, i, num_hard_negatives, seed) for i in range(len(stored))]
    reranker, _ = load_reranker(rerank_from, getattr(torch, dtype), max_length=max_length, max_pixels=max_pixels)
    reranker.preprocessor.fit_images = True  # a photo too large for max_length is shrunk to fit, as eval's
    reranker.to(run_device).eval()
    scorer_id = [os.path.abspath(rerank_from), fingerprint(rerank_from), dtype, max_pixels, max_length]
    files = judge_chunks(reranker, lambda i: (rows[i]["query"], rows[i]["candidates"]), len(rows),
                         os.path.normpath(out) + ".scores", chunk_rows, batch_size, common.worker_count(num_workers),
                         scorer_id, rank, world, "distill")
    summary = {"out": out, "files": {}}
    if rank == 0:
        summary["files"] = write_subsets(written, gathered_scores(files, timeout_minutes), subset_blocks(stored.subsets),
                                         out, image_dir, allow_any_image_path)
    if world > 1:  # no barrier: a rank may finish its chunks hours before the others
        dist.destroy_process_group()
    return summary


if __name__ == "__main__":
    common.install_error_hook()
    main()
