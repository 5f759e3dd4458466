"""
readers/training.py: the training downloads converted into the one prepared table data.py reads, once.

    path = prepared_table(["data/mmE5/mmE5-MMEB-hardneg", "data/mmE5/mmE5-synthetic",
                           {"path": "data/MMEB-train/VisDial", "image_dir": "data/MMEB-train"}],
                          image_dir="data/mmE5", table_dir="data/tables")
    table = data.TrainTable(path)
    problems(table.subsets, num_hard_negatives=5, skip_bad_rows=False)     # [] when a run would start
    problems(subsets_on_disk(table), 5, False)     # --check_data=True: every image the table names looked up again

A train_data entry is a file (.parquet / .jsonl), a subset folder, or a download's root (a folder of subset
folders), or a dict {"path": ..., "image_dir": ..., "max_rows": ...} so sources with different image roots mix in
one run (image_dir: the default image_dir; max_rows: at most this many rows of each subset, as mmE5 reads 50,000).
A folder is read through one split (records.split_files: train_split 'original' by default), never every file in
it. Each row's dataset (for the instructions and the leak check) is its subset folder's name, in either spelling.
Records of either layout (mmE5 / MMEB-train, or the plain one for your own data) become rows as
readers/records.py says.

Conversion happens on first use, automatically: train.py, --check_data=True, tools/mine.py and tools/geometry.py call prepared_table,
which finds the table of these sources and options in table_dir or writes it. Why not an explicit command: the
commands a user types stay the same, and a table can never be stale, since its name is a hash of what it was
made from: each source file's path, size and modification time, each entry's image_dir and max_rows, the split,
the instructions, allow_any_image_path and the conversion's FORMAT. The seed, num_hard_negatives, skip_bad_rows
and allow_eval_datasets are not in it: the fill happens as rows are read (data.py), and a run refuses what its
settings do not allow from the reports (problems). One writer: the first process to create <table>.lock (open
with O_EXCL, on a shared file system too) converts; every other rank and node waits for the table to appear,
saying so; a lock left by a process that died on this host is taken over. The table is written under a temporary
name and renamed, its JSON last.

Every row is read, also past a bad one, so the reports count every problem: a bad row (a missing image, a field
outside its layout, an empty query, negatives that do not parse) is left out of the table and counted by reason
with its first example; a run refuses to start unless skip_bad_rows=True. A subset holding one of MMEB's 16
out-of-distribution evaluation datasets is marked a leak, refused unless allow_eval_datasets=True. A start finds
a cached table without looking at its images (one gone since is named, or skipped, when a worker meets it);
--check_data=True looks every one up again (subsets_on_disk) and counts a row whose image is gone as the
conversion would have.
"""
import difflib
import hashlib
import json
import os
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import data
from common import Progress, UserError, relative_hint, replaced_atomically, take_lock
from readers import mmeb, v2_train
from readers.records import (DATA_SUFFIXES, MMEB_NAMES, PLAIN_NAMES, TRAIN_COLUMNS, BadRow, ImagePaths,
                             data_files, is_junk, layout_of, read_records, split_files, train_row, unknown_columns)
from media import frame_files
from readers.reports import SourceReport

FORMAT = 4  # the conversion's rules: raise it when a change to this file or readers/records.py changes any row
DISTINCT_CAP = 1000  # a subset's distinct candidates are counted up to this many (the fill needs K + 1)
BATCH_ROWS = 65536  # rows a record batch of the table holds


# -----------------------------------------------------------------------------
# which files train_data names

