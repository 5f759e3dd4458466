"""
bench/startup.py: the start-up figures' data and their measuring processes: a synthetic download in mmE5's real
layout (20 Parquet subsets, list-literal negatives, empty image files) beside LLaVA-Hound's video captions (JSON
Lines, a folder of empty frame files a video), converted into the prepared table once, then training starts on it as
the ranks of a run, each in a process of its own, and --check_data=True on the cached table. bench.py's section 7.

    root = mmE5_download("/tmp/mmE5", 200_000, num_negatives=5, seed=0)        # Parquet subsets and empty images
    videos = video_download("/tmp/mmE5", 30_000, seed=0)                        # the video source's train_data entry
    row = startup_figures(200_000, num_negatives=5, seed=0)                     # converting both, then starting
    python -m bench.startup start TRAIN_DATA IMAGE_DIR TABLE_DIR 5 256 1337 1   # one rank's start (JSON line)
"""
import contextlib
import io
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time

import pyarrow as pa
import pyarrow.parquet as pq

import common
import data
from media import IMAGE_MARKER
from readers import mmeb
from readers import training

WORDS = "the a red green blue small large image shows photo of on in at left right question answer caption".split()

SUBSETS = mmeb.TRAIN_SUBSETS  # MMEB-train's 20 (mmE5-MMEB-hardneg has these and four more)
REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # where python -m bench.startup runs
VIDEO_SHARE = 300_000 / 2_030_000  # VLM2Vec-V2's 300k captioned videos beside the paper's 2.03M image rows


def mmE5_download(folder, num_rows, num_negatives, seed, images_per_subset=1000):
    """num_rows rows over the 20 subsets of mmE5-MMEB-hardneg as a user has them: folder/mmE5-MMEB-hardneg/<Subset>/
    train-00000-of-00001.parquet with qry, qry_image_path, pos_text, pos_image_path and the negatives as strings
    holding Python list literals ('' for an image negative's text, or for a text negative's image), image paths
    images/<Subset>/Train/<file> under folder, which holds that many (empty) image files a subset: only their
    existence is read at load time. Half the subsets are image -> text (text negatives), half text -> image.
    -> the download's root"""
    rng, root = random.Random(seed), os.path.join(folder, "mmE5-MMEB-hardneg")
    for s, subset in enumerate(SUBSETS):
        images = os.path.join(folder, "images", subset, "Train")
        os.makedirs(images, exist_ok=True)
        for k in range(images_per_subset):
            open(os.path.join(images, f"{subset}_image_{k}.jpg"), "wb").close()
        path = lambda: f"images/{subset}/Train/{subset}_image_{rng.randrange(images_per_subset)}.jpg"  # noqa: E731
        words = lambda n: " ".join(rng.choice(WORDS) for _ in range(n))  # noqa: E731
        count = num_rows // len(SUBSETS) + (s < num_rows % len(SUBSETS))
        to_text = s % 2 == 0
        columns = {"qry": [], "qry_image_path": [], "pos_text": [], "pos_image_path": [], "neg_text": [],
                   "neg_image_path": []}
        for _ in range(count):
            if to_text:  # an image query, text candidates
                row = [f"{IMAGE_MARKER}\nRepresent the given image with the following question: {words(12)}\n",
                       path(), words(6), "", repr([words(6) for _ in range(num_negatives)]), repr([""] * num_negatives)]
            else:  # a text query, image candidates
                row = [f"Find me an everyday image that matches the given caption: {words(14)}\n", "",
                       f"{IMAGE_MARKER}\nRepresent the given image.\n", path(), repr([""] * num_negatives),
                       repr([path() for _ in range(num_negatives)])]
            for key, value in zip(columns, row):
                columns[key].append(value)
        os.makedirs(os.path.join(root, subset), exist_ok=True)
        pq.write_table(pa.table(columns), os.path.join(root, subset, "train-00000-of-00001.parquet"))
    return root


