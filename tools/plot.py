"""
tools/plot.py: the project's pictures, drawn with matplotlib: the training curves of train.py runs, the geometry
diagnostics of tools/geometry.py and the retrieval sheets of eval.py and tools/search.py. Each drawing function
returns a matplotlib Figure; save() writes it as a PNG, atomically, and closes it.

    python -m tools.plot out/shapes_stage1 out/shapes_stage2  # out/curves_shapes_stage1+shapes_stage2.png (--out=PATH)
    python -m tools.plot out/shapes_sheet.json                # out/shapes_sheet_sheet_<dataset>.png, one a dataset
                                                              # (an eval.py JSON written with --sheet_queries=N)

training_curves: the CURVES panels of log.jsonl against step, also of a run still going; several run folders
continue one another (Stage II from a step folder of Stage I), a dashed line where each later one begins. A NaN or
inf breaks its curve and is marked with a red x; a spread within float rounding (norms that are all 8) draws flat.
geometry: the random-pair cosine histogram, the standardised log(|q| |c+|) against cos(q, c+) with its r, and the
PCA of the directions coloured by norm percentile (the paper's Figures 2, 4, 7 and 9). retrieval_sheet: each query
with its top results, the gold framed green, a wrong #1 red (eval.py keeps them with --sheet_queries=N).
"""
import json
import math
import os
import sys

import matplotlib
import numpy as np
from PIL import ImageOps

matplotlib.use("Agg")  # headless: files only, no window
import matplotlib.pyplot as plt  # noqa: E402 - after the backend is chosen
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.markers import MarkerStyle  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

import configurator  # noqa: E402
from common import UserError, install_error_hook, replaced_atomically  # noqa: E402
from media import IMAGE_MARKER, load_image  # noqa: E402
from runs.outdir import read_log  # noqa: E402
from tools.geometry import format_number  # noqa: E402

# -----------------------------------------------------------------------------
# config of the command line (every default can be overridden by --key=value)
paths = []  # run folders (their curves) or eval.py JSON files (their retrieval sheets); bare arguments go here
out = ""  # the curves' PNG ('' = beside the runs, curves_<run>+<run>.png)
# -----------------------------------------------------------------------------

CURVES = [  # panel title, the log.jsonl keys it draws, log scale
    ("loss (eq. 7)", ["loss"], False), ("positive's probability", ["pos_prob", "focal_confidence"], False),
    ("focal weights a_i (eq. 5)", ["weight_min", "weight_max"], False),
    ("embedding norms", ["query_norm", "candidate_norm"], False), ("cosine", ["pos_cos", "neg_cos"], False),
    ("learning rate", ["lr"], True), ("gradient norm", ["grad_norm"], True)]
RERANK_CURVES = [  # a reranker's log (train.py objective='rerank'): its scores in place of the vectors' panels
    ("loss (eq. R2)", ["loss"], False), ("positive's probability", ["pos_prob"], False),
    ("scores, eq. (R1)", ["pos_score", "neg_score"], False), ("learning rate", ["lr"], True),
    ("gradient norm", ["grad_norm"], True)]
ROUNDING = 1e-5  # a spread of values within this fraction of their size is float rounding: drawn flat
CELL, GAP, PAD, THUMB = (3.6, 1.3), 0.04, 0.08, 1.1  # retrieval sheet cell, inches: size, gap, padding, thumbnail
TEXT_CHARS, TEXT_LINES, FONT_SIZE = 35, 8, 7  # a cell's monospace text: characters a line, lines, points
GREEN, RED, GREY, LIGHT = "#00aa3c", "#dc1e1e", "#787878", "#e1e1e1"


# -----------------------------------------------------------------------------
# training curves