def train_entries(train_data, image_dir):
    """train_data -> [{"path", "image_dir", "max_rows", "weight", "parser", "data_mode"}]: a path, a dict, or a list
    of them. A weight is the entry's share of the draws in a mixture (data.MixtureSampler), a positive number; a
    parser one of VLM2Vec-V2's video and document sources (readers/v2_train.py), read through its data_mode."""
    entries = [train_data] if isinstance(train_data, (str, os.PathLike, dict)) else list(train_data)
    out, keys = [], {"path", "image_dir", "max_rows", "weight", "parser", "data_mode"}
    for entry in entries:
        if isinstance(entry, (str, os.PathLike)):
            entry = {"path": entry}
        if not isinstance(entry, dict) or "path" not in entry or set(entry) - keys:
            unknown = sorted(set(entry) - keys) if isinstance(entry, dict) else []
            close = {key: difflib.get_close_matches(key, sorted(keys), n=1) for key in unknown}
            hint = "".join(f"; {key!r}: did you mean {near[0]!r}?" for key, near in close.items() if near)
            raise UserError(f"train_data entry {entry!r}: expected a path, or a dict with 'path' and optionally "
                            "'image_dir', 'max_rows', 'weight', 'parser' and 'data_mode', e.g. {'path': "
                            f"'data/MMEB-train/VisDial', 'max_rows': 50000, 'weight': 0.5}}{hint}")
        weight, parser, mode = entry.get("weight"), entry.get("parser"), entry.get("data_mode")
        if weight is not None and (isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0):
            raise UserError(f"train_data entry {entry['path']!r}: weight must be a positive number, got {weight!r}")
        if parser is not None and parser not in v2_train.COLUMNS:
            raise UserError(f"train_data entry {entry['path']!r}: parser {parser!r} is none of "
                            f"{', '.join(v2_train.COLUMNS)}")
        if mode is not None and mode not in v2_train.DATA_MODES.get(parser, ()):
            raise UserError(f"train_data entry {entry['path']!r}: data_mode {mode!r} is not a mode of parser {parser!r} "
                            f"({', '.join(v2_train.DATA_MODES.get(parser, ())) or 'it has none'})")
        out.append({"path": os.fspath(entry["path"]), "image_dir": entry.get("image_dir") or image_dir,
                    "max_rows": entry.get("max_rows"), "weight": weight, "parser": parser,
                    "data_mode": mode or (v2_train.DATA_MODES.get(parser) or [None])[0]})
    if not out:
        raise UserError("train_data is empty: name a file, a subset folder or a download's root")
    return out


def train_subsets(path, split, parser=None):
    """A train_data path -> [(dataset name or None, subset folder or file, [files], split read)]: a file is one
    subset; a folder with data files is a subset folder (split_files); a folder of such folders is a download's
    root, each subfolder with data files a subset (folders without, such as images/ or images_zip/, are passed
    over). The dataset is the subset's name when it is an MMEB dataset (either spelling), else dataset_of(path).
    With a parser, the path is one subset, the parser its dataset: a file, or a Hugging Face download whose
    train-*-of-* files lie anywhere below it (as VLM2Vec-V2 loads split 'train')."""
    if not os.path.exists(path):
        raise UserError(f"train_data: {path} does not exist" + relative_hint(path))
    if parser is not None and os.path.isdir(path):
        files = sorted(os.path.join(folder, name) for folder, _, names in os.walk(path) for name in names
                       if name.endswith(DATA_SUFFIXES) and not is_junk(name))
        files, read = split_files(path, "train", files)
        return [(parser, path, files, read)]
    if parser is not None:
        return [(parser, path, [path], "(a file)")]
    if os.path.isfile(path):
        if not path.endswith(DATA_SUFFIXES):
            raise UserError(f"train_data: {path}: unknown file type, expected .parquet or .jsonl")
        return [(mmeb.dataset_of(path), path, [path], "(a file)")]
    if files := data_files(path):
        files, read = split_files(path, split, files)
        return [(mmeb.dataset_of(path), path, files, read)]
    subsets = []
    for name in sorted(os.listdir(path)):
        folder = os.path.join(path, name)
        if not is_junk(name) and os.path.isdir(folder) and (files := data_files(folder)):
            files, read = split_files(folder, split, files)
            subsets.append((mmeb.canonical_name(name) or mmeb.dataset_of(folder), folder, files, read))
    if not subsets:
        raise UserError(f"train_data: {path} holds no .parquet or .jsonl files, nor folders of them")
    return subsets


