"""
data.py: the prepared training table into model inputs: the memory-mapped table, the dataset with the fill of missing
negatives, the resumable rank-sharded sampler, the least-padding cut of a batch into forward calls, the collate.

    table = TrainTable("data/tables/mmE5-....arrow")         # readers/training.py converts the downloads into it
    dataset = TrainDataset(table, preprocessor, num_hard_negatives=5, seed=1337)   # model.Preprocessor
    sampler = ShardedBatchSampler(len(dataset), batch_size=256, rank=rank, world_size=8, seed=1337)
    loader = DataLoader(dataset, batch_sampler=sampler, num_workers=8,
                        collate_fn=collate_train(preprocessor, max_items=32))
    for batch in loader:      # never ends; batch["query"] / ["candidate"]: lists of collated chunks
        ...
        sampler.position += 1  # this batch is consumed; sampler.state_dict() goes into the checkpoint

The table is an Arrow IPC file read through a memory map (every rank and worker reads the same page cache; opening it
costs milliseconds), one row a query: its text and image or video, its positive's, its hard negatives' (hardest
first), a judge's scores, its subset and source; the JSON beside it keeps each subset's report (readers/reports.py).
A row read has exactly num_hard_negatives negatives: missing ones are drawn from other rows of its subset (seeded).
"""
import functools
import json
import math
import os
import random

import numpy as np
import pyarrow as pa
import torch

from common import UserError
from media import frame_files

COLUMNS = ("subset", "file", "location", "query", "query_image", "positive", "positive_image", "negatives",
           "negative_images", "judge", "query_video", "positive_video", "negative_videos")
VIDEO = pa.list_(pa.string())  # a video: [its folder of frames] or its frame files; null: none
SCHEMA = pa.schema([("subset", pa.int32()), ("file", pa.int32()), ("location", pa.string()), ("query", pa.string()),
                    ("query_image", pa.string()), ("positive", pa.string()), ("positive_image", pa.string()),
                    ("negatives", pa.list_(pa.string())), ("negative_images", pa.list_(pa.string())),
                    ("judge", pa.list_(pa.float64())), ("query_video", VIDEO), ("positive_video", VIDEO),
                    ("negative_videos", pa.list_(VIDEO))])


# -----------------------------------------------------------------------------
# the table

def info_path(path):
    """The JSON beside a table: its sources and its subsets' reports."""
    return os.path.splitext(path)[0] + ".json"


class TrainTable:
    """The prepared table at path (an .arrow file and its .json), read through a memory map, opened anew in each
    process that reads it (a DataLoader worker forked from a process that had it open reopens it). len(table):
    rows; table.subsets: the subsets' reports as dicts (subset, dataset, start, stop, ...); table.row(i)."""

    def __init__(self, path):
        self.path, self.info_path = os.fspath(path), info_path(path)
        try:
            with open(self.info_path) as f:
                self.info = json.load(f)
        except (OSError, ValueError) as error:
            raise UserError(f"{self.info_path}: not a prepared table's description ({error})") from None
        self.subsets = self.info["subsets"]
        self.subset_of = np.zeros(self.info["rows"], dtype=np.int32)  # (N,) row -> its subset's index
        for index, subset in enumerate(self.subsets):
            self.subset_of[subset["start"]:subset["stop"]] = index
        self.columns, self.pid = None, None

    def __len__(self):
        return self.info["rows"]

    def __getstate__(self):  # what a DataLoader worker receives: the path, not the open map
        return dict(self.__dict__, columns=None, pid=None)

    def column(self, name):
        if self.pid != os.getpid():
            try:
                table = pa.ipc.open_file(pa.memory_map(self.path)).read_all()  # zero-copy: the map's pages
            except (OSError, pa.ArrowInvalid) as error:  # missing, cut short, or not a table
                raise UserError(f"{self.path}: cannot read it as a prepared table ({error}): delete it and "
                                f"{self.info_path}, and convert again") from None
            if table.num_rows != len(self):
                raise UserError(f"{self.path}: {table.num_rows:,} rows, its {self.info_path} says {len(self):,}: "
                                "delete both and convert again")
            self.columns, self.pid = {name: table.column(name) for name in COLUMNS}, os.getpid()
        return self.columns[name]

    def candidates(self, i):
        """Row i's positive and negatives as sides {"text", "image": a path or None, "video" if any: see video_of}."""
        get = lambda name: self.column(name)[i].as_py()  # noqa: E731
        videos = get("negative_videos") or [None] * len(get("negatives"))
        sides = [side(get("positive"), get("positive_image"), get("positive_video"))]
        return sides + [side(*values) for values in zip(get("negatives"), get("negative_images"), videos)]

    def row(self, i):
        """Row i -> {"query": side, "candidates": [positive, negatives...], "source": "file row 7", "judge"}."""
        get = lambda name: self.column(name)[i].as_py()  # noqa: E731
        return {"query": side(get("query"), get("query_image"), get("query_video")), "candidates": self.candidates(i),
                "source": f"{self.info['files'][get('file')]} {get('location')}", "judge": get("judge")}