def curve_records(log_paths):
    """-> (the runs' records on one step axis, [(step, run name)] where each later run begins)."""
    records, marks, offset = [], [], 0
    for k, path in enumerate(log_paths):
        lines = read_log(path)
        if k and lines:
            start = started_from(path, log_paths[k - 1])
            if start is not None:  # cut the run before where this one branched off it
                offset = offset - (records[-1]["step"] if records else 0) + start
                records = [r for r in records if r["step"] <= offset]
            marks.append((offset, os.path.basename(os.path.dirname(os.path.abspath(path)))))
        records += [dict(r, step=r["step"] + offset) for r in lines]
        offset = records[-1]["step"] if records else offset
    return records, marks


def started_from(log_path, earlier_log_path):
    """The step of the earlier run that log_path's run started from (its init_from: a step folder of the earlier
    run's out_dir), or None."""
    config_path = os.path.join(os.path.dirname(log_path), "config.json")
    if not os.path.isfile(config_path):
        return None
    with open(config_path) as f:
        written = json.load(f)
    init_from = os.path.normpath(written.get("config", written).get("init_from", ""))  # {"config", "history"} or flat
    earlier = os.path.basename(os.path.dirname(os.path.abspath(earlier_log_path)))
    name, parent = os.path.basename(init_from), os.path.basename(os.path.dirname(init_from))
    return int(name[len("step_"):]) if name.startswith("step_") and name[5:].isdigit() and parent == earlier else None


def training_curves(log_paths, title=""):
    """train.py's log.jsonl files -> a Figure of one axes per CURVES panel (a reranker's: RERANK_CURVES) against
    step, 4 a row; each file continues the one before (curve_records: from the step its init_from names, else after
    its last step), a dashed line and the run's name where it begins. A line still being written is skipped."""
    records, marks = curve_records(log_paths)
    steps = np.array([r["step"] for r in records], dtype=float)
    panels = RERANK_CURVES if records and all("pos_score" in r for r in records) else CURVES
    rows = math.ceil(len(panels) / 4)
    figure = plt.figure(figsize=(16, 3.2 * rows), layout="constrained")
    for i, (name, keys, log_y) in enumerate(panels):  # one step axis: a panel with no values spans it too
        ax = figure.add_subplot(rows, 4, i + 1, title=name, xlabel="step", sharex=figure.axes[0] if i else None)
        draw_panel(ax, steps, {key: [r.get(key) for r in records] for key in keys}, log_y, marks)
    figure.suptitle(title or " + ".join(log_paths))
    return figure


def draw_panel(ax, steps, series, log_y, marks):
    """One panel: a line per series ({label: values}), None a gap; NaN and inf break it and get a red x at the top;
    on a log scale values <= 0 are left out."""
    drawn, bad = [], set()
    for label, values in series.items():
        y = np.array([np.nan if v is None else v for v in values], dtype=float)
        recorded = np.array([v is not None for v in values], dtype=bool)  # None is absent, not non-finite
        bad.update(steps[recorded & ~np.isfinite(y)].tolist())
        y[~np.isfinite(y) | (log_y & (y <= 0))] = np.nan
        ok = np.pad(np.isfinite(y), 1)
        lone = np.flatnonzero(ok[1:-1] & ~ok[:-2] & ~ok[2:]).tolist()  # a point with no neighbour: no line shows it
        ax.plot(steps, y, label=label, marker="." if lone else None, markevery=lone or None)
        drawn.append(y[np.isfinite(y)])
    if log_y:
        ax.set_yscale("log")
    for step, name in marks:
        ax.axvline(step, color=GREY, linestyle="--", linewidth=1)
        ax.text(step, 0.98, f" {name}", color=GREY, fontsize=8, va="top", transform=ax.get_xaxis_transform())
    if bad:
        ax.plot(sorted(bad), [0.95] * len(bad), "x", color=RED, gid="non-finite", transform=ax.get_xaxis_transform())
        ax.text(0.02, 0.03, f"x: {len(bad)} non-finite", color=RED, fontsize=8, transform=ax.transAxes)
    flatten(ax, np.concatenate([np.zeros(0)] + drawn), log_y)
    if len(series) > 1:
        ax.legend(fontsize=8)


