"""
readers/evaluation.py: MMEB's evaluation rows as the downloads hold them, v1 (TIGER-Lab/MMEB-eval) and V2 (the
instruction in its own columns), read and checked for eval.py.

    names, empty = find_eval_datasets("data/MMEB-eval")           # the dataset folders of a download
    mmeb_names, others, omitted, missing = which_datasets("data/MMEB-eval", "data/eval_images", [], False, print)
    rows, report = read_eval_dataset("data/MMEB-eval/ImageNet-1K", "data/eval_images", instructions="paper")
    rows[0]   # {"query": {"text", "image"}, "candidates": [gold, others...]}

A dataset folder holds Parquet files (directly, or nested as Hugging Face's refs/convert/parquet branch nests them)
with qry_text, qry_img_path, tgt_text (a list), tgt_img_path (a list), candidate 0 the gold one; image paths are
relative to where the images were unpacked. MMEB-V2 adds qry_inst and tgt_inst, joined into the texts as
VLM2Vec-V2's parsers join them (readers/mmeb.py), and as they do a text -> image query is its text alone, whatever
its qry_img_path holds. Every image is checked to exist; a row with a single candidate
would be a free hit and is a bad row too.
"""
import glob
import os

import pyarrow.parquet as pq

from common import UserError
from readers import mmeb
from readers.mmeb_v2_data import V2_TASKS
from readers.records import (IMAGE_SUFFIXES, BadRow, ImagePaths, entry_pairs, is_junk, list_field,
                             make_side, read_records, text_field)
from readers.reports import SourceReport

EVAL_COLUMNS = ("qry_text", "qry_img_path", "tgt_text", "tgt_img_path")
V2_COLUMNS = ("qry_inst", "qry_text", "qry_img_path", "tgt_inst", "tgt_text", "tgt_img_path")


def eval_files(folder):
    """An evaluation dataset folder's Parquet files, directly or in subfolders (Hugging Face's refs/convert/parquet
    branch nests them in test/), sorted."""
    paths = glob.glob(os.path.join(glob.escape(os.fspath(folder)), "**", "*.parquet"), recursive=True)
    return sorted(p for p in paths if not is_junk(os.path.basename(p)))


def find_eval_datasets(mmeb_dir, image_dir=""):
    """Sorted names of the dataset folders of mmeb_dir: every folder but hidden ones and image folders (image_dir
    itself or one holding image files). -> (names with Parquet files, names without any: empty datasets)."""
    if not os.path.isdir(mmeb_dir):
        raise UserError(f"mmeb_dir: {mmeb_dir} is not a folder")
    image_root = os.path.abspath(image_dir) if image_dir else None
    names, empty = [], []
    for name in sorted(os.listdir(mmeb_dir)):
        folder = os.path.join(mmeb_dir, name)
        if is_junk(name) or not os.path.isdir(folder) or os.path.abspath(folder) == image_root:
            continue
        if eval_files(folder):
            names.append(name)
        elif name in mmeb.MMEB_TABLE or not any(f.lower().endswith(IMAGE_SUFFIXES + (".zip",)) and not is_junk(f)
                                                for _, _, files in os.walk(folder) for f in files):
            empty.append(name)  # a MMEB dataset's folder is never taken for an image folder
    return names, empty


def eval_row(record, images, dataset, v2, rewrite):
    """One MMEB-eval record (v1, or V2 with its instruction columns joined as VLM2Vec-V2 joins them) ->
    {"query": side, "candidates": [gold, others...]}, the query's text through rewrite (the instructions)."""
    query_image = text_field(record, "qry_img_path")
    query_text = text_field(record, "qry_text")
    candidate_texts = list_field(record, "tgt_text", required=True)
    candidate_images = list_field(record, "tgt_img_path", required=True)
    if v2:
        kind = mmeb.v2_kind(dataset, bool(query_image), query_text)
        query_image = "" if kind == "t2i" else query_image  # VLM2Vec-V2's t2i parser never reads qry_img_path
        query_text = mmeb.v2_query(kind, dataset, text_field(record, "qry_inst"), query_text)
        candidate_texts = mmeb.v2_candidates(kind, text_field(record, "tgt_inst"), candidate_texts)
    query = make_side(query_text, query_image, "qry_text", "qry_img_path", images, "empty query")
    pairs = entry_pairs(candidate_texts, candidate_images, "tgt_text", "tgt_img_path")
    candidates = [make_side(t, i, f"tgt_text[{k}]", f"tgt_img_path[{k}]", images, "empty candidate")
                  for k, (t, i) in enumerate(pairs)]
    if len(candidates) < 2:
        raise BadRow("tgt_text", f"{len(candidates)} candidates: at least the gold and one other needed",
                     "too few candidates")
    query["text"] = rewrite(query["text"])
    return {"query": query, "candidates": candidates}