def side(text, image, video):
    return {"text": text, "image": image, **({"video": video} if video else {})}


def video_of(stored):
    """A video as the table keeps it -> its frame files or None: [folder] is the folder's frames, listed now; a folder
    gone or empty is a ValueError (met as an image that does not decode). Fewer than video_frames: all kept."""
    if stored and len(stored) == 1 and not os.path.isfile(folder := stored[0]) and not (stored := frame_files(folder)):
        raise ValueError(f"video folder {folder} is gone or holds no frame")
    return stored or None


def row_with_negatives(table, i, num_negatives, seed):
    """Row i of table with exactly K = num_negatives negatives: its first K (mined ones come hardest first, a judge's
    scores with them), or fewer filled with candidates of other rows of its subset, drawn by random.Random(f"{seed}/
    {subset}/{row in it}") (the data and the seed alone decide), none equal to one it has (a shared class label)."""
    row = table.row(i)
    key = lambda side: (side["text"], side["image"], str(side.get("video")))  # noqa: E731
    candidates = row["candidates"][:1 + num_negatives]  # the positive, then the first K negatives
    if row["judge"] is not None:  # a judged row's scores go with its candidates; the judge never saw a filled one
        row["judge"] = row["judge"][:1 + num_negatives]
    if len(candidates) < 1 + num_negatives:
        index = int(table.subset_of[i])
        start, stop = table.subsets[index]["start"], table.subsets[index]["stop"]
        rng = random.Random(f"{seed}/{index}/{i - start}")
        taken = {key(c) for c in candidates}
        for _ in range(100 * num_negatives):
            if len(candidates) == 1 + num_negatives or stop - start < 2:
                break
            j = rng.randrange(stop - start)
            originals = table.candidates(start + j)
            drawn = originals[rng.randrange(len(originals))]
            if j != i - start and key(drawn) not in taken:
                taken.add(key(drawn))
                candidates.append(drawn)
        if len(candidates) < 1 + num_negatives:
            raise UserError(f"{table.subsets[index]['subset']}: cannot fill {row['source']} to {num_negatives} hard "
                            f"negatives; the subset has too few distinct candidates ({stop - start} rows)")
    row["candidates"] = candidates
    return row


class TrainDataset(torch.utils.data.Dataset):
    """dataset[i] = {"query": feature, "candidates": [positive, K negatives] features, "row": j, "skipped": [...],
    "judge"}, each feature a model.Preprocessor output. Runs in the DataLoader workers, where an image that does
    not decode (truncated, corrupt, over Pillow's pixel limit, an aspect ratio over 200) is first found: an error
    naming the file, row and image, or with skip_bad_rows the next row that decodes (j = i + 1, ...), the same on
    every run so a resumed run is the straight run; "skipped" lists what was passed over."""

    def __init__(self, table, preprocessor, num_hard_negatives, seed, skip_bad_rows=False):
        self.table, self.preprocessor, self.skip_bad_rows = table, preprocessor, skip_bad_rows
        self.num_hard_negatives, self.seed = num_hard_negatives, seed

    def __len__(self):
        return len(self.table)

    def __getitem__(self, i):
        # row i, else (with skip_bad_rows) the next one that decodes; that row may then be in the batch twice, its
        # positive a false negative of its twin: rare
        skipped = []
        for k in range(len(self.table)):
            j = (i + k) % len(self.table)
            try:
                row = row_with_negatives(self.table, j, self.num_hard_negatives, self.seed)
                return dict(self.prepare(row), row=j, skipped=skipped, judge=row["judge"])
            except ValueError as error:
                if not self.skip_bad_rows:
                    raise
                skipped.append(str(error))
        raise UserError(f"no row of the {len(self.table)} can be decoded; the first: {skipped[0]}")

    def prepare(self, row):
        names = [("qry_image_path", "query_video"), ("pos_image_path", "positive_video")] + [
            (f"neg_image_path[{k}]", f"negative_videos[{k}]") for k in range(len(row["candidates"]) - 1)]
        features = []
        for k, (side, name) in enumerate(zip([row["query"]] + row["candidates"], names)):
            field = f"field '{name[1] if side.get('video') else name[0]}'" + (" (or a negative filled from another "
                                                                             "row)" if k > 1 else "")
            try:
                features.append(self.preprocessor(side["text"], side["image"], video_of(side.get("video"))))
            except ValueError as error:
                raise UserError(f"{row['source']} {field}: {error}") from None
        return {"query": features[0], "candidates": features[1:]}