def file_identity(path, span=65536):
    """What says a file is the one the table was made from: its path, size and modification time, and a hash of
    its first and last 64 KB (a Parquet file's footer holds its row counts and statistics), so a file rewritten
    to the same size within the file system's clock tick is still told apart."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        digest.update(f.read(span))
        if os.path.getsize(path) > span:
            f.seek(max(span, os.path.getsize(path) - span))
            digest.update(f.read(span))
    return os.path.abspath(path), os.path.getsize(path), os.stat(path).st_mtime_ns, digest.hexdigest()[:16]


def table_path(entries, sources, table_dir, train_split, instructions, allow_any_image_path):
    """Where the table of these sources and options lives: table_dir/<names>-<hash>.arrow (the file docstring)."""
    made_from = {"format": FORMAT, "train_split": train_split, "instructions": instructions,
                 "allow_any_image_path": allow_any_image_path,
                 "entries": [{"image_dir": os.path.abspath(entry["image_dir"] or "."), "max_rows": entry["max_rows"],
                              "files": [file_identity(f) for _, _, files, _ in subsets for f in files],
                              "parser": entry["parser"], "data_mode": entry["data_mode"]}
                             for entry, subsets in zip(entries, sources)]}
    digest = hashlib.sha256(json.dumps(made_from, sort_keys=True).encode()).hexdigest()[:16]
    names = "+".join(os.path.splitext(os.path.basename(os.path.normpath(e["path"])))[0] for e in entries)[:60]
    return os.path.join(table_dir, f"{names}-{digest}.arrow")


# -----------------------------------------------------------------------------
# the conversion

def prepared_table(train_data, image_dir, table_dir="data/tables", train_split="original", instructions="paper",
                   allow_any_image_path=False):
    """The path of the prepared table of train_data: found in table_dir, or converted there now (one writer; the
    others wait). Every process may call it; each gets the same path."""
    mmeb.Instructions(instructions)  # a bad mode is an error before anything is read
    entries = train_entries(train_data, image_dir)
    sources = [train_subsets(entry["path"], train_split, entry["parser"]) for entry in entries]
    path = table_path(entries, sources, table_dir, train_split, instructions, allow_any_image_path)
    lock, waited = path + ".lock", 0
    os.makedirs(table_dir, exist_ok=True)
    while not os.path.isfile(data.info_path(path)):
        holder = take_lock(lock)  # None: this process converts; else another does, and this one waits
        if holder is not None:
            if waited % 30 == 0:
                who = f"pid {holder.get('pid')} on {holder.get('host')}" if holder else "another process"
                print(f"data: waiting for {who} to convert train_data into {path} (if that process is gone, delete "
                      f"{lock})", flush=True)
            time.sleep(1.0)
            waited += 1
            continue
        try:
            if not os.path.isfile(data.info_path(path)):  # another writer may have finished just before
                convert(entries, sources, path, instructions, allow_any_image_path)
        finally:
            os.remove(lock)
    return path


def convert(entries, sources, path, instructions, allow_any_image_path):
    """Read every subset of every entry into the table at path (and its JSON), printing each subset's report."""
    start, files, reports, rows = time.time(), [], [], 0
    print(f"data: converting train_data into {path} (once; later runs read it in seconds)", flush=True)
    with replaced_atomically(path) as tmp:
        with pa.ipc.new_file(tmp, data.SCHEMA) as writer:
            for k, (entry, subsets) in enumerate(zip(entries, sources)):
                pages = path + ".pages" if entry["parser"] in v2_train.PAGES else None  # its pages, written once
                images = ImagePaths(pages or entry["image_dir"], allow_any_image_path)
                if pages:
                    os.makedirs(pages, exist_ok=True)
                for dataset, subset, subset_files, split in subsets:
                    report = SourceReport(subset, dataset if not entry["data_mode"] else
                                          f"{dataset}:{entry['data_mode']}", split)
                    report.leak, report.start, report.entry = dataset in mmeb.OOD_DATASETS, rows, k
                    parse = entry["parser"] and (
                        lambda record, e=entry, p=pages, i=images: plain_of_source(record, e, p, i))
                    for batch in subset_batches(report, subset_files, entry["max_rows"], images, instructions,
                                                len(reports), files, parse):
                        writer.write_batch(batch)
                    rows = report.stop = rows + report.rows
                    reports.append(report)
                    print(f"data: {report.subset}: {report.rows:,} rows" + (f", {report.num_bad:,} bad" if report.bad
                                                                             else ""), flush=True)
                images.listings.clear(), images.frames.clear()  # the folder listings: memory no longer needed
    info = {"format": FORMAT, "rows": rows, "files": files, "subsets": [r.to_dict() for r in reports],
            "instructions": instructions, "seconds": time.time() - start, "written": time.strftime("%Y-%m-%d %H:%M:%S")}
    with replaced_atomically(data.info_path(path)) as tmp:  # last: its presence says the table is whole
        with open(tmp, "w") as f:
            json.dump(info, f, indent=1)
    print(f"data: {rows:,} rows of {len(reports)} subsets converted in {time.time() - start:.0f} s "
          f"({rows / max(time.time() - start, 1e-9):,.0f} rows/s)", flush=True)


