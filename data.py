"""
data.py: training pairs with hard negatives, the MMEB evaluation files, and batching.

Training (train.py):

    rows = load_train_rows(["mmE5/synthetic.parquet", ("mmE5/ImageNet_1K.parquet", 100_000)],
                           image_dir="mmE5/images", num_hard_negatives=5, seed=0)
    dataset = TrainDataset(rows, Preprocessor.from_pretrained(path, max_pixels=1_605_632))
    sampler = ShardedBatchSampler(len(dataset), batch_size=32, rank=rank, world_size=world_size, seed=0)
    sampler.load_state_dict(checkpoint["data"])                # when resuming
    loader = DataLoader(dataset, batch_sampler=sampler, num_workers=4,
                        collate_fn=collate_train(dataset.preprocessor, max_items=32))
    for batch in loader:                                       # never ends: epochs follow each other
        q = torch.cat([embedder(**chunk) for chunk in batch["query"]])      # (n, D)
        c = torch.cat([embedder(**chunk) for chunk in batch["candidate"]])  # (n * (1 + K), D)
        loss, _ = pace_loss(q, c, batch["targets"])
        ...
        sampler.position += 1                 # this batch is consumed; then save sampler.state_dict()

Evaluation (eval.py): MMEB_DATASETS, find_mmeb_datasets(mmeb_dir), read_mmeb_dataset(dir, image_dir).
The toy benchmark in both layouts: python data/shapes/prepare.py.

Training rows, MMEB-train / mmE5 layout (.jsonl or .parquet): `qry`, `qry_image_path`, `pos_text`,
`pos_image_path` (required columns) and `neg_text`, `neg_image_path` (optional). Image paths are
relative to image_dir; an empty path means that side has no image. A negatives field is a list, a list
written as a string (mmE5: "['a', 'b']", JSON or Python syntax), or one plain string (one negative);
empty or null is none. When both negatives fields are non-empty they pair up one to one; when one is
empty, every negative lacks that part. Text passes through unchanged: the marker <|image_1|> says
where the side's image goes and model.Preprocessor replaces it by the vision placeholder (or drops it
when the side has no image), so it never reaches the model as literal text.

Hard negatives, the fill/cut rule. Every query gets exactly K = num_hard_negatives negatives:
- more than K: the first K are kept (mined negatives are listed hardest first);
- fewer than K: the rest are drawn from the ORIGINAL candidates (positive or negatives) of other rows
  of the same file, by random.Random(f"{seed}/{file index}/{row index}"), so the fill depends only on
  the data and the seed. A draw equal to the row's own positive (same text and image: e.g. the same
  class label) or to one of its candidates already is rejected. A file too small to fill is an error.

Images: model.Preprocessor opens them in the DataLoader worker, converts them to RGB and resizes them
(Qwen smart_resize: sides multiples of patch * merge, aspect kept, pixels in [min_pixels, max_pixels]).

Batches: global batches of `batch_size` rows are random (a fresh permutation per epoch); rank r takes
its slice of n = batch_size / world_size rows. A batch holds the n queries and m = n * (1 + K)
candidates: the n positives first, then each query's K negatives (loss.py ranks every query against
all candidates of all ranks). To cut padding without touching which rows meet in a batch, queries and
candidates are each sorted by token length (longest first) and cut, where padding is least, into a
number of chunks set by the item count alone (split_by_length: the same forward calls on every rank),
each of at most max_items items; the model runs each chunk on its own (GradCache's chunks too).
targets[i] is the position, in the sorted candidates, of sorted query i's positive. The loss is a sum
over queries and a softmax over candidates, so the order changes nothing but the padding.

Resuming: DataLoader workers prefetch, so the sampler cannot see what the loop has used. Its state
is one integer, `position`: global batches consumed since epoch 0, which the loop advances itself.
A DataLoader iterator started at position p yields the batches p, p+1, ... exactly as a run that never
stopped. Global batches do not depend on world_size, so a run may resume on another number of ranks.

Bad input (a missing or unreadable image, a missing required column, an empty query or positive, a
negatives field that does not parse, a line that is not JSON) is an error naming the file, the row and
the field. With skip_bad_rows=True such rows are skipped, counted (printed, and in `rows.skipped`);
image files are then checked for existence while loading. An image that exists but cannot be decoded
is found in the worker, and is always an error naming the file, the row and the field.
"""