def flatten(ax, values, log_y):
    """Give values room round them when their spread is within float rounding: matplotlib would fill the panel
    with it, and rounding noise would draw as a zig-zag."""
    if len(values) == 0 or np.ptp(values) > ROUNDING * np.abs(values).max():
        return
    middle = float(values.mean())
    room = abs(middle) * 0.1 or 1.0
    ax.set_ylim((middle / 2, middle * 2) if log_y else (middle - room, middle + room))


# -----------------------------------------------------------------------------
# geometry diagnostics

def geometry(numbers, title=""):
    """tools/geometry.py's summary() -> a Figure of three panels: the random-pair cosines, the matched pairs' log
    norm product against cosine, the PCA of the directions by norm percentile."""
    figure = plt.figure(figsize=(16, 5), layout="constrained")
    histogram, pairs, pca = (figure.add_subplot(1, 3, i + 1) for i in range(3))
    cosines = np.asarray(numbers["random_pair_cos"], dtype=float)
    cosines = cosines[np.isfinite(cosines)]
    histogram.hist(cosines, bins=40, range=(-1, 1), density=len(cosines) > 0, histtype="step", linewidth=1.5,
                   label=f"{len(cosines):,} drawn pairs")
    histogram.set(xlim=(-1, 1), xlabel="cos", ylabel="density", title=f"random pairs: mean cos "
                  f"{format_number(numbers['random_pair_mean_cos'], 3)} over all {numbers['num_random_pairs']:,}")
    histogram.legend(fontsize=8)
    norm = format_number(numbers["query_norm"]["mean"])
    pairs.set(title="matched pairs", xlabel="standardised log(|q| |c+|)", ylabel="cos(q, c+)")
    if numbers["all_norms_equal"]:  # no norm to standardise: the points would be rounding noise
        note(pairs, f"all norms {norm}: no norm to standardise")
    else:
        pairs.scatter(numbers["pairs"]["standardised_log_norm_product"], numbers["pairs"]["cos_positive"], s=6,
                      alpha=0.5)
        note(pairs, f"r = {format_number(numbers['norm_cos_pearson_r'])}")
    draw_pca(figure, pca, numbers)
    figure.suptitle(title)
    return figure


def note(ax, text):
    """text in the top-left corner of ax."""
    ax.text(0.02, 0.97, text, va="top", fontsize=9, transform=ax.transAxes)


def draw_pca(figure, ax, numbers):
    """The PCA panel: one point a sampled embedding, a circle a query, a triangle a candidate, in a seeded shuffled
    order (no kind always on top), coloured by norm percentile with a colour bar unless every norm is equal."""
    pca, r2 = numbers["pca"], numbers["norm_from_direction_r2"]
    explained = list(numbers["pca_explained_variance"]) + [0.0, 0.0]  # fewer than 2 components when D < 2
    x, y, is_query = np.asarray(pca["x"], float), np.asarray(pca["y"], float), np.asarray(pca["is_query"], bool)
    order = np.random.default_rng(0).permutation(len(x))
    percentile = pca["norm_percentile"]
    colour = {"color": "tab:blue"} if percentile is None else {
        "c": np.asarray(percentile, float)[order], "cmap": "coolwarm", "vmin": 0.0, "vmax": 1.0}
    points = ax.scatter(x[order], y[order], s=14, **colour)
    points.set_paths([marker_path("o" if q else "^") for q in is_query[order]])  # one collection, two shapes
    if percentile is None:
        note(ax, f"all norms {format_number(numbers['query_norm']['mean'])}")
    else:
        figure.colorbar(points, ax=ax, label="norm percentile")
    ax.legend(handles=[Line2D([], [], marker=m, linestyle="", color=GREY, label=label)
                       for m, label in (("o", "query"), ("^", "candidate"))], fontsize=8, loc="lower right")
    ax.set_aspect("equal", adjustable="datalim")
    ax.set(xlabel=f"PC1 {100 * explained[0]:.0f}%", ylabel=f"PC2 {100 * explained[1]:.0f}%",
           title=f"PCA; norm from direction R^2 {format_number(r2['2'])} (k=2), {format_number(r2['10'])} (k=10)")