def read_eval_dataset(folder, image_dir, skip_bad_rows=False, instructions="dataset", allow_any_image_path=False):
    """One evaluation dataset folder -> (rows); rows[i] = {"query": side, "candidates": [side, ...]},
    candidate 0 the gold one. instructions: 'paper' (Table 5's) or 'dataset' (the rows' own). The layout (v1, or
    V2 with qry_inst / tgt_inst columns) is read from the first file's columns and named in the report. A bad row
    raises naming file, row and field, or with skip_bad_rows is counted in the report."""
    folder = os.fspath(folder)
    files = eval_files(folder)
    if not files:
        raise UserError(f"no .parquet files under {folder}")
    name = os.path.basename(os.path.normpath(folder))
    dataset = mmeb.canonical_name(name) or name
    report = SourceReport(folder, dataset, "test")
    v2 = "qry_inst" in pq.ParquetFile(files[0]).schema_arrow.names
    report.layout = "V2" if v2 else "v1"
    images, rewrite = ImagePaths(image_dir, allow_any_image_path), mmeb.Instructions(instructions)
    rows = []
    for path in files:
        count = 0
        for location, record in read_records(path, V2_COLUMNS if v2 else EVAL_COLUMNS):
            try:
                if isinstance(record, BadRow):
                    raise record
                rows.append(eval_row(record, images, dataset, v2, lambda text: rewrite(text, dataset)))
                count += 1
            except BadRow as error:
                if not skip_bad_rows:
                    raise UserError(error.at(f"{path} {location}")) from None
                report.bad_row(f"{path} {location}", error)
        report.files[path] = count
    report.instructions = {"mode": rewrite.mode, "counts": dict(rewrite.counts)}
    return rows, report


def which_datasets(mmeb_dir, image_dir, datasets, allow_missing_datasets, log):
    """-> (MMEB datasets to score, others to score, omitted for want of Parquet files, MMEB's missing ones). An
    empty dataset folder is an error unless allow_missing_datasets: silently dropping it would change the means."""
    found, empty = find_eval_datasets(mmeb_dir, image_dir)
    present = found + empty
    if datasets:
        absent = [name for name in datasets if name not in present]
        if absent:
            raise UserError(f"datasets {absent} are not folders of {mmeb_dir}")
        names = list(datasets)
    else:
        names = [name for name in present if name in mmeb.MMEB_TABLE] or present  # the toy: no MMEB dataset
        v2_repos = {task.repo.split("/")[1] for task in V2_TASKS.values()}  # MMEB-V2's video and visdoc rows
        passed = [name for name in present if name not in names and name not in v2_repos]
        if passed:
            log(f"not scored: {', '.join(passed)} (not among MMEB's 36; name it in datasets to score it apart)")
    omitted = [name for name in names if name in empty]
    if omitted and not allow_missing_datasets:
        raise UserError(f"dataset folders without Parquet files in {mmeb_dir}: {', '.join(omitted)} (download them, "
                        "or pass --allow_missing_datasets=True to list them as omitted)")
    if omitted:
        log(f"omitted, no Parquet files: {', '.join(omitted)}")
    names = [name for name in names if name not in omitted]
    if not names:
        raise UserError(f"no dataset with Parquet files to evaluate in {mmeb_dir}")
    scored_mmeb = [name for name in names if name in mmeb.MMEB_TABLE]
    missing = sorted(name for name in mmeb.MMEB_TABLE if name not in scored_mmeb) if scored_mmeb else []
    return scored_mmeb, [name for name in names if name not in mmeb.MMEB_TABLE], omitted, missing


def check_datasets(names, mmeb_dir, image_dir, skip_bad_rows, instructions, allow_any_image_path, log):
    """--check_data=True: every dataset read as the evaluation reads it, every image path checked; -> exit code."""
    problems = []
    for name in names:
        rows, found = read_eval_dataset(os.path.join(mmeb_dir, name), image_dir, True, instructions, allow_any_image_path)
        log("\n".join(found.lines()))
        problems += [f"{name}: {p}" for p in found.problems(skip_bad_rows)]
        if not rows:
            problems.append(f"{name}: no usable rows")
    log(f"check_data: {len(names)} datasets; " + ("the evaluation would run" if not problems else
                                                  "the evaluation would NOT run:\n  " + "\n  ".join(problems)))
    return 1 if problems else 0