import ast
import functools
import glob
import json
import math
import os
import random

import numpy as np
import pyarrow.parquet as pq
import torch

from model import IMAGE_MARKER  # MMEB / mmE5: where a side's image goes; model.Preprocessor replaces it

TRAIN_COLUMNS = ("qry", "qry_image_path", "pos_text", "pos_image_path", "neg_text", "neg_image_path")
MMEB_COLUMNS = ("qry_text", "qry_img_path", "tgt_text", "tgt_img_path")

# The 36 MMEB datasets, spelled as the folders of TIGER-Lab/MMEB-eval: name -> (meta task, split).
# IND: the 20 MMEB-train subsets; OOD: the 16 held out of training.
MMEB_DATASETS = {
    **{name: ("Classification", "IND") for name in ["ImageNet-1K", "N24News", "HatefulMemes", "VOC2007", "SUN397"]},
    **{name: ("Classification", "OOD") for name in ["Place365", "ImageNet-A", "ImageNet-R", "ObjectNet", "Country211"]},
    **{name: ("VQA", "IND") for name in ["OK-VQA", "A-OKVQA", "DocVQA", "InfographicsVQA", "ChartQA", "Visual7W"]},
    **{name: ("VQA", "OOD") for name in ["ScienceQA", "VizWiz", "GQA", "TextVQA"]},
    **{name: ("Retrieval", "IND") for name in ["VisDial", "CIRR", "VisualNews_t2i", "VisualNews_i2t",
                                               "MSCOCO_t2i", "MSCOCO_i2t", "NIGHTS", "WebQA"]},
    **{name: ("Retrieval", "OOD") for name in ["OVEN", "FashionIQ", "EDIS", "Wiki-SS-NQ"]},
    "MSCOCO": ("Visual Grounding", "IND"),
    **{name: ("Visual Grounding", "OOD") for name in ["RefCOCO", "RefCOCO-Matching", "Visual7W-Pointing"]},
}


class BadRow(ValueError):
    """One row's problem, with the field it is in. Becomes an error naming the file and row, or a skip."""

    def __init__(self, field, problem):
        super().__init__(f"field {field!r}: {problem}")


class Rows(list):
    """A list of rows that also says how many bad rows were skipped."""
    skipped = 0


# -----------------------------------------------------------------------------
# reading files and fields

def read_records(path, columns, max_rows=None):
    """(location, record) of each row of a .jsonl or .parquet file, at most max_rows of them. A line
    that is not JSON comes as (location, BadRow) so the caller can raise or skip it."""
    if path.endswith(".jsonl"):
        with open(path, encoding="utf-8") as f:
            count = 0
            for line_number, line in enumerate(f, 1):
                if max_rows is not None and count >= max_rows:
                    return
                if not line.strip():
                    continue
                count += 1
                try:
                    record = json.loads(line)
                    if not isinstance(record, dict):
                        raise ValueError("not a JSON object")
                except ValueError as error:
                    record = BadRow("<line>", f"not a JSON object: {error}")
                yield f"line {line_number}", record
    elif path.endswith(".parquet"):
        table = pq.ParquetFile(path)
        present = [c for c in columns if c in table.schema_arrow.names]  # a missing one is caught per row
        count = 0
        for batch in table.iter_batches(batch_size=4096, columns=present):
            for record in batch.to_pylist():
                if max_rows is not None and count >= max_rows:
                    return
                yield f"row {count}", record
                count += 1
    else:
        raise ValueError(f"{path}: unknown file type, expected .jsonl or .parquet")


