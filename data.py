"""
data.py: training rows with hard negatives, batching, and reading the MMEB-style files.

    rows = load_train_rows(["mmE5/synthetic.parquet", ("MMEB-train/VOC2007.parquet", 50_000)],
                           image_dir="mmE5/images", num_hard_negatives=5, seed=0)
    dataset = TrainDataset(rows, preprocessor)              # model.Preprocessor: decodes and tokenises
    sampler = ShardedBatchSampler(len(dataset), batch_size=256, rank=rank, world_size=8, seed=0)
    loader = DataLoader(dataset, batch_sampler=sampler, num_workers=8,
                        collate_fn=collate_train(preprocessor, max_items=32))
    for batch in loader:      # never ends; batch["query"] / ["candidate"]: lists of collated chunks
        ...
        sampler.position += 1  # this batch is consumed; sampler.state_dict() goes into the checkpoint

Training rows, the MMEB-train / mmE5 layout (.jsonl or .parquet): `qry`, `qry_image_path`, `pos_text`,
`pos_image_path` (required) and `neg_text`, `neg_image_path` (optional). Image paths are relative to
image_dir; an empty path means that side has no image. The marker <|image_1|> says where a side's image
goes (model.Preprocessor puts the vision placeholders there, or drops it when the side has no image).
The MMEB evaluation files (mmeb.py) are read with the same functions. model.Embedder.encode batches its
items with item_batches. The toy benchmark in both layouts: python data/shapes/prepare.py.

Bad input is an error naming the file, the row and the field, or with skip_bad_rows=True a skipped row,
counted and printed: see read_rows for what is found while reading, TrainDataset for images that only
fail to decode in a worker.
"""

import ast
import functools
import json
import math
import os
import random

import numpy as np
import pyarrow.parquet as pq
import torch

import configurator

IMAGE_MARKER = "<|image_1|>"  # in MMEB / mmE5 text: where the side's image goes
TRAIN_COLUMNS = ("qry", "qry_image_path", "pos_text", "pos_image_path", "neg_text", "neg_image_path")

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
    """(location, record) of each row of a .jsonl or .parquet file, at most max_rows of them. A line that is not
    UTF-8 JSON comes as (location, BadRow) so the caller can raise or skip it."""
    if path.endswith(".jsonl"):
        with open(path, "rb") as f:  # bytes: a line that is not UTF-8 is one bad row, not a crash
            count = 0
            for line_number, line in enumerate(f, 1):
                if max_rows is not None and count >= max_rows:
                    return
                if not line.strip():
                    continue
                count += 1
                try:
                    record = json.loads(line.decode("utf-8"))
                    if not isinstance(record, dict):
                        raise ValueError("not a JSON object")
                except UnicodeDecodeError as error:
                    record = BadRow("<line>", f"not UTF-8 text ({error.reason} at byte {error.start})")
                except (ValueError, RecursionError) as error:  # RecursionError: JSON nested thousands deep
                    record = BadRow("<line>", f"not a JSON object: {str(error)[:120]}")
                yield f"line {line_number}", record
    elif path.endswith(".parquet"):
        try:
            table = pq.ParquetFile(path)
        except Exception as error:  # noqa: BLE001 - pyarrow raises several kinds
            raise ValueError(f"{path}: cannot read it as Parquet: {error}") from None
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
    """A list column -> list of str: a list, a list written as a string (JSON or Python), or one string (one
    entry); empty or null is no entries."""
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
        except (ValueError, RecursionError):
            try:
                value = ast.literal_eval(value.strip())
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                raise BadRow(field, f"cannot parse {value[:80]!r} as a list") from None
    if isinstance(value, (list, tuple)) and all(v is None or isinstance(v, str) for v in value):
        return ["" if v is None else v for v in value]
    raise BadRow(field, f"expected a list of strings, got {str(value)[:80]!r}")