def plain_of_source(record, entry, pages, images):
    """A record of a VLM2Vec-V2 source -> its plain-layout record (readers/v2_train.py); a page it wrote is noted in
    images' listing. A record the parser cannot read is a bad row."""
    try:
        plain = v2_train.plain_record(entry["parser"], record, entry["data_mode"], pages)
    except v2_train.Malformed as error:
        raise BadRow(error.field, error.problem, error.reason) from None
    for field in ("query_image", "positive_image"):
        if pages and plain.get(field):
            images.add(os.path.join(pages, plain[field]))
    return plain


def subset_batches(report, subset_files, max_rows, images, instructions, index, files, parse=None):
    """One subset's rows as record batches of data.SCHEMA, its report filled in as they are read. A bad row is
    counted and left out; a subset that cannot be read, or holds no row, gets a failure. parse: a VLM2Vec-V2
    source's reader (plain_of_source), whose rows keep their texts (no instructions are rewritten)."""
    rewrite, columns, distinct = mmeb.Instructions(instructions), {name: [] for name in data.COLUMNS}, set()
    keep = (lambda text: text) if parse else (lambda text: rewrite(text, report.dataset))  # noqa: E731
    try:
        for path in subset_files:
            left = None if max_rows is None else max_rows - report.rows
            if left is not None and left <= 0:
                break
            files.append(path)
            report.files[path], progress = 0, Progress(None, f"data: reading {path}", "rows", every=30.0)
            stray = None if parse else unknown_columns(path)  # a column no layout has: every row is bad, says why
            columns_read = v2_train.COLUMNS[report.dataset.split(":")[0]] if parse else TRAIN_COLUMNS
            for number, (location, record) in enumerate(read_records(path, columns_read, left), 1):
                try:
                    if isinstance(record, BadRow):
                        raise record
                    if stray:
                        raise stray.with_traceback(None)  # one error for every row: no traceback piles up
                    row, missing = train_row(parse(record) if parse else record, images, keep)
                except BadRow as error:
                    report.bad_row(f"{path} {location}", error)
                    continue
                report.layout = report.layout or (report.dataset.split(":")[0] if parse else layout_of(record))
                report.videos.update(row["frames"])
                report.negatives[len(row["negatives"])] += 1
                report.missing_negatives += missing
                report.judged += row["judge"] is not None
                if len(distinct) < DISTINCT_CAP:
                    distinct.add((row["positive"], row["positive_image"], str(row["positive_video"])))
                    distinct.update(zip(row["negatives"], row["negative_images"], map(str, row["negative_videos"])))
                row.update(subset=index, file=len(files) - 1, location=location)
                for name in data.COLUMNS:
                    columns[name].append(row[name])
                report.files[path] += 1  # as it goes: a file that fails half-way keeps the rows it gave
                if len(columns["query"]) == BATCH_ROWS:
                    yield record_batch(columns)
                    columns = {name: [] for name in data.COLUMNS}
                if number % 4096 == 0:
                    progress.update(4096)
        if not report.rows and not report.bad:
            raise UserError(f"{report.subset}: no rows in it")
    except UserError as error:  # a file that is not Parquet, a folder without rows: the subset cannot be used
        report.failure = str(error)
    report.distinct = min(len(distinct), DISTINCT_CAP)
    report.instructions = {"mode": rewrite.mode, "counts": dict(rewrite.counts)}
    if columns["query"]:
        yield record_batch(columns)