def text_field(record, field):
    """A required text column -> str (null reads as empty)."""
    if field not in record:
        raise BadRow(field, "missing column")
    value = record[field]
    if value is None:
        return ""
    if not isinstance(value, str):
        raise BadRow(field, f"expected a string, got {type(value).__name__}")
    return value


def list_field(record, field, required=False):
    """A list column -> list of str: a list, a list written as a string (JSON or Python), or one
    string (one entry); empty or null is no entries."""
    if field not in record:
        if required:
            raise BadRow(field, "missing column")
        return []
    value = record[field]
    if value is None:
        return []
    if isinstance(value, str):
        if not value.strip():
            return []
        if not value.lstrip().startswith("["):
            return [value]
        try:
            value = json.loads(value)
        except ValueError:
            try:
                value = ast.literal_eval(value.strip())
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                raise BadRow(field, f"cannot parse {value[:80]!r} as a list") from None
    if isinstance(value, (list, tuple)) and all(v is None or isinstance(v, str) for v in value):
        return ["" if v is None else v for v in value]
    raise BadRow(field, f"expected a list of strings, got {str(value)[:80]!r}")


def make_side(text, image, text_field_name, image_field_name, image_dir, check_images):
    """One query or candidate -> (text, absolute image path or None). Empty sides are bad rows."""
    if not isinstance(image, str):
        raise BadRow(image_field_name, f"expected a path string, got {type(image).__name__}")
    path = os.path.join(image_dir, image) if image else None
    if path and check_images and not os.path.isfile(path):
        raise BadRow(image_field_name, f"image not found: {path}")
    if path is None and not text.replace(IMAGE_MARKER, "").strip():
        raise BadRow(text_field_name, "empty: no text and no image")
    return text, path


def make_sides(texts, images, text_field_name, image_field_name, image_dir, check_images):
    """Paired list fields (negatives, MMEB candidates) -> list of sides; one empty field means none."""
    if texts and images and len(texts) != len(images):
        raise BadRow(image_field_name, f"{len(images)} entries, but {text_field_name} has {len(texts)}")
    count = max(len(texts), len(images))
    texts, images = texts or [""] * count, images or [""] * count
    return [make_side(t, i, f"{text_field_name}[{k}]", f"{image_field_name}[{k}]", image_dir, check_images)
            for k, (t, i) in enumerate(zip(texts, images))]


def read_rows(path, columns, make_row, skip_bad_rows, max_rows=None):
    """make_row(record) over one file. A bad row raises, naming file, row and field, or is skipped and
    counted. -> (rows, number skipped)"""
    rows, skipped, first = [], 0, None
    for location, record in read_records(path, columns, max_rows):
        try:
            if isinstance(record, BadRow):
                raise record
            rows.append((location, make_row(record)))
        except BadRow as error:
            if not skip_bad_rows:
                raise ValueError(f"{path} {location} {error}") from None
            skipped += 1
            first = first or f"{location} {error}"
    if skipped:
        print(f"data: {path}: skipped {skipped} bad rows of {skipped + len(rows)} (first: {first})")
    return rows, skipped


# -----------------------------------------------------------------------------
# training rows

def train_row(record, image_dir, check_images):
    """One MMEB-train / mmE5 record -> {"query": side, "candidates": [positive, negatives...]}."""
    query = make_side(text_field(record, "qry"), text_field(record, "qry_image_path"),
                      "qry", "qry_image_path", image_dir, check_images)
    positive = make_side(text_field(record, "pos_text"), text_field(record, "pos_image_path"),
                         "pos_text", "pos_image_path", image_dir, check_images)
    negatives = make_sides(list_field(record, "neg_text"), list_field(record, "neg_image_path"),
                           "neg_text", "neg_image_path", image_dir, check_images)
    return {"query": query, "candidates": [positive] + negatives}