class ImagePaths:
    """A row's image path -> the file under image_dir. Refuses a path that leaves image_dir (absolute, or climbing
    out with ../) unless allow_outside; with check_exists, a missing file is a bad row here, not in a worker."""

    def __init__(self, image_dir, allow_outside=False, check_exists=False):
        self.root, self.allow_outside = os.path.abspath(image_dir or "."), allow_outside
        self.check_exists = functools.lru_cache(maxsize=None)(os.path.isfile) if check_exists else None

    def resolve(self, value, field):
        if not isinstance(value, str):
            raise BadRow(field, f"expected a path string, got {type(value).__name__}")
        if not value:
            return None
        path = os.path.normpath(os.path.join(self.root, value))
        if not self.allow_outside and os.path.commonpath([path, self.root]) != self.root:
            raise BadRow(field, f"image path {value!r} leaves image_dir {self.root} (allow_any_image_path=True "
                                "allows it)")
        if self.check_exists and not self.check_exists(path):
            raise BadRow(field, f"image not found: {path}")
        return path


def make_side(text, image, text_name, image_name, images):
    """One query or candidate -> {"text", "image": a file path or None}. A side with neither is a bad row."""
    path = images.resolve(image, image_name)
    if path is None and not text.replace(IMAGE_MARKER, "").strip():
        raise BadRow(text_name, "empty: no text and no image")
    return {"text": text, "image": path}


def make_sides(texts, images_field, text_name, image_name, images):
    """Paired list fields (negatives, MMEB candidates) -> list of sides; one empty field means none."""
    if texts and images_field and len(texts) != len(images_field):
        raise BadRow(image_name, f"{len(images_field)} entries, but {text_name} has {len(texts)}")
    count = max(len(texts), len(images_field))
    texts, images_field = texts or [""] * count, images_field or [""] * count
    return [make_side(t, i, f"{text_name}[{k}]", f"{image_name}[{k}]", images)
            for k, (t, i) in enumerate(zip(texts, images_field))]


def read_rows(path, columns, make_row, skip_bad_rows, max_rows=None):
    """make_row(record) over one file. A bad row (a line that is not UTF-8 JSON, a missing column or image, an
    empty query or positive, negatives that do not parse, an image path leaving image_dir) raises, naming file,
    row and field, or with skip_bad_rows is skipped and counted. -> (list of (location, row), number skipped)"""
    rows, skipped, first = [], 0, None
    progress = configurator.Progress(None, f"data: reading {path}", "rows", every=30.0)
    for count, (location, record) in enumerate(read_records(path, columns, max_rows), 1):
        try:
            if isinstance(record, BadRow):
                raise record
            rows.append((location, make_row(record)))
        except BadRow as error:
            if not skip_bad_rows:
                raise ValueError(f"{path} {location} {error}") from None
            skipped += 1
            first = first or f"{location} {error}"
        if count % 4096 == 0:
            progress.update(4096)
    if skipped:
        print(f"data: {path}: skipped {skipped} bad rows of {skipped + len(rows)} (first: {first})")
    return rows, skipped


# -----------------------------------------------------------------------------
# training rows

def train_row(record, images, instructions=None, path=""):
    """One MMEB-train / mmE5 record -> {"query": side, "candidates": [positive, negatives...]}; the query's
    text goes through instructions(text, path) when given (mmeb.Instructions)."""
    query = make_side(text_field(record, "qry"), text_field(record, "qry_image_path"), "qry", "qry_image_path", images)
    if instructions:
        query["text"] = instructions(query["text"], path)
    positive = make_side(text_field(record, "pos_text"), text_field(record, "pos_image_path"),
                         "pos_text", "pos_image_path", images)
    negatives = make_sides(list_field(record, "neg_text"), list_field(record, "neg_image_path"),
                           "neg_text", "neg_image_path", images)
    return {"query": query, "candidates": [positive] + negatives}


def fill_or_cut_negatives(rows, num_negatives, seed, file_index, path):
    """Give each row exactly num_negatives = K negatives, in place. More than K: the first K are kept (mined
    negatives come hardest first). Fewer: the rest are drawn from the original candidates (positive or
    negatives) of other rows of the same file, by random.Random(f"{seed}/{file index}/{row index}"), so the
    fill depends only on the data and the seed; a draw equal to the row's own positive (the same text and
    image, e.g. a shared class label) or to one of its candidates already is rejected."""
    key = lambda side: (side["text"], side["image"])  # noqa: E731
    originals = [row["candidates"] for row in rows]  # the fill reads these, never already-filled rows
    for i, row in enumerate(rows):
        candidates = row["candidates"][:1 + num_negatives]  # the positive, then the first K negatives
        if len(candidates) < 1 + num_negatives:
            rng = random.Random(f"{seed}/{file_index}/{i}")
            taken = {key(c) for c in candidates}
            for _ in range(100 * num_negatives):
                if len(candidates) == 1 + num_negatives or len(rows) < 2:
                    break
                j = rng.randrange(len(rows))
                drawn = originals[j][rng.randrange(len(originals[j]))]
                if j != i and key(drawn) not in taken:
                    taken.add(key(drawn))
                    candidates.append(drawn)
            if len(candidates) < 1 + num_negatives:
                raise ValueError(f"{path}: cannot fill {row['source']} to {num_negatives} hard negatives; "
                                 f"the file has too few distinct candidates ({len(rows)} rows)")
        row["candidates"] = candidates


