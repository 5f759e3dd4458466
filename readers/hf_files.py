"""
readers/hf_files.py: a Hugging Face dataset repo as `huggingface-cli download --repo-type dataset` leaves it on
disk, read as datasets.load_dataset(repo, config, split=...) would choose its files, without the datasets library:
its README.md's YAML `configs:` (data_files per config and split) when it has them, else the config a folder or
file stem and the split a word of the file's folders or name. Rows come from Parquet, JSON arrays or JSON Lines.

    files, how = annotation_files("data/MMEB-V2/annotations/EgoSchema", "Subset", "test")
    for path, location, record in rows(files, columns=("question", "answer")):
        ...   # a record is a dict, or a readers.records.BadRow for a row that does not parse
"""
import glob
import json
import os
import re

import yaml

from common import UserError
from readers.records import BadRow, is_junk, json_error, json_lines, read_records

DATA_SUFFIXES = (".parquet", ".json", ".jsonl")
SPLIT_WORDS = {"train": ("train", "training"), "test": ("test", "testing", "eval", "evaluation"),
               "validation": ("validation", "valid", "val", "dev")}  # Hugging Face's words for its splits


def split_group(word):
    return next((group for group, words in SPLIT_WORDS.items() if word.lower() in words), None)


def data_files(folder):
    """Every .parquet/.json/.jsonl under folder, as paths relative to it ('/'-separated), sorted; hidden folders
    (huggingface-cli's .cache/) and files never count."""
    found = []
    for top, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not is_junk(d))
        found += [os.path.relpath(os.path.join(top, f), folder).replace(os.sep, "/") for f in files
                  if f.endswith(DATA_SUFFIXES) and not is_junk(f)]
    return sorted(found)


def readme_configs(folder):
    """The `configs:` list of folder/README.md's YAML header, or None when it has none."""
    path = os.path.join(folder, "README.md")
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8", errors="replace") as f:
        header = re.match(r"---[ \t]*\n(.*?)\n---[ \t]*(\n|$)", f.read(), re.DOTALL)
    if not header:
        return None
    try:
        meta = yaml.safe_load(header.group(1))
    except yaml.YAMLError as error:
        raise UserError(f"{path}: its YAML header does not parse: {error}") from None
    configs = meta.get("configs") if isinstance(meta, dict) else None
    return configs if isinstance(configs, list) and configs else None


def readme_files(folder, configs, config, split):
    """A config's split as README configs name it: data_files as {split, path} entries, a dict or one pattern
    (then the split is 'train'); patterns are globs relative to folder."""
    readme = os.path.join(folder, "README.md")
    named = {c.get("config_name", "default"): c for c in configs if isinstance(c, dict)}
    if config:
        chosen = named.get(config)
    else:  # load_dataset(repo) without a config: the one marked default, or named default, or the only one
        marked = [c for c in named.values() if c.get("default")]
        only = next(iter(named.values())) if len(named) == 1 else None
        chosen = marked[0] if marked else named.get("default") or only
    if chosen is None:
        raise UserError(f"{readme} has no config {config or 'default'!r} (its configs: {', '.join(named)})")
    entries = chosen.get("data_files")
    if isinstance(entries, dict):
        entries = [{"split": s, "path": p} for s, p in entries.items()]
    elif isinstance(entries, str) or (isinstance(entries, list) and all(isinstance(e, str) for e in entries)):
        entries = [{"split": "train", "path": entries}]
    if not isinstance(entries, list) or not all(isinstance(e, dict) and "path" in e for e in entries):
        raise UserError(f"{readme}: config {config or 'default'!r} has no data_files this reader understands")
    chosen_entries = [e for e in entries if e.get("split", "train") == split] or \
        [e for e in entries if split_group(str(e.get("split", "train"))) == split_group(split)]
    if not chosen_entries:
        splits = ", ".join(str(e.get("split", "train")) for e in entries)
        raise UserError(f"{readme}: config {config or 'default'!r} has no split {split!r} (it has {splits})")
    files = []
    for entry in chosen_entries:
        for pattern in [entry["path"]] if isinstance(entry["path"], str) else entry["path"]:
            matches = sorted(glob.glob(os.path.join(glob.escape(folder), pattern), recursive=True))
            files += [m for m in matches if m.endswith(DATA_SUFFIXES) and m not in files]
    if not files:
        raise UserError(f"{readme}: config {config or 'default'!r} split {split!r}: no file matches "
                        f"{[e['path'] for e in chosen_entries]}")
    return files


def fallback_files(folder, config, split):
    """A config's split without README configs: the config a folder or file stem of the path (or, for
    'test_1k', a stem ending in _test_1k), the split a word of its folders or file name; a config with no split
    words in its paths is one split, read whole."""
    paths = data_files(folder)
    if config:
        def in_config(path):
            *folders, name = path.split("/")
            stem = name.rsplit(".", 1)[0]
            return config in folders or stem == config or stem.endswith(("_" + config, "-" + config))
        paths = [p for p in paths if in_config(p)]
        if not paths:
            raise UserError(f"{folder}: no files of config {config!r} (no README.md configs, and no folder or file "
                            f"named {config})")

    def splits(path):
        *folders, name = path.split("/")
        words = folders + re.findall(r"[A-Za-z]+", name.rsplit(".", 1)[0])
        return {split_group(w) for w in words} - {None}
    wanted = split_group(split) or split
    chosen = [p for p in paths if wanted in splits(p)]
    if not chosen and not any(splits(p) for p in paths):
        chosen = paths
    if not chosen:
        found = sorted({s for p in paths for s in splits(p)})
        raise UserError(f"{folder}: no {split!r} files for config {config or 'default'!r} (its files are of the "
                        f"splits {', '.join(found)})")
    return [os.path.join(folder, p) for p in chosen]


def annotation_files(folder, config, split):
    """The files of one config and split of an annotation download, in order. -> (paths, how they were chosen)"""
    configs = readme_configs(folder)
    if configs:
        return readme_files(folder, configs, config, split), "README.md configs"
    return fallback_files(folder, config, split), "folder and file names"


def json_records(path):
    """(location, record) of a .json file: a JSON array of objects, or JSON Lines (readers.records.json_lines)."""
    with open(path, "rb") as f:
        first = next((byte for byte in iter(lambda: f.read(1), b"") if not byte.isspace()), b"")
        data = f.read() if first == b"[" else None  # after the "[": an array is read whole, lines one by one
    if data is None:
        yield from json_lines(path)
        return
    data = first + data
    try:
        records = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise UserError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from None
    except json.JSONDecodeError as error:
        raise UserError(f"{path}: not a JSON array ({json_error(error, line=True)})") from None
    except RecursionError:
        raise UserError(f"{path}: not a JSON array (nested too deep to read)") from None
    for k, record in enumerate(records):
        yield f"row {k}", record if isinstance(record, dict) else BadRow(None, "not a JSON object", "not JSON")


def rows(files, columns, limit=None):
    """(file, location, record) of every row of files in order, at most limit of them."""
    count = 0
    for path in files:
        for location, record in json_records(path) if path.endswith(".json") else read_records(path, columns):
            if limit is not None and count >= limit:
                return
            count += 1
            yield path, location, record