def fill_or_cut_negatives(rows, num_negatives, seed, file_index, path):
    """Give each row exactly num_negatives negatives, in place (the rule is in the file docstring).
    A filled negative records where it came from in row["filled"], for error messages."""
    originals = [row["candidates"] for row in rows]  # the fill reads these, never already-filled rows
    for i, row in enumerate(rows):
        candidates = row["candidates"][:1 + num_negatives]  # the positive, then the first K negatives
        if len(candidates) < 1 + num_negatives:
            rng = random.Random(f"{seed}/{file_index}/{i}")
            taken, filled = set(candidates), {}
            for _ in range(100 * num_negatives):
                if len(candidates) == 1 + num_negatives or len(rows) < 2:
                    break
                j = rng.randrange(len(rows))
                k = rng.randrange(len(originals[j]))
                if j != i and originals[j][k] not in taken:
                    taken.add(originals[j][k])
                    filled[len(candidates)] = f"{row_name(rows[j])} {'positive' if k == 0 else f'negative {k - 1}'}"
                    candidates.append(originals[j][k])
            if len(candidates) < 1 + num_negatives:
                raise ValueError(f"{path}: cannot fill {row_name(row)} to {num_negatives} hard negatives; "
                                 f"the file has too few distinct candidates ({len(rows)} rows)")
            row["filled"] = filled
        row["candidates"] = candidates


def row_name(row):
    return f"{row['path']} {row['location']}"


def load_train_rows(train_data, image_dir, num_hard_negatives=5, seed=0, skip_bad_rows=False):
    """Training rows of several files mixed, each with exactly num_hard_negatives negatives.
    train_data: a path, or a list of entries, each a path or a (path, max_rows) pair (the first
    max_rows rows of that file). -> PackedRows; rows[i] = {"query": {"text", "image"},
    "candidates": [positive, K negatives] as {"text", "image"}, "path", "location", ...}."""
    entries = [train_data] if isinstance(train_data, (str, os.PathLike)) else list(train_data)
    packed, skipped = [], 0
    for file_index, entry in enumerate(entries):
        if isinstance(entry, (str, os.PathLike)):
            path, max_rows = os.fspath(entry), None
        elif isinstance(entry, (list, tuple)) and len(entry) == 2:
            path, max_rows = os.fspath(entry[0]), entry[1]
        else:
            raise ValueError(f"train_data entry {entry!r}: expected a path or a (path, max_rows) pair")
        read, num_skipped = read_rows(path, TRAIN_COLUMNS, lambda r: train_row(r, image_dir, skip_bad_rows),
                                      skip_bad_rows, max_rows)
        skipped += num_skipped
        rows = [dict(row, path=path, location=location) for location, row in read]
        if not rows:
            raise ValueError(f"{path}: no usable rows")
        num_short = sum(len(r["candidates"]) < 1 + num_hard_negatives for r in rows)
        num_long = sum(len(r["candidates"]) > 1 + num_hard_negatives for r in rows)
        fill_or_cut_negatives(rows, num_hard_negatives, seed, file_index, path)
        print(f"data: {path}: {len(rows)} rows; {num_short} filled and {num_long} cut "
              f"to {num_hard_negatives} negatives")
        packed.extend(json.dumps(row).encode() for row in rows)
    out = PackedRows(packed)
    out.skipped = skipped
    return out


class PackedRows:
    """Rows as one bytes buffer of JSON and an offsets array. Two Python objects in all, so forked
    DataLoader workers share them instead of copying per-row objects touched by reference counts,
    and 2M rows cost about their JSON size in memory."""

    def __init__(self, encoded_rows):
        self.buffer = b"".join(encoded_rows)
        self.offsets = np.zeros(len(encoded_rows) + 1, dtype=np.int64)  # (N + 1,)
        np.cumsum(np.array([len(e) for e in encoded_rows], dtype=np.int64), out=self.offsets[1:])
        self.skipped = 0

    def __len__(self):
        return len(self.offsets) - 1

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        i %= len(self)
        row = json.loads(self.buffer[self.offsets[i]:self.offsets[i + 1]])
        side = lambda s: {"text": s[0], "image": s[1]}  # noqa: E731
        return dict(row, query=side(row["query"]), candidates=[side(c) for c in row["candidates"]])