def load_train_rows(train_data, image_dir, num_hard_negatives=5, seed=0, skip_bad_rows=False,
                    allow_any_image_path=False, instructions=None):
    """Training rows of several files mixed, each with exactly num_hard_negatives negatives. train_data: a path,
    or a list of entries, each a path or a (path, max_rows) pair (the first max_rows rows of that file).
    -> PackedRows; rows[i] = {"query": side, "candidates": [positive, K negatives], "source": "file line 7"},
    a side being {"text", "image"}. instructions: mmeb.Instructions, to rewrite each query's instruction."""
    entries = [train_data] if isinstance(train_data, (str, os.PathLike)) else list(train_data)
    images = ImagePaths(image_dir, allow_any_image_path, check_exists=skip_bad_rows)
    packed, skipped = [], 0
    for file_index, entry in enumerate(entries):
        if isinstance(entry, (str, os.PathLike)):
            path, max_rows = os.fspath(entry), None
        elif isinstance(entry, (list, tuple)) and len(entry) == 2:
            path, max_rows = os.fspath(entry[0]), entry[1]
        else:
            raise ValueError(f"train_data entry {entry!r}: expected a path or a (path, max_rows) pair")
        read, num_skipped = read_rows(path, TRAIN_COLUMNS, lambda r: train_row(r, images, instructions, path),
                                      skip_bad_rows, max_rows)
        skipped += num_skipped
        rows = [dict(row, source=f"{path} {location}") for location, row in read]
        if not rows:
            raise ValueError(f"{path}: no usable rows")
        num_short = sum(len(r["candidates"]) < 1 + num_hard_negatives for r in rows)
        num_long = sum(len(r["candidates"]) > 1 + num_hard_negatives for r in rows)
        fill_or_cut_negatives(rows, num_hard_negatives, seed, file_index, path)
        print(f"data: {path}: {len(rows):,} rows; {num_short:,} had fewer than {num_hard_negatives} hard negatives "
              f"and got the rest from other rows of the file, {num_long:,} had more and keep their first "
              f"{num_hard_negatives}")
        packed.extend(json.dumps(row).encode() for row in rows)
    out = PackedRows(packed)
    out.skipped = skipped
    return out


class PackedRows:
    """Rows as one bytes buffer of JSON and an offsets array. Two Python objects in all, so forked DataLoader
    workers share them instead of copying per-row objects touched by reference counts, and 2M rows cost about
    their JSON size in memory."""

    def __init__(self, encoded_rows):
        self.buffer = b"".join(encoded_rows)
        self.offsets = np.zeros(len(encoded_rows) + 1, dtype=np.int64)  # (N + 1,)
        np.cumsum(np.array([len(e) for e in encoded_rows], dtype=np.int64), out=self.offsets[1:])
        self.skipped = 0

    def __len__(self):
        return len(self.offsets) - 1

    def __getitem__(self, i):
        return json.loads(self.buffer[self.offsets[i]:self.offsets[i + 1]])