# -----------------------------------------------------------------------------
# the sampler

def check_batch(batch_size, world_size, group=0):
    """What a batch must split into, said with the values that would do: batch_size queries evenly over the ranks,
    and each rank's share into same-source groups of `group` (homogeneous_batch). train.py and --check_data ask."""
    if batch_size % world_size:
        raise UserError(f"batch_size={batch_size} must split evenly over {world_size} ranks: a multiple of "
                        f"{world_size}, such as {batch_size - batch_size % world_size or world_size}")
    per_rank = batch_size // world_size
    if group and per_rank % group:
        valid = [n for n in range(1, per_rank + 1) if per_rank % n == 0]
        raise UserError(f"homogeneous_batch={group} does not divide a rank's {per_rank} queries (batch_size="
                        f"{batch_size} over {world_size} ranks): use one of {', '.join(map(str, valid))}")


class ShardedBatchSampler:
    """Yields this rank's share (batch_size / world_size indices) of each global batch, forever: epoch e is
    numpy.random.default_rng([seed, e]).permutation(num_rows) cut into num_rows // batch_size global batches (the
    partial last one dropped). DataLoader's batch_sampler. Workers prefetch, so its state is `position`, the global
    batches consumed, which the loop advances itself; batches do not depend on world_size (resume on other ranks)."""

    def __init__(self, num_rows, batch_size, rank=0, world_size=1, seed=0):
        check_batch(batch_size, world_size)
        if num_rows < batch_size:
            raise UserError(f"{num_rows} rows cannot fill one batch of {batch_size}")
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
                raise UserError(f"cannot resume the data: the checkpoint has {key}={state[key]}, "
                                 f"this run {getattr(self, key)}")
        self.position = int(state["position"])


class MixtureSampler(ShardedBatchSampler):
    """ShardedBatchSampler over sources ({"ranges": [(start, stop)] of rows, "weight"}), each drawn with probability
    weight / total per query, or (group > 0) per group of `group` queries of every rank at once: the candidates the
    loss gathers across ranks for group g are then one source's (VLM2Vec-V2's homogeneous batches). One seeded stream
    of draws, alike on every rank; a source is read through seeded permutations, one after another (VLM2Vec-V2
    restarts a source unshuffled). An epoch: num_rows // batch_size steps. State: `position`, draws replayed."""

    def __init__(self, sources, batch_size, rank=0, world_size=1, seed=0, group=0):
        self.rows = [np.concatenate([np.arange(a, b) for a, b in s["ranges"]]) for s in sources]  # each (R_s,)
        super().__init__(sum(map(len, self.rows)), batch_size, rank, world_size, seed)
        check_batch(batch_size, world_size, group)
        per_rank = batch_size // world_size
        weights = np.array([s["weight"] for s in sources], dtype=np.float64)
        self.probabilities, self.group = weights / weights.sum(), group
        self.draws = per_rank // group if group else batch_size  # sources drawn a step, alike on every rank
        self.passes = {}  # source -> (its pass, that pass's permutation)

    def batches_from(self, position):
        per_rank, world, size = self.batch_size // self.world_size, self.world_size, self.group or 1
        draws = np.random.default_rng([self.seed, 1])
        taken = np.bincount(draws.choice(len(self.rows), position * self.draws, p=self.probabilities),
                            minlength=len(self.rows)) * (size * world if self.group else 1)  # (S,) rows read so far
        while True:
            mine = []
            for k, source in enumerate(draws.choice(len(self.rows), self.draws, p=self.probabilities).tolist()):
                first = taken[source] + (self.rank * size if self.group else 0)
                if self.group or k // per_rank == self.rank:  # every rank's group g; else this rank's queries
                    mine += [self.row(source, first + j) for j in range(size)]
                taken[source] += size * world if self.group else 1
            yield mine

    def row(self, source, k):
        """The k-th row a source gives: in its pass k // R_s, a seeded permutation of its rows (the last kept)."""
        rows, (done, order) = self.rows[source], self.passes.get(source, (None, None))
        if done != k // len(rows):
            done, order = k // len(rows), np.random.default_rng([self.seed, 2, source, k // len(rows)]).permutation(len(rows))
            self.passes[source] = done, order
        return int(rows[order[k % len(rows)]])

    def state_dict(self):  # homogeneous groups are per rank: their draws depend on the number of ranks
        return dict(super().state_dict(), probabilities=self.probabilities.tolist(), group=self.group,
                    ranks=self.world_size if self.group else None)

    def load_state_dict(self, state):
        for key in ("probabilities", "group", "ranks"):  # the same mixture, or the position means nothing
            if state.get(key) != self.state_dict()[key]:
                raise UserError(f"cannot resume the data: the checkpoint has {key}={state.get(key)}, this run "
                                f"{self.state_dict()[key]}")
        super().load_state_dict(state)