class TrainDataset(torch.utils.data.Dataset):
    """dataset[i] = {"query": feature, "candidates": [positive, K negatives] features, "row": i}, each
    feature model.Preprocessor output. Runs in the DataLoader workers: decode, resize, tokenise."""

    def __init__(self, rows, preprocessor):
        self.rows, self.preprocessor = rows, preprocessor

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        row = self.rows[i]
        query = self.prepare(row, row["query"], "qry_image_path" if row["query"]["image"] else "qry")
        candidates = [self.prepare(row, side, self.candidate_field(row, j, side))
                      for j, side in enumerate(row["candidates"])]
        return {"query": query, "candidates": candidates, "row": i}

    @staticmethod
    def candidate_field(row, j, side):
        if str(j) in row.get("filled", {}):  # JSON keys are strings
            return f"negative {j - 1}, filled from {row['filled'][str(j)]}"
        name = "pos" if j == 0 else "neg"
        field = f"{name}_image_path" if side["image"] else f"{name}_text"
        return field if j == 0 else f"{field}[{j - 1}]"

    def prepare(self, row, side, field):
        try:
            return self.preprocessor(side["text"], side["image"])
        except ValueError as error:
            raise ValueError(f"{row_name(row)} field {field!r}: {error}") from None


# -----------------------------------------------------------------------------
# the sampler

class ShardedBatchSampler:
    """Yields this rank's share (n = batch_size / world_size indices) of each global batch, forever:
    epoch e is the permutation numpy.random.default_rng([seed, e]).permutation(num_rows), cut into
    num_rows // batch_size global batches (the last partial one is dropped, so within an epoch a row
    goes to at most one rank, exactly one when batch_size divides num_rows). Use as DataLoader's
    batch_sampler. `position` (global batches consumed) is advanced by the training loop."""

    def __init__(self, num_rows, batch_size, rank=0, world_size=1, seed=0):
        if batch_size % world_size:
            raise ValueError(f"batch_size {batch_size} is not a multiple of world_size {world_size}")
        if num_rows < batch_size:
            raise ValueError(f"{num_rows} rows cannot fill one batch of {batch_size}")
        self.num_rows, self.batch_size, self.seed = num_rows, batch_size, seed
        self.rank, self.world_size = rank, world_size
        self.batches_per_epoch = num_rows // batch_size
        self.position = 0

    def global_batch(self, position, permutation=None):
        """Row indices of global batch `position` (counted over all epochs), for all ranks."""
        epoch, index = divmod(position, self.batches_per_epoch)
        if permutation is None:
            permutation = np.random.default_rng([self.seed, epoch]).permutation(self.num_rows)
        return permutation[index * self.batch_size:(index + 1) * self.batch_size]

    def __iter__(self):
        return self.batches_from(self.position)  # fixed now: the loop's later `position += 1` changes nothing here

    def batches_from(self, position):
        per_rank = self.batch_size // self.world_size
        epoch, permutation = None, None
        while True:
            if position // self.batches_per_epoch != epoch:
                epoch = position // self.batches_per_epoch
                permutation = np.random.default_rng([self.seed, epoch]).permutation(self.num_rows)
            batch = self.global_batch(position, permutation)
            yield batch[self.rank * per_rank:(self.rank + 1) * per_rank].tolist()
            position += 1

    def state_dict(self):
        epoch, index = divmod(self.position, self.batches_per_epoch)
        return {"position": self.position, "epoch": epoch, "index": index, "seed": self.seed,
                "num_rows": self.num_rows, "batch_size": self.batch_size}

    def load_state_dict(self, state):
        for key in ("seed", "num_rows", "batch_size"):
            if state[key] != getattr(self, key):
                raise ValueError(f"cannot resume the data: the checkpoint has {key}={state[key]}, "
                                 f"this run {getattr(self, key)}")
        self.position = int(state["position"])