def marker_path(marker):
    """The path of a matplotlib marker ("o", "^") at unit size, for a PathCollection."""
    style = MarkerStyle(marker)
    return style.get_path().transformed(style.get_transform())


# -----------------------------------------------------------------------------
# retrieval sheets

def retrieval_sheet(rows, title=""):
    """[{"query", "results"}] -> a Figure of one row of cells a query: its cell, then its results in rank order; a
    result with gold True framed green, a wrong #1 red. Results without a "gold" key (a search with no known
    answer) are not judged: no frames, no note."""
    k = max([len(row["results"]) for row in rows], default=0)
    band = 0.4 if title else 0.0  # inches above the cells for the title
    figure = plt.figure(figsize=((k + 1) * CELL[0], max(len(rows), 1) * CELL[1] + band))
    for r, row in enumerate(rows):
        results = row["results"]
        judged, found = any("gold" in x for x in results), any(x.get("gold") for x in results)
        draw_cell(figure, (r, 0, band), row["query"], "query", (GREY, 1), f"query {r}",
                  f"gold not in top {len(results)}" if judged and not found else "")
        for rank, result in enumerate(results, 1):
            frame = (GREEN, 3) if result.get("gold") else (RED, 3) if rank == 1 and judged else (LIGHT, 1)
            draw_cell(figure, (r, rank, band), result, f"#{rank}  {float(result['score']):.2f}", frame,
                      f"query {r} #{rank}")
    if title:
        figure.suptitle(title, y=1 - band / 2 / figure.get_figheight(), va="center")
    return figure


def draw_cell(figure, place, item, header, frame, label, red_note=""):
    """A sheet cell at place (row, column, inches of title band above the rows): an axes labelled label, framed
    (colour, width), its data units inches; the item's thumbnail, the header, the red note and the wrapped text
    without the image marker. -> the axes"""
    (row, column, band), (width, height) = place, figure.get_size_inches()
    w, h = CELL[0] - 2 * GAP, CELL[1] - 2 * GAP
    left, bottom = column * CELL[0] + GAP, height - band - (row + 1) * CELL[1] + GAP
    rect = (left / width, bottom / height, w / width, h / height)
    ax = figure.add_axes(rect, label=label, xlim=(0, w), ylim=(0, h), xticks=[], yticks=[])
    for spine in ax.spines.values():
        spine.set(edgecolor=frame[0], linewidth=frame[1])
    extent = (PAD, PAD + THUMB, h - PAD - THUMB, h - PAD)
    if item.get("image") is not None:
        picture = thumbnail(item["image"], round(THUMB * figure.dpi))
        if picture is None:
            ax.add_patch(Rectangle(extent[::2], THUMB, THUMB, color=GREY))
            ax.text(PAD + THUMB / 2, h - PAD - THUMB / 2, "unreadable", color="white", ha="center", va="center")
        else:
            ax.imshow(np.asarray(picture), extent=extent, aspect="auto")
    x, top, line = 2 * PAD + THUMB, h - PAD, FONT_SIZE * 1.25 / 72
    lines = [(header, "black", "bold")] + ([(red_note, RED, "normal")] if red_note else [])
    text = (item.get("text") or "").replace(IMAGE_MARKER, "").strip()  # the picture is shown, not its marker
    lines.append((wrap(text, TEXT_CHARS, TEXT_LINES - len(lines)), "black", "normal"))
    for i, (words, colour, weight) in enumerate(lines):
        ax.text(x, top - i * line, words, color=colour, weight=weight, family="monospace", fontsize=FONT_SIZE,
                va="top", linespacing=1.25)
    return ax


def thumbnail(image, size):
    """image (a path or a PIL image) as the model sees it (media.load_image: upright, RGB, transparency on white),
    fitted into a white size x size square, aspect kept; None when it cannot be read."""
    try:
        return ImageOps.pad(load_image(image), (size, size), color="white")
    except ValueError:  # load_image's: missing, unreadable, not an image, over Pillow's pixel limit
        return None