def video_download(folder, num_rows, seed, videos=1000, frames=8):
    """num_rows rows of LLaVA-Hound's video_caption_300k.jsonl as a user has it ({id, video, conversations}), each
    naming one of `videos` folders of `frames` empty frame files (only the listing is read at conversion). -> the
    train_data entry that reads it (parser llavahound_caption)."""
    rng, frames_dir = random.Random(seed), os.path.join(folder, "video", "train_300k")
    for k in range(videos):
        os.makedirs(os.path.join(frames_dir, f"v_{k}"))
        for t in range(1, frames + 1):
            open(os.path.join(frames_dir, f"v_{k}", f"frame_{t}.jpg"), "wb").close()
    path = os.path.join(folder, "video", "video_caption_300k.jsonl")
    with open(path, "w") as f:
        for i in range(num_rows):
            caption = " ".join(rng.choice(WORDS) for _ in range(30))
            f.write(json.dumps({"id": str(i), "video": f"v_{rng.randrange(videos)}", "conversations": [
                {"from": "human", "value": "<video>\nDescribe the video in detail."},
                {"from": "gpt", "value": caption}]}) + "\n")
    return {"path": path, "parser": "llavahound_caption", "image_dir": frames_dir}


def memory():
    """(anonymous resident bytes, file-backed resident bytes) of this process (/proc/self/status): the first is
    what a process holds of its own; the second, pages of mapped files, the page cache shares between processes."""
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return tuple(int(fields[key].split()[0]) * 1024 for key in ("RssAnon", "RssFile"))


def measure_conversion(train_data, image_dir, table_dir):
    """In a process of its own (python -m bench.startup convert TRAIN_DATA IMAGE_DIR TABLE_DIR, train_data as JSON):
    the conversion of the downloads into the prepared table, as the first start does it; one JSON line: rows,
    seconds, the growth of the resident memory to its peak (the conversion's alone), the table's bytes."""
    with open("/proc/self/statm") as f:
        before = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        path = training.prepared_table(json.loads(train_data), image_dir, table_dir)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    print(json.dumps({"rows": len(data.TrainTable(path)), "seconds": seconds, "peak_growth": peak - before,
                      "table_bytes": os.path.getsize(path)}))


def measure_start(train_data, image_dir, table_dir, num_negatives, batch_size, seed, mixture=0):
    """In a process of its own (python -m bench.startup start ...), one of several started at once, as the ranks
    of a run: what train.py does with the data before its first step, on a table already converted: find and open
    the table, check the reports, print them, build the sampler and read its first batch's rows (the fill
    included; images and frames are decoded by the workers, not here). mixture: its subsets (the 20 image ones and
    the video one) as the sources of a weighted mixture (weights 1, 2, 3 in turn) in same-source groups of 16
    queries on rank 3 of 8, resumed half way through its first epoch (the draws before it replayed). One JSON line:
    seconds, the private (anonymous) memory it grew by, the file pages it holds (shared with every other rank)."""
    private, shared = memory()
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        table = data.TrainTable(training.prepared_table(json.loads(train_data), image_dir, table_dir))
        problems = training.problems(table.subsets, num_negatives, False)
        print("\n".join(training.report_lines(table.subsets, num_negatives)))
    if mixture:
        sources = [{"ranges": [(s["start"], s["stop"])], "weight": 1 + k % 3} for k, s in enumerate(table.subsets)]
        sampler = data.MixtureSampler(sources, batch_size, 3, 8, seed, 16)
        sampler.position = sampler.batches_per_epoch // 2
    else:
        sampler = data.ShardedBatchSampler(len(table), batch_size, seed=seed)
    rows = [data.row_with_negatives(table, i, num_negatives, seed) for i in next(iter(sampler))]
    seconds = time.perf_counter() - start
    after_private, after_shared = memory()
    print(json.dumps({"rows": len(table), "seconds": seconds, "private_growth": after_private - private,
                      "file_resident": after_shared - shared, "problems": len(problems), "batch_rows": len(rows)}))


def measure_check(train_data, image_dir, table_dir, num_negatives):
    """In a process of its own (python -m bench.startup check ...): train.py's --check_data=True on a table already
    converted: find and open the table, look up every image and video folder it names
    (readers.training.subsets_on_disk), check and print the reports. One JSON line: rows, seconds, bad rows."""
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        table = data.TrainTable(training.prepared_table(json.loads(train_data), image_dir, table_dir))
        subsets = training.subsets_on_disk(table)
        problems = training.problems(subsets, num_negatives, False)
        print("\n".join(training.report_lines(subsets, num_negatives)))
    seconds = time.perf_counter() - start
    print(json.dumps({"rows": len(table), "seconds": seconds, "bad": sum(sum(s["bad"].values()) for s in subsets),
                      "problems": len(problems)}))