# -----------------------------------------------------------------------------
# batches

def split_by_length(lengths, max_items=None, sort=True):
    """Indices -> chunks, one forward call each. -> list of index lists, every index once.
    Sorted longest first, then cut where the padded positions (sum over chunks of longest * count) are
    fewest, into number_of_chunks(n, max_items) chunks of at most max_items; sort=False keeps the
    given order and cuts it into that many near-equal chunks (bench.py's baseline). The number of
    chunks depends on n and max_items only, never on the lengths: under FSDP2 every forward call is a
    collective, so every rank must make the same number of them. max_items=None: one chunk."""
    n = len(lengths)
    count = number_of_chunks(n, max_items) if max_items else min(n, 1)
    if not sort:
        bounds = [round(k * n / count) for k in range(count + 1)] if n else [0]
        return [list(range(a, b)) for a, b in zip(bounds, bounds[1:])]
    order = sorted(range(n), key=lambda i: -lengths[i])
    cuts = least_padding_cuts([lengths[i] for i in order], count, max_items or n)
    return [order[a:b] for a, b in zip(cuts, cuts[1:])]


def number_of_chunks(n, max_items):
    """Forward calls for n items: about sqrt(n), at least ceil(n / max_items), at most n. Why sqrt: the
    padding of the best cut falls about as a * n / chunks while each call costs a fixed overhead h
    (kernel launches, FSDP2's all-gathers); the sum is least at chunks = sqrt(a * n / h), sqrt(n) for
    a ~ h. bench.py's MMEB-shaped mix, 32 queries and 192 candidates a rank, micro_batch 32: 6 + 14
    calls and 8.6 % padding, against 1 + 6 calls and 59.3 % for chunks of 32 in a row."""
    return min(n, max(-(-n // max_items), math.ceil(math.sqrt(n))))


def least_padding_cuts(lengths, count, max_items):
    """lengths sorted longest first -> cut points 0 = c_0 < ... < c_count = n of the `count` chunks of
    at most max_items items with the fewest padded positions. A chunk [i, j) pads to its first item,
    so it costs lengths[i] * (j - i). Dynamic programming: after k chunks, best[j] is the least cost of
    the first j items, and best_k[j] = min over sizes s of best_k-1[j - s] + lengths[j - s] * s."""
    n, width = len(lengths), min(max_items, len(lengths))
    first = np.asarray(lengths, dtype=np.float64)  # (n,)
    best = np.full(n + 1, np.inf)  # (n + 1,)
    best[0] = 0.0
    last_sizes = []  # per chunk: the size of the last chunk of the best cut of the first j items
    for _ in range(count):
        options = np.full((width, n + 1), np.inf)  # options[s - 1, j]: the last chunk is [j - s, j)
        for s in range(1, width + 1):
            options[s - 1, s:] = best[:n + 1 - s] + first[:n + 1 - s] * s
        last_sizes.append(options.argmin(axis=0) + 1)  # (n + 1,)
        best = options.min(axis=0)
    cuts = [n]
    for sizes in reversed(last_sizes):
        cuts.append(cuts[-1] - int(sizes[cuts[-1]]))
    return cuts[::-1]


def collate_train(preprocessor, max_items=None, sort_by_length=True):
    """collate_fn for DataLoader over TrainDataset (picklable). A batch of n items ->
    {"query": [chunk batches], "candidate": [chunk batches], "targets": (n,), "rows": (n,)}; each chunk
    is a preprocessor.collate() batch. Concatenating the chunks' embeddings gives q (n, D) and
    c (n * (1 + K), D); targets[i] indexes query i's positive in c; rows[i] is query i's dataset row."""
    return functools.partial(_collate_train, preprocessor=preprocessor, max_items=max_items,
                             sort_by_length=sort_by_length)


def _collate_train(items, preprocessor, max_items, sort_by_length):
    queries = [item["query"] for item in items]  # n
    candidates = [item["candidates"][0] for item in items]  # n positives first: positive of query i at i
    candidates += [negative for item in items for negative in item["candidates"][1:]]  # then n * K
    query_chunks = split_by_length([len(f["input_ids"]) for f in queries], max_items, sort_by_length)
    candidate_chunks = split_by_length([len(f["input_ids"]) for f in candidates], max_items, sort_by_length)
    query_order = [i for chunk in query_chunks for i in chunk]  # sorted position -> original query
    candidate_position = {j: p for p, j in enumerate(j for chunk in candidate_chunks for j in chunk)}
    return {
        "query": [preprocessor.collate([queries[i] for i in chunk]) for chunk in query_chunks],
        "candidate": [preprocessor.collate([candidates[j] for j in chunk]) for chunk in candidate_chunks],
        "targets": torch.tensor([candidate_position[i] for i in query_order], dtype=torch.long),  # (n,)
        "rows": torch.tensor([items[i]["row"] for i in query_order], dtype=torch.long),  # (n,)
    }


def padding_share(batches):
    """Padded positions / computed positions over model batches (dicts with an attention_mask) or
    collate_train batches (all their chunks). For bench.py: length sorting versus random order."""
    padded = computed = 0
    for batch in batches:
        for chunk in batch["query"] + batch["candidate"] if "query" in batch else [batch]:
            mask = chunk["attention_mask"]  # (B, L)
            computed += mask.numel()
            padded += mask.numel() - int(mask.sum())
    return padded / max(computed, 1)


# -----------------------------------------------------------------------------
# MMEB evaluation files

def find_mmeb_datasets(mmeb_dir):
    """Sorted names of the folders of mmeb_dir that hold Parquet files (at any depth)."""
    return sorted(name for name in os.listdir(mmeb_dir)
                  if not name.startswith(".") and os.path.isdir(os.path.join(mmeb_dir, name))
                  and glob.glob(os.path.join(glob.escape(os.path.join(mmeb_dir, name)), "**", "*.parquet"),
                                recursive=True))


def read_mmeb_dataset(dataset_dir, image_dir, skip_bad_rows=False):
    """One MMEB-eval dataset folder (Parquet files directly or in subfolders) -> Rows of
    {"query": {"text", "image"}, "candidates": [{"text", "image"}, ...]}, candidate 0 the gold one.
    Images are absolute paths or None; every image file is checked to exist here, so a missing one is
    an error naming file, row and field (or a skipped row)."""
    files = sorted(glob.glob(os.path.join(glob.escape(os.fspath(dataset_dir)), "**", "*.parquet"), recursive=True))
    if not files:
        raise FileNotFoundError(f"no .parquet files under {dataset_dir}")
    exists = functools.lru_cache(maxsize=None)(os.path.isfile)  # candidates repeat across rows

    def check(side, field):
        if side[1] and not exists(side[1]):
            raise BadRow(field, f"image not found: {side[1]}")
        return {"text": side[0], "image": side[1]}

    def mmeb_row(record):
        query = make_side(text_field(record, "qry_text"), text_field(record, "qry_img_path"),
                          "qry_text", "qry_img_path", image_dir, False)
        candidates = make_sides(list_field(record, "tgt_text", required=True),
                                list_field(record, "tgt_img_path", required=True),
                                "tgt_text", "tgt_img_path", image_dir, False)
        if not candidates:
            raise BadRow("tgt_text", "no candidates")
        return {"query": check(query, "qry_img_path"),
                "candidates": [check(c, f"tgt_img_path[{k}]") for k, c in enumerate(candidates)]}

    rows = Rows()
    for path in files:
        read, skipped = read_rows(path, MMEB_COLUMNS, mmeb_row, skip_bad_rows)
        rows.extend(row for _, row in read)
        rows.skipped += skipped
    return rows
