"""
mine.py: hard negatives mined with an embedder and, if asked, judged by a generative VLM, UniME-V2's recipe (Gu et
al., AAAI 2026: global retrieval, MLLM-as-a-judge, refined sampling), written in the mmE5 layout train.py reads.

    python mine.py --init_from=out/shapes_stage1/export --train_data=data/shapes/train.jsonl \\
        --image_dir=data/shapes/images --out=out/mined
    python mine.py ... --judge_from=/models/Qwen3.5-2B --num_hard_negatives=8    # with the judge's scores
    torchrun --nproc_per_node=8 mine.py ...                                       # every rank a share
    python train.py config/shapes_stage1.py --train_data=out/mined --image_dir=data/shapes/images

Rows are read as train.py reads train_data (data.load_train_rows; no negatives, instructions not rewritten) and
each distinct query and candidate embedded once (eval.encode_shared). Global retrieval: each query ranks its
subset's positives (data.py fills from the same subset too) by the embedder's similarity (loss.similarity_matrix:
the checkpoint's, cosine for a plain release) but its own positive and the positive's near-duplicates (cosine
above duplicate_threshold); the best pool_size stay, hardest first (UniME-V2: 50). Without a judge a row's
negatives are the first num_hard_negatives. With judge_from, the judge scores the query against its positive and
each pooled candidate, s = e_yes / (e_yes + e_no) (JudgePrompt), and refined sampling (refined_picks) keeps those
with s <= s(positive) - judge_margin, hardest first, cyclically when fewer remain: the rest are false negatives.
The judge runs in chunks of judge_chunk_rows rows, each written to <out>.judge/ when done (atomically, named by a
digest of its pairs, the judge and the prompt); a rerun skips the chunks it finds, and says so.

Written: out/<subset>/train.parquet per subset (out reads back as a download root, train_data=out, its subsets
named as before): qry, qry_image_path, pos_text, pos_image_path, neg_text, neg_image_path (Python list literals,
as mmE5 writes them), neg_score (the retrieval scores) and, judged, pos_judge (a float) and neg_judge (a list
literal); image paths relative to image_dir, so train.py reads out with the same image_dir. Under torchrun each
rank embeds, retrieves and judges a share, and rank 0 writes.
"""
import hashlib
import json
import math
import os
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import torch
import torch.distributed as dist

import batching
import checkpoint
import common
import configurator
import data
import eval as evaluation
import loss
from common import UserError
from model import Embedder, Preprocessor, mrope_positions

# -----------------------------------------------------------------------------
# config: every default can be overridden by a config file or --key=value
init_from = ""  # the embedder that mines: a Hugging Face folder, an export/ folder or a training step folder
train_data = []  # as train.py's: files, subset folders, download roots, or {'path', 'image_dir', 'max_rows'} dicts
image_dir = ""  # as train.py's: where the rows' image paths are relative to; the mined paths are written relative to it
train_split = "original"  # as train.py's: the split a subset folder is read through
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
max_pixels = 1605632  # image pixel budget of the embedder and the judge (paper: 1,605,632); 0 = the checkpoint's own
max_length = 8192  # tokens per item (per side for the judge); text is truncated, never image placeholders
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