# -----------------------------------------------------------------------------
# batches

def split_by_length(lengths, max_items=None):
    """Indices -> chunks (index lists), one forward call each: sorted longest first, cut where the padded positions
    (sum over chunks of longest * count) are fewest, into number_of_chunks(n, max_items) chunks of at most max_items
    (None: one chunk). The count depends on n and max_items alone, never on the lengths or on what an item holds
    (text, image, video): under FSDP2 every forward call is a collective every rank must make."""
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


def collate_train(preprocessor, max_items=None, cut=split_by_length):
    """collate_fn for DataLoader over TrainDataset (picklable). n items -> {"query": [collated chunks], "candidate":
    [collated chunks], "targets": (n,), "rows": (n,), "skipped": [messages]}, and for judged rows "judge_scores" and
    "own_candidates" (n, 1 + K): each query's judge scores and the indices in c of its positive and K negatives
    (loss.pace_loss's). The chunks' embeddings give q (n, D) and c (n * (1 + K), D): the n positives, then each
    query's K negatives, each side cut into forward calls by cut(lengths, max_items) (split_by_length: the least
    padding; bench/bench.py passes simpler cuts). targets[i]: query i's positive in c; rows[i]: its row."""
    return functools.partial(_collate_train, preprocessor=preprocessor, max_items=max_items, cut=cut)


def _collate_train(items, preprocessor, max_items, cut):
    queries = [item["query"] for item in items]  # n
    candidates = [item["candidates"][0] for item in items]  # n positives first: positive of query i at i
    candidates += [negative for item in items for negative in item["candidates"][1:]]  # then n * K
    query_chunks = cut([len(f["input_ids"]) for f in queries], max_items)
    candidate_chunks = cut([len(f["input_ids"]) for f in candidates], max_items)
    query_order = [i for chunk in query_chunks for i in chunk]  # chunk order -> original query
    candidate_position = {j: p for p, j in enumerate(j for chunk in candidate_chunks for j in chunk)}
    batch = {
        "query": [preprocessor.collate([queries[i] for i in chunk]) for chunk in query_chunks],
        "candidate": [preprocessor.collate([candidates[j] for j in chunk]) for chunk in candidate_chunks],
        "targets": torch.tensor([candidate_position[i] for i in query_order], dtype=torch.long),  # (n,)
        "rows": torch.tensor([items[i]["row"] for i in query_order], dtype=torch.long),  # (n,)
        "skipped": [message for item in items for message in item["skipped"]],
    }
    if all(item.get("judge") is not None for item in items):
        n, k = len(items), len(items[0]["candidates"]) - 1  # query i's negatives sit at n + i * k + 0 .. k - 1
        batch["judge_scores"] = torch.tensor([items[i]["judge"] for i in query_order], dtype=torch.float32)  # (n, 1 + K)
        batch["own_candidates"] = torch.tensor([[candidate_position[i]] + [candidate_position[n + i * k + j]
                                                                           for j in range(k)] for i in query_order])
    return batch