def wrap(text, width, max_lines):
    """text in at most max_lines lines of at most width characters, joined by newlines; the last line ends in
    '...' when text is cut, and a word longer than a line is broken."""
    words, lines = text.split(), []
    while words and len(lines) <= max_lines:
        line = words.pop(0)
        while words and len(line) + 1 + len(words[0]) <= width:
            line += " " + words.pop(0)
        if len(line) > width:
            line, words = line[:width], [line[width:]] + words
        lines.append(line)
    if words or len(lines) > max_lines:
        lines = lines[:max_lines]
        lines[-1] = lines[-1][:width - 3] + "..."
    return "\n".join(lines)


def save(figure, path):
    """Write figure to path as a PNG, atomically (common.replaced_atomically: never half a picture), and close
    it. -> path"""
    path = os.fspath(path)
    try:
        with replaced_atomically(path) as tmp:
            figure.savefig(tmp, format="png", dpi=100)
    finally:
        plt.close(figure)
    return path


# -----------------------------------------------------------------------------
# the command line

def draw_curves(folders, path):
    """The curves of run folders, each continuing the one before, into path ('' = beside the last,
    curves_<run>+<run>.png). -> the path"""
    for folder in folders:
        if not os.path.isfile(os.path.join(folder, "log.jsonl")):
            raise UserError(f"{folder}: no such folder" if not os.path.isdir(folder) else f"{folder}: no log.jsonl in "
                            "it: not a train.py out_dir, or its run has logged no step yet")
    logs = [os.path.join(folder, "log.jsonl") for folder in folders]
    empty = [log for log in logs if not read_log(log)]
    for log in empty:
        print(f"warning: {log} holds no step yet (a run that has just started, or was cut before its first step)")
    if len(empty) == len(logs):
        raise UserError("nothing to draw: every log.jsonl is empty")
    names = "+".join(os.path.basename(os.path.abspath(folder)) for folder in folders)
    default = os.path.join(os.path.dirname(os.path.abspath(folders[-1])), f"curves_{names}.png")
    return drew(save(training_curves(logs), path or default))


def draw_sheets(path):
    """The retrieval sheets an eval.py JSON holds, one a dataset, into <stem>_sheet_<dataset>.png. -> the paths"""
    try:
        with open(path) as f:
            output = json.load(f)
    except OSError as error:
        raise UserError(f"{path}: cannot read it ({error.strerror})") from None
    except ValueError as error:
        raise UserError(f"{path}: not JSON ({error})") from None
    sections = [output, output.get("others", {})] if isinstance(output, dict) else []
    results = {name: result for section in sections for name, result in section.get("datasets", {}).items()}
    sheets = {name: result["sheet"] for name, result in results.items()
              if isinstance(result, dict) and isinstance(result.get("sheet"), list)}
    if not sheets:
        raise UserError(f"{path}: no retrieval sheets in it: run eval.py with --sheet_queries=N")
    stem = os.path.splitext(path)[0]
    return [drew(save(retrieval_sheet(rows, title=f"{name}: top {max([len(x['results']) for x in rows], default=0)}"),
                      f"{stem}_sheet_{name}.png")) for name, rows in sheets.items()]


def drew(path):
    """Say that path was drawn. -> path"""
    print(f"drew {path}")
    return path


def main(argv=None):
    """python -m tools.plot PATH ...: the curves of the run folders among paths (one picture, each run continuing
    the one before) and the retrieval sheets of the eval.py JSON files. -> the paths drawn"""
    configurator.configure(globals(), sys.argv[1:] if argv is None else argv, positional="paths")
    if not paths:
        raise UserError("name run folders or eval.py results: python -m tools.plot out/run [out/run2 ...] or "
                        "python -m tools.plot out/eval.json (--help for more)")
    folders = [p for p in paths if not p.endswith(".json")]
    drawn = [draw_curves(folders, out)] if folders else []
    for path in (p for p in paths if p.endswith(".json")):
        drawn += draw_sheets(path)
    return drawn


if __name__ == "__main__":
    install_error_hook()
    main()