def record_batch(columns):
    """{column: [values]} -> one record batch of data.SCHEMA."""
    return pa.record_batch([pa.array(columns[n], data.SCHEMA.field(n).type) for n in data.COLUMNS], schema=data.SCHEMA)


# -----------------------------------------------------------------------------
# what a run makes of the reports

def image_dir_problems(train_data, image_dir, subsets):
    """A train_data entry whose image_dir does not exist while its rows name images or videos: said as that, ahead
    of the rows it made bad. -> ['...: image_dir ... does not exist ...', ...]"""
    found = []
    for k, entry in enumerate(train_entries(train_data, image_dir)):
        missing = sum(s["bad"].get(reason, 0) for s in subsets if s["entry"] == k
                      for reason in ("missing image", "missing video folder"))
        if missing and not os.path.isdir(entry["image_dir"]):
            found.append(f"{entry['path']}: image_dir {entry['image_dir']!r} does not exist, so the images and videos "
                         f"of {missing:,} rows, named relative to it, are missing: pass --image_dir=<the folder they "
                         "are under> (or the entry's 'image_dir')" + relative_hint(entry["image_dir"]))
    return found


def problems(subsets, num_hard_negatives, skip_bad_rows, allow_eval_datasets=False, judged=False):
    """Why a run with these settings would not start on a table whose subsets' reports are `subsets` (dicts, as
    data.TrainTable.subsets holds them): ['subset: problem', ...], [] when it would."""
    found = []
    for values in subsets:
        report = SourceReport.from_dict(values)
        found += [f"{report.subset}: {p}" for p in report.problems(skip_bad_rows, allow_eval_datasets,
                                                                   num_hard_negatives, judged)]
    return found


def checked_table(train_data, image_dir, table_dir="data/tables", num_hard_negatives=0, train_split="original",
                  instructions="paper", allow_any_image_path=False, skip_bad_rows=False, allow_eval_datasets=False,
                  judged=False):
    """The prepared table of train_data (prepared_table), refused with one UserError naming every problem a run
    with these settings would have with it (problems). -> data.TrainTable"""
    table = data.TrainTable(prepared_table(train_data, image_dir, table_dir, train_split, instructions,
                                           allow_any_image_path))
    found = image_dir_problems(train_data, image_dir, table.subsets) + problems(
        table.subsets, num_hard_negatives, skip_bad_rows, allow_eval_datasets, judged)
    if found:
        raise UserError("train_data: " + "; ".join(found))
    return table


def subsets_on_disk(table):
    """--check_data=True on a prepared table (data.TrainTable), found cached or just converted: every image and
    video it names looked up again, since its name covers the row files and options, not the images they name. Each
    folder is listed once (records.ImagePaths), so 2.03M rows cost seconds (bench/RESULTS.md). -> the subsets'
    reports as dicts (table.subsets' form), a row whose image or video is gone counted as the conversion counts it:
    a bad row ('missing image', 'missing video folder') naming its file, row and field, taken out of its subset's
    rows, negatives and judged rows."""
    columns = {name: table.column(name) for name in ("query_image", "positive_image", "negative_images", "query_video",
                                                     "positive_video", "negative_videos")}
    flat = {name: pc.list_flatten(column) for name, column in columns.items() if name.endswith(("s", "video"))}
    flat["negative_videos"] = pc.list_flatten(flat["negative_videos"])
    images = ImagePaths("/")
    named = [columns["query_image"], columns["positive_image"], flat["negative_images"]]
    gone = [path for path in pc.unique(pa.chunked_array([c for n in named for c in n.chunks], pa.string()))
            .drop_null().to_pylist() if not images.exists(path)]
    videos = [flat["query_video"], flat["positive_video"], flat["negative_videos"]]
    gone += [path for path in pc.unique(pa.chunked_array([c for n in videos for c in n.chunks], pa.string()))
             .drop_null().to_pylist() if not images.exists(path) and not frame_files(path)]  # a frame, or a folder
    reports = [SourceReport.from_dict(values) for values in table.subsets]
    if gone:  # which rows name them: (bad rows,) sorted, each told as the conversion tells it
        gone, rows = pa.array(gone, pa.string()), np.array([], dtype=np.int64)
        for name, column in columns.items():
            if name.startswith("negative_") or name.endswith("_video"):  # a list: which rows hold a hit
                parents, values = pc.list_parent_indices(column), pc.list_flatten(column)
                if name == "negative_videos":
                    parents, values = pc.take(parents, pc.list_parent_indices(values)), pc.list_flatten(values)
                rows = np.union1d(rows, parents.filter(pc.is_in(values, value_set=gone)).to_numpy())
            else:
                rows = np.union1d(rows, np.flatnonzero(pc.is_in(column, value_set=gone).to_numpy()))
        missing = set(gone.to_pylist())
        for i in rows.tolist():
            report_missing_image(table, i, reports[table.subset_of[i]], missing)
    return [report.to_dict() for report in reports]