def subset_blocks(reports):
    """[(first row, end row, output folder name)] of each subset, in the order load_train_rows appends them."""
    blocks, start, taken = [], 0, set()
    for report in reports:
        name = os.path.splitext(os.path.basename(os.path.normpath(report.subset)))[0] or "subset"
        name = name if name not in taken else f"{name}-{len(blocks)}"
        taken.add(name)
        blocks.append((start, start + report.rows, name))
        start += report.rows
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
        compared, unit = loss.compared(candidates, similarity), loss.compared(candidates, "cos")  # (P, D) each, once
        pool_on_device = pool.to(device)
        for chunk in share.split(max(1, 2**24 // max(1, len(pool)))):  # (b,) about 64 MB of float32 scores
            r = rows[chunk]
            scores = loss.compared(embeddings[query_index[r]].to(device), similarity) @ compared.T  # (b, P) eq. 1/2
            positives = loss.compared(embeddings[positive_index[r]].to(device), "cos")
            near = positives @ unit.T > threshold  # (b, P) near-duplicates of the positive
            near |= pool_on_device[None, :] == positive_index[r].to(device)[:, None]  # the positive itself
            top = scores.masked_fill(near, -math.inf).topk(k, dim=1)  # (b, k)
            found = torch.isfinite(top.values).cpu()
            index[chunk, :k] = torch.where(found, pool[top.indices.cpu()], -1)
            score[chunk, :k] = top.values.cpu()
    return index, score


# -----------------------------------------------------------------------------
# the judge

def answer_start(tokenizer):
    """The text a chat template puts after a user turn to start the assistant's answer, without thinking."""
    if not getattr(tokenizer, "chat_template", None):
        return "<|im_start|>assistant\n"
    marker = "\x00"  # a user turn of one character no template changes, to cut the answer's start after it
    text = tokenizer.apply_chat_template([{"role": "user", "content": marker}], tokenize=False,
                                         add_generation_prompt=True, enable_thinking=False)
    if f"{marker}<|im_end|>\n" not in text:
        raise UserError("judge_from: its chat template does not end a user turn with <|im_end|> (not a Qwen model?)")
    return text.split(f"{marker}<|im_end|>\n", 1)[1]


class JudgePrompt:
    """A (query, candidate) pair -> the judge's inputs, shaped as model.Preprocessor shapes an item's: input_ids (L,),
    position_ids (3, L) and, with images, their uint8 patches (the query's first) and image_grid_thw (n, 3).
    Picklable, so DataLoader workers build them. The pair is one chat turn, images as Qwen's placeholders:

        <|im_start|>user
        {PROMPT}
        Query:
        {the query: its image as <|vision_start|><|image_pad|>...<|vision_end|> where its text has <|image_1|>
         (else first), and its text}
        Candidate:
        {the candidate, the same way}<|im_end|>
        {the answer's start: what the checkpoint's chat template puts after a user turn with enable_thinking=False,
         e.g. Qwen3's <|im_start|>assistant\n<think>\n\n</think>\n\n; <|im_start|>assistant\n without a template}

    and s = e_yes / (e_yes + e_no) = softmax(logit_yes, logit_no)[0], from the logits of the next token after the
    last one at "Yes" and "No", each word's first token (a small tokenizer splits them; Qwen's keep them whole).
    PROMPT is UniME-V2's question in other words (its reranker's prompt asks whether the candidate meets the
    requirements of the query, answered 'Yes' or 'No')."""

    PROMPT = "I will show you a query and a candidate. Does the candidate meet the requirement of the query? " \
             "Answer Yes or No."

    def __init__(self, preprocessor):
        self.pre = preprocessor
        self.head = preprocessor.ids(f"<|im_start|>user\n{self.PROMPT}\nQuery:\n", True)
        self.middle = preprocessor.ids("\nCandidate:\n", True)
        self.tail = preprocessor.ids(f"<|im_end|>\n{answer_start(preprocessor.tokenizer)}", True)

    def side(self, item):
        """-> (ids, position pieces, patches or None, grid (1, 3) or None) of a query or a candidate."""
        return self.pre.item_tokens(item.get("text") or "", item.get("image"))

    def __call__(self, query, candidate):
        try:
            sides = [self.side(query), self.side(candidate)]
        except ValueError as error:  # an unreadable image, an aspect ratio over 200 (UserErrors naming the image)
            raise UserError(f"judging {query.get('text', '')[:60]!r} against {candidate.get('text', '')[:60]!r}: "
                            f"{error}") from None
        ids = self.head + sides[0][0] + self.middle + sides[1][0] + self.tail
        pieces = [len(self.head)] + sides[0][1] + [len(self.middle)] + sides[1][1] + [len(self.tail)]
        feature = {"input_ids": torch.tensor(ids, dtype=torch.long), "position_ids": mrope_positions(pieces)}
        images = [(patches, grid) for _, _, patches, grid in sides if patches is not None]
        if images:
            feature["pixel_values"] = torch.cat([patches for patches, _ in images])  # query's first
            feature["image_grid_thw"] = torch.cat([grid for _, grid in images])
        return feature

    def batch(self, pairs):
        """A DataLoader's collate_fn over a list of pairs: their features, right-padded (Preprocessor.collate)."""
        return self.pre.collate([self(*pair) for pair in pairs])


class Judge:
    """A generative Qwen-VL folder as UniME-V2's judge: its language model's last hidden state at the answer position
    (Embedder's forward pools that very token, and turns patches into pixels) times its LM head's rows of Yes, No."""

    def __init__(self, path, dtype, device, max_length, max_pixels):
        from transformers import AutoModelForImageTextToText
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise UserError(f"judge_from={path!r} is not a Hugging Face checkpoint folder (no config.json)")
        preprocessor = Preprocessor.from_pretrained(path, max_length, max_pixels=max_pixels or None)
        self.generator = AutoModelForImageTextToText.from_pretrained(path, dtype=dtype, local_files_only=True)
        self.body = Embedder(self.generator.model, preprocessor)  # shares the weights
        self.generator.to(device).eval()
        self.body.to(device).eval()
        self.prompt = JudgePrompt(preprocessor)
        first_token = lambda word: preprocessor.tokenizer(word, add_special_tokens=False)["input_ids"][0]  # noqa: E731
        yes, no = first_token("Yes"), first_token("No")
        if yes == no:
            raise UserError(f"judge_from={path}: its tokenizer starts 'Yes' and 'No' with the same token")
        lm_head = self.generator.lm_head
        self.head = lm_head.weight[[yes, no]].detach().float()  # (2, D), in float32 even for a bf16 judge
        self.bias = None if lm_head.bias is None else lm_head.bias[[yes, no]].detach().float()

    @torch.no_grad()
    def score(self, pairs, batch_size, num_workers, label=""):
        """[(query, candidate)] -> (n,) float64 s = e_yes / (e_yes + e_no) of each pair, in input order."""
        measured = {}  # (text, image) -> tokens: a query meets each of its candidates, its length is read once
        for side in {(x.get("text") or "", x.get("image")) for pair in pairs for x in pair}:
            measured[side] = self.prompt.pre.num_tokens(*side)
        lengths = [sum(measured[x.get("text") or "", x.get("image")] for x in pair) for pair in pairs]
        scores, meter = torch.empty(len(pairs), dtype=torch.float64), common.Progress(len(pairs), label, "pairs")
        for indices, batch in batching.length_batches(pairs, lengths, batch_size, num_workers, self.prompt.batch):
            hidden = self.body(**batch)  # (B, D) float32 at the last token: where the answer comes next
            logits = hidden @ self.head.T + (0 if self.bias is None else self.bias)  # (B, 2): the rows of Yes, No
            scores[indices] = logits.double().softmax(dim=-1)[:, 0].cpu()  # e_yes / (e_yes + e_no)
            if label:
                meter.update(len(indices))
        return scores


def judge_chunks(judge, row_pairs, num_rows, folder, config, judge_id, rank, world):
    """Every chunk of judge_chunk_rows rows not already in folder, judged by rank (chunk % world) and written
    there. row_pairs(i) = (query, [positive, pooled candidates...]) of row i. -> {chunk: its file}"""
    size = config["judge_chunk_rows"]
    chunk_rows = lambda c: [row_pairs(i) for i in range(c * size, min(num_rows, (c + 1) * size))]  # noqa: E731
    files = {}
    for c in range(math.ceil(num_rows / size)):
        keys = [[[x.get("text") or "", x.get("image") or ""] for x in [q] + xs] for q, xs in chunk_rows(c)]
        digest = hashlib.sha256(json.dumps([judge_id, JudgePrompt.PROMPT, keys]).encode()).hexdigest()[:16]
        files[c] = os.path.join(folder, f"chunk_{c:06d}_{digest}.json")
    done = sum(os.path.isfile(path) for path in files.values())
    if done and rank == 0:
        print(f"judge: {done} of {len(files)} chunks already done in {folder} (an earlier run): skipped", flush=True)
    for c in range(rank, len(files), world):
        if os.path.isfile(files[c]):
            continue
        part = chunk_rows(c)
        pairs = [(q, x) for q, candidates in part for x in candidates]
        scores = judge.score(pairs, config["judge_batch_size"], common.worker_count(config["num_workers"]),
                             f"judge: chunk {c + 1}/{len(files)}" if rank == 0 else "").tolist()
        per_row, at = [], 0
        for _, candidates in part:
            per_row.append(scores[at:at + len(candidates)])
            at += len(candidates)
        common.write_json(files[c], {"rows": [c * size, c * size + len(part)], "scores": per_row})
    return files


def wait_for_chunks(files, timeout_minutes, poll_seconds=2.0):
    """Rank 0, its own chunks judged: until the other ranks' chunk files are all there. No collective (a rank may
    lag by hours over a long judge run); a UserError once timeout_minutes pass without a new chunk."""
    seen, since = -1, time.time()
    while (done := sum(os.path.isfile(path) for path in files.values())) < len(files):
        if done > seen:
            seen, since = done, time.time()
        elif time.time() - since > 60 * timeout_minutes:
            raise UserError(f"judge: {len(files) - done} chunks missing and none came for {timeout_minutes} minutes "
                            "(a rank stopped?); run again to resume, the finished chunks are kept")
        time.sleep(poll_seconds)


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


def subset_records(rows, items, index, score, judged, start, end, config):
    """Rows start..end as the mined file's records, their lists written as Python list literals (as mmE5 writes
    them), and what they hold: -> (records, summary)."""
    root, k, margin = os.path.abspath(config["image_dir"] or "."), config["num_hard_negatives"], config["judge_margin"]
    path = lambda side: relative(side["image"], root, config["allow_any_image_path"])  # noqa: E731
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


def write_subsets(rows, items, blocks, index, score, judged, config):
    """out/<subset>/train.parquet for each subset, atomically. -> {subset: summary}"""
    summaries = {}
    for start, end, name in blocks:
        records, summary = subset_records(rows, items, index, score, judged, start, end, config)
        path = os.path.join(config["out"], name, "train.parquet")
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

def embed_and_retrieve(config, rows, blocks, rank, world, run_device):
    """-> (items, pool (N, pool_size) item indices, scores (N, pool_size)), the same on every rank."""
    embedder, _, similarity = checkpoint.load_for_inference(config["init_from"], config["dtype"], run_device,
                                                            config["max_length"], config["max_pixels"],
                                                            config["similarity"])
    items, query_index, candidate_index = evaluation.distinct_items(rows)
    embeddings = evaluation.encode_shared(embedder, items, config["batch_size"],
                                          common.worker_count(config["num_workers"]), rank, world,
                                          "mine: embedding")  # (items, D)
    if not torch.isfinite(embeddings).all():
        raise UserError(f"{config['init_from']} gave non-finite embeddings: mining with them would rank at random")
    del embedder
    index, score = common.shared_rows(lambda share: retrieve(
        embeddings, query_index, candidate_index[:, 0], blocks, similarity, config["pool_size"],
        config["duplicate_threshold"], run_device, share), len(rows), rank, world)
    if rank == 0:
        print(f"mine: each of {len(rows):,} queries pooled its top {config['pool_size']} of its subset's positives by "
              f"{similarity} similarity ({len(items):,} distinct items embedded)", flush=True)
    return items, index, score


def judge_all(config, rows, items, index, rank, world, run_device):
    """The judge's scores of each row's positive and pooled candidates: -> [[s(positive), s(pool)...]] per row on
    rank 0 (None on the others)."""
    def row_pairs(i):
        row = rows[i]
        return row["query"], [row["candidates"][0]] + [items[j] for j in index[i].tolist() if j >= 0]

    judge_id = [os.path.abspath(config["judge_from"]), checkpoint.fingerprint(config["judge_from"]),
                config["dtype"], config["max_pixels"], config["max_length"]]
    judge = Judge(config["judge_from"], getattr(torch, config["dtype"]), run_device, config["max_length"],
                  config["max_pixels"])
    files = judge_chunks(judge, row_pairs, len(rows), os.path.normpath(config["out"]) + ".judge", config, judge_id,
                         rank, world)
    if rank != 0:
        return None
    wait_for_chunks(files, config["timeout_minutes"])
    judged = []
    for c in sorted(files):
        with open(files[c]) as f:
            judged += json.load(f)["scores"]
    return judged


def main(argv=None):
    """Mine with config overrides argv (default: the command line). -> {"out", "subsets": {name: summary}}"""
    config = configurator.configure(configurator.config_keys(globals()) | {"__file__": __file__, "__doc__": __doc__},
                                    sys.argv[1:] if argv is None else argv)
    if not (config["init_from"] and config["train_data"] and config["out"]):
        raise UserError("set --init_from=..., --train_data=... and --out=...")
    configurator.check_choice("dtype", config["dtype"], ("float32", "bfloat16"))
    configurator.check_choice("similarity", config["similarity"], ("",) + loss.SIMILARITIES)
    configurator.check_counts(config, ("pool_size", "num_hard_negatives", "judge_chunk_rows", "judge_batch_size",
                                       "batch_size"))
    rank, _, world, run_device = common.compute_init(config["device"], config["timeout_minutes"])
    if config["threads"]:
        torch.set_num_threads(config["threads"])
    rows, reports = data.load_train_rows(config["train_data"], config["image_dir"], num_hard_negatives=0,
                                         skip_bad_rows=config["skip_bad_rows"],
                                         allow_any_image_path=config["allow_any_image_path"], instructions=None,
                                         train_split=config["train_split"],
                                         allow_eval_datasets=config["allow_eval_datasets"])
    blocks = subset_blocks(reports)
    items, index, score = embed_and_retrieve(config, rows, blocks, rank, world, run_device)
    judged = judge_all(config, rows, items, index, rank, world, run_device) if config["judge_from"] else None
    summary = {"out": config["out"], "subsets": {}}
    if rank == 0:
        summary["subsets"] = write_subsets(rows, items, blocks, index, score, judged, config)
    if world > 1:  # no barrier: the last collective was the retrieval's; a judge rank may finish hours apart
        dist.destroy_process_group()
    return summary


if __name__ == "__main__":
    common.install_error_hook()
    main()