def start_process(*args):
    """python -m bench.startup ARGS, started in a process of its own (read it with last_json_line)."""
    return subprocess.Popen([sys.executable, "-m", "bench.startup", *map(str, args)], cwd=REPOSITORY,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def last_json_line(process):
    """The JSON line a start_process() process printed last, once it ends; its error output if it failed."""
    stdout, stderr = process.communicate()
    if process.returncode:
        raise RuntimeError(f"{' '.join(process.args[2:4])} failed: {stderr[-2000:]}")
    return json.loads(stdout.strip().splitlines()[-1])


def startup_figures(num_rows, num_negatives, seed, images_per_subset=1000, ranks=2, batch_size=256, paper=2_030_000):
    """The bench's start-up row: num_rows rows of mmE5_download and num_rows * 300k / 2.03M of video_download
    converted into the prepared table (once, as the first start does), then `ranks` training starts at once on it,
    each in a process of its own, then --check_data=True's look-up of every image and video folder on the cached
    table; per row and extrapolated to the paper's rows plus 300k videos (linearly: an upper bound for the start,
    which reads the table's description and one batch's rows)."""
    with tempfile.TemporaryDirectory(prefix="pace_startup_") as folder:
        images = min(images_per_subset, max(10, num_rows // len(SUBSETS)))  # a subset's: at most one a row
        video_rows = max(1, round(num_rows * VIDEO_SHARE))
        entries = [mmE5_download(folder, num_rows, num_negatives, seed, images),
                   video_download(folder, video_rows, seed, videos=min(1000, video_rows))]
        root, tables = json.dumps(entries), os.path.join(folder, "tables")
        conversion = last_json_line(start_process("convert", root, folder, tables))
        starts = {}
        for mixture in (0, 1):  # all at once, as the ranks of a run: plain, then a weighted homogeneous mixture
            processes = [start_process("start", root, folder, tables, num_negatives, batch_size, seed, mixture)
                         for _ in range(ranks)]
            starts[mixture] = [last_json_line(process) for process in processes]
        check = last_json_line(start_process("check", root, folder, tables, num_negatives))
    rows, scale = conversion["rows"], paper * (1 + VIDEO_SHARE) / conversion["rows"]
    start_s, private = max(s["seconds"] for s in starts[0]), max(s["private_growth"] for s in starts[0])
    mixture_s, mixture_private = max(s["seconds"] for s in starts[1]), max(s["private_growth"] for s in starts[1])
    return {"name": "startup", "rows": rows, "video_rows": video_rows, "ranks": ranks,
            "image_files": images * len(SUBSETS), "video_folders": min(1000, video_rows),
            "conversion_rows_per_s": rows / conversion["seconds"],
            "conversion_peak_growth_bytes_per_row": conversion["peak_growth"] / rows,
            "table_bytes_per_row": conversion["table_bytes"] / rows, "start_s": start_s,
            "start_private_bytes": private, "start_file_resident_bytes": max(s["file_resident"] for s in starts[0]),
            "mixture_start_s": mixture_s, "mixture_start_private_bytes": mixture_private,
            "paper_mixture_start_s_at_most": mixture_s * scale,
            "paper_mixture_start_private_mb_at_most": mixture_private * scale / 2**20,
            "check_data_s": check["seconds"], "check_data_rows_per_s": rows / check["seconds"],
            "check_data_bad": check["bad"], "paper_rows": paper, "paper_video_rows": round(paper * VIDEO_SHARE),
            "paper_conversion_s": scale * conversion["seconds"], "paper_check_data_s": scale * check["seconds"],
            "paper_start_s_at_most": start_s * scale, "paper_start_private_mb_at_most": private * scale / 2**20,
            "paper_table_gb": scale * conversion["table_bytes"] / 2**30}


if __name__ == "__main__":  # bench.py's worker processes; by hand, it says what it is
    if sys.argv[1:2] not in (["convert"], ["check"], ["start"]):
        common.library_help(__doc__, sys.argv[1:])
    if sys.argv[1] == "convert":
        measure_conversion(*sys.argv[2:5])
    elif sys.argv[1] == "check":
        measure_check(*sys.argv[2:5], int(sys.argv[5]))
    else:
        measure_start(*sys.argv[2:5], *map(int, sys.argv[5:9]))