class TrainDataset(torch.utils.data.Dataset):
    """dataset[i] = {"query": feature, "candidates": [positive, K negatives] features, "row": j, "skipped": [...]},
    each feature a model.Preprocessor output. Runs in the DataLoader workers, where an image that exists but
    does not decode (truncated or corrupt, over Pillow's pixel limit, an aspect ratio over 200) is first found:
    an error naming the file, row and image, or with skip_bad_rows the next row that decodes (j = i + 1, ...),
    the same on every run so a resumed run is the straight run; "skipped" lists what was passed over."""

    def __init__(self, rows, preprocessor, skip_bad_rows=False):
        self.rows, self.preprocessor, self.skip_bad_rows = rows, preprocessor, skip_bad_rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        skipped = []
        for k in range(len(self.rows)):  # row i, else (with skip_bad_rows) the next one that decodes; that row may
            j = (i + k) % len(self.rows)  # then be in the batch twice, its positive a false negative of its twin: rare
            try:
                return dict(self.prepare(self.rows[j]), row=j, skipped=skipped)
            except ValueError as error:
                if not self.skip_bad_rows:
                    raise
                skipped.append(str(error))
        raise ValueError(f"no row of the {len(self.rows)} can be decoded; the first: {skipped[0]}")

    def prepare(self, row):
        parts = [("field 'qry_image_path'", row["query"]), ("field 'pos_image_path'", row["candidates"][0])]
        parts += [(f"field 'neg_image_path[{k}]' (or a negative filled from another row)", side)
                  for k, side in enumerate(row["candidates"][1:])]
        features = []
        for field, side in parts:
            try:
                features.append(self.preprocessor(side["text"], side["image"]))
            except ValueError as error:
                raise ValueError(f"{row['source']} {field}: {error}") from None
        return {"query": features[0], "candidates": features[1:]}


# -----------------------------------------------------------------------------
# the sampler

class ShardedBatchSampler:
    """Yields this rank's share (n = batch_size / world_size indices) of each global batch, forever: epoch e is
    the permutation numpy.random.default_rng([seed, e]).permutation(num_rows), cut into num_rows // batch_size
    global batches (the last partial one is dropped, so within an epoch a row goes to at most one rank). Use as
    DataLoader's batch_sampler. Resuming: workers prefetch, so the sampler cannot see what the loop has used;
    its state is `position`, the global batches consumed, which the loop advances itself. Global batches do not
    depend on world_size, so a run may resume on another number of ranks."""

    def __init__(self, num_rows, batch_size, rank=0, world_size=1, seed=0):
        if batch_size % world_size:
            raise ValueError(f"batch_size {batch_size} is not a multiple of world_size {world_size}")
        if num_rows < batch_size:
            raise ValueError(f"{num_rows} rows cannot fill one batch of {batch_size}")
        self.num_rows, self.batch_size, self.seed = num_rows, batch_size, seed
        self.rank, self.world_size = rank, world_size
        self.batches_per_epoch = num_rows // batch_size
        self.position = 0

    def __iter__(self):
        return self.batches_from(self.position)  # fixed now: the loop's later `position += 1` changes nothing here

    def batches_from(self, position):
        per_rank = self.batch_size // self.world_size
        epoch, permutation = None, None
        while True:
            if position // self.batches_per_epoch != epoch:
                epoch = position // self.batches_per_epoch
                permutation = np.random.default_rng([self.seed, epoch]).permutation(self.num_rows)
            start = (position % self.batches_per_epoch) * self.batch_size + self.rank * per_rank
            yield permutation[start:start + per_rank].tolist()
            position += 1

    def state_dict(self):
        return {"position": self.position, "seed": self.seed, "num_rows": self.num_rows, "batch_size": self.batch_size}

    def load_state_dict(self, state):
        for key in ("seed", "num_rows", "batch_size"):  # the same data and order, or the position means nothing
            if state[key] != getattr(self, key):
                raise ValueError(f"cannot resume the data: the checkpoint has {key}={state[key]}, "
                                 f"this run {getattr(self, key)}")
        self.position = int(state["position"])


# -----------------------------------------------------------------------------
# batches

def split_by_length(lengths, max_items=None):
    """Indices -> chunks, one forward call each: sorted longest first, then cut where the padded positions
    (sum over chunks of longest * count) are fewest, into number_of_chunks(n, max_items) chunks of at most
    max_items items. -> list of index lists, every index once. The number of chunks depends on n and max_items
    only, never on the lengths: under FSDP2 every forward call is a collective, so every rank must make the
    same number of them. max_items=None: one chunk."""
    n = len(lengths)
    count = number_of_chunks(n, max_items) if max_items else min(n, 1)
    order = sorted(range(n), key=lambda i: -lengths[i])
    cuts = least_padding_cuts([lengths[i] for i in order], count, max_items or n)
    return [order[a:b] for a, b in zip(cuts, cuts[1:])]