def report_missing_image(table, i, report, gone):
    """Row i of table, whose image or video is gone: counted in its subset's report as the conversion counts it."""
    names = MMEB_NAMES if report.layout == "mmE5" else PLAIN_NAMES
    get = lambda name: table.column(name)[i].as_py()  # noqa: E731
    negatives, videos = get("negative_images"), get("negative_videos") or []
    sides = [(names["query_image"], [get("query_image")]), (names["positive_image"], [get("positive_image")]),
             ("query_video", get("query_video") or []), ("positive_video", get("positive_video") or [])]
    sides += [(f"{names['negative_images']}[{k}]", [path]) for k, path in enumerate(negatives)]  # k: among those kept
    sides += [(f"negative_videos[{k}]", video or []) for k, video in enumerate(videos)]
    field, path = next((field, path) for field, paths in sides for path in paths if path in gone)
    source, video = table.info["files"][get("file")], "video" in field
    problem, reason = (f"video folder not found or empty: {path}", "missing video folder") if video else \
        (f"image not found: {path}", "missing image")
    report.bad_row(f"{source} {get('location')}", BadRow(field, problem, reason))
    report.files[source] -= 1
    report.negatives[len(negatives)] -= 1
    report.negatives = +report.negatives  # a count at 0 is no count
    report.judged -= get("judge") is not None


def mixture(train_data, image_dir, subsets, homogeneous_batch=0):
    """The table's sources, train_data's entries: [{"path", "ranges": [(start, stop)] of its subsets' rows, "rows",
    "weight"}]; with no weight anywhere and no homogeneous batches, None: rows are drawn uniformly
    (data.ShardedBatchSampler). An entry without a weight weighs 1; with homogeneous batches alone, its rows."""
    entries = train_entries(train_data, image_dir)
    if all(entry["weight"] is None for entry in entries) and not homogeneous_batch:
        return None
    sources = []
    for k, entry in enumerate(entries):
        ranges = [(s["start"], s["stop"]) for s in subsets if s["entry"] == k and s["stop"] > s["start"]]
        rows = sum(b - a for a, b in ranges)
        if not rows:
            raise UserError(f"train_data entry {entry['path']!r}: no usable rows, nothing for its weight to draw")
        weighted = any(e["weight"] is not None for e in entries)
        sources.append({"path": entry["path"], "ranges": ranges, "rows": rows,
                        "weight": (entry["weight"] or 1.0) if weighted else float(rows)})
    return sources


def mixture_lines(sources, batch_size, homogeneous_batch):
    """What --check_data and a start say of a mixture: each source's rows, weight and expected share of the draws,
    and how many steps read it through once."""
    total = sum(s["weight"] for s in sources)
    lines = [f"mixture: {len(sources)} sources, " + (f"same-source groups of {homogeneous_batch} queries a rank"
                                                     if homogeneous_batch else "a source drawn per query")]
    for s in sources:
        share = s["weight"] / total
        lines.append(f"  {s['path']}: {s['rows']:,} rows, weight {s['weight']:g}, {share:.1%} of the draws: read "
                     f"through once every {s['rows'] / (share * batch_size):,.0f} steps")
    return lines


def report_lines(subsets, num_hard_negatives, video_frames=None):
    """Every subset's report as the conversion printed it, with the fill, the cut and the frames this run makes."""
    return [line for values in subsets for line in SourceReport.from_dict(values).lines(num_hard_negatives,
                                                                                         video_frames)]