def number_of_chunks(n, max_items):
    """Forward calls for n items: about sqrt(n), at least ceil(n / max_items), at most n. Why sqrt: the padding
    of the best cut falls about as a * n / chunks while each call costs a fixed overhead h (kernel launches,
    FSDP2's all-gathers); the sum is least at chunks = sqrt(a * n / h), sqrt(n) for a ~ h."""
    return min(n, max(-(-n // max_items), math.ceil(math.sqrt(n))))


def least_padding_cuts(lengths, count, max_items):
    """lengths sorted longest first -> cut points 0 = c_0 < ... < c_count = n of the `count` chunks of at most
    max_items items with the fewest padded positions. A chunk [i, j) pads to its first item, so it costs
    lengths[i] * (j - i). Dynamic programming: after k chunks, best[j] is the least cost of the first j items,
    and best_k[j] = min over sizes s of best_k-1[j - s] + lengths[j - s] * s."""
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


def collate_train(preprocessor, max_items=None):
    """collate_fn for DataLoader over TrainDataset (picklable). n items -> {"query": [collated chunks],
    "candidate": [collated chunks], "targets": (n,), "rows": (n,), "skipped": [messages]}. Concatenating the
    chunks' embeddings gives q (n, D) and c (n * (1 + K), D): the n positives first, then each query's K
    negatives, each side sorted by length and cut by split_by_length. targets[i] indexes query i's positive
    in c; rows[i] is query i's row; skipped: the rows that could not be decoded (TrainDataset)."""
    return functools.partial(_collate_train, preprocessor=preprocessor, max_items=max_items)


def _collate_train(items, preprocessor, max_items):
    queries = [item["query"] for item in items]  # n
    candidates = [item["candidates"][0] for item in items]  # n positives first: positive of query i at i
    candidates += [negative for item in items for negative in item["candidates"][1:]]  # then n * K
    query_chunks = split_by_length([len(f["input_ids"]) for f in queries], max_items)
    candidate_chunks = split_by_length([len(f["input_ids"]) for f in candidates], max_items)
    query_order = [i for chunk in query_chunks for i in chunk]  # sorted position -> original query
    candidate_position = {j: p for p, j in enumerate(j for chunk in candidate_chunks for j in chunk)}
    return {
        "query": [preprocessor.collate([queries[i] for i in chunk]) for chunk in query_chunks],
        "candidate": [preprocessor.collate([candidates[j] for j in chunk]) for chunk in candidate_chunks],
        "targets": torch.tensor([candidate_position[i] for i in query_order], dtype=torch.long),  # (n,)
        "rows": torch.tensor([items[i]["row"] for i in query_order], dtype=torch.long),  # (n,)
        "skipped": [message for item in items for message in item["skipped"]],
    }


# -----------------------------------------------------------------------------
# batches of items, for model.Embedder.encode

def prepared(index, item, function):
    """function(text, image) of one item ({"text", "image"}), a ValueError naming the item if it is malformed
    or function fails on it."""
    if not isinstance(item, dict) or not ({"text", "image"} & set(item)):
        raise ValueError(f"item {index}: expected a dict with 'text' and/or 'image', got {item!r:.80}")
    text, image = item.get("text") or "", item.get("image")
    try:
        if not text.strip() and image is None:
            raise ValueError("has no text and no image")
        return function(text, image)
    except ValueError as error:
        raise ValueError(f"item {index}: {error}") from None


class Items(torch.utils.data.Dataset):
    """items[i] preprocessed (in a worker when num_workers > 0), for item_batches."""

    def __init__(self, items, preprocessor):
        self.items, self.preprocessor = items, preprocessor

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return prepared(i, self.items[i], self.preprocessor)


def item_batches(items, preprocessor, batch_size, num_workers=0):
    """Items ({"text", "image"} dicts) -> (indices, collated batch) pairs, batch_size items of about one length
    each (sorted longest first, so an out-of-memory error shows at once), preprocessed in num_workers DataLoader
    workers (0: in this process). An error names the item's index."""
    lengths = [prepared(i, item, preprocessor.num_tokens) for i, item in enumerate(items)]
    order = sorted(range(len(items)), key=lambda i: -lengths[i])
    batches = [order[k:k + batch_size] for k in range(0, len(order), batch_size)]
    loader = torch.utils.data.DataLoader(Items(items, preprocessor), batch_sampler=batches, num_workers=num_workers,
                                         collate_fn=preprocessor.collate)
    return zip(batches, loader)
