"""
plot.py: every picture the project draws, drawn with Pillow (no plotting library). Each function returns an RGB
PIL.Image.Image on white, so callers can put pictures side by side (grid) and write them (save).

    import plot
    curves = plot.line_panels([{"title": "loss", "series": [{"label": "train", "x": steps, "y": losses}],
                                "marks": [(1000, "Stage II")]}], title="shapes")
    pca = plot.scatter(xs, ys, colour=percentiles, equal_axes=True, title="PCA", note="r = -0.78")
    plot.save(plot.grid([curves, pca], columns=2, titles=["curves", "PCA"]), "out/figures/run.png")

line_panels: training curves against step (training_curves reads them from train.py's log.jsonl).
scatter: log norm product vs cosine, PCA pictures. histogram: cosine distributions of several models.
retrieval_sheet: what an embedder retrieves. NaN and inf values are skipped (a curve breaks there, and its
panel marks the steps with a red x); empty, constant and single-point data draw without error.

The curves of any run, also one still going; several out_dirs continue one another (Stage I, then II):

    python plot.py out/shapes_stage1 out/shapes_stage2   # -> out/curves_shapes_stage1+shapes_stage2.png (--out=PATH)
"""
import math
import os
import sys

import numpy as np
from PIL import Image, ImageDraw, ImageFont, ImageOps

import runs
from common import UserError, install_error_hook, replaced_atomically
from mmeb import IMAGE_MARKER
from model import load_image

FONT = ImageFont.load_default()  # built into Pillow: no font file to find
TITLE_HEIGHT = 24  # band at the top of a figure that has a title
MARGINS = (46, 20, 10, 18)  # left, top, right, bottom: room round a line panel's plot area for its labels
PAD, LINE_HEIGHT, MAX_LINES, FRAME = 6, 12, 6, 4  # retrieval_sheet cells
WHITE, BLACK, GREY, LIGHT = (255, 255, 255), (0, 0, 0), (120, 120, 120), (225, 225, 225)
GREEN, RED, BLUE = (0, 170, 60), (220, 30, 30), (40, 80, 210)
PALETTE = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (148, 103, 189), (140, 86, 75),
           (227, 119, 194), (23, 190, 207), (188, 189, 34)]


# -----------------------------------------------------------------------------
# numbers to pixels

def segments(x, y, log_y=False):
    """The runs of finite (x, y) pairs between the pairs holding None, NaN or inf: a curve is never drawn across
    a gap. -> list of (n, 2) arrays"""
    n = min(len(x), len(y))
    xy = np.column_stack([np.asarray(x, dtype=float)[:n], np.array([np.nan if v is None else v for v in y[:n]],
                                                                     dtype=float)])
    if log_y:
        xy[:, 1] = np.log10(np.where(xy[:, 1] > 0, xy[:, 1], np.nan))
    good = np.isfinite(xy).all(axis=1)
    cuts = np.flatnonzero(np.diff(np.concatenate([[0], good.astype(int), [0]])))  # starts and ends of the runs
    return [xy[a:b] for a, b in zip(cuts[::2], cuts[1::2])]


def non_finite_steps(x, y):
    """The x of the pairs whose y is NaN or inf (a value that was recorded as such; None, absent, is not one)."""
    return [float(a) for a, b in zip(x, y) if b is not None and not math.isfinite(b)]


def padded_range(values, pad=0.05):
    """(low, high) of values widened by pad of the span; no span (one value, none, or a spread within float32
    rounding of the values, such as norms that are all 8) gets room round it, so rounding noise draws flat."""
    if len(values) == 0:
        return 0.0, 1.0
    low, high = float(np.min(values)), float(np.max(values))
    if high - low <= 1e-5 * max(abs(low), abs(high)):
        middle = (low + high) / 2
        room = abs(middle) * 0.1 or 1.0
        return middle - room, middle + room
    return low - pad * (high - low), high + pad * (high - low)


def finite(values):
    """values as a flat float array without its NaN and inf."""
    values = np.asarray(values, dtype=float).ravel()
    return values[np.isfinite(values)]


def nice_ticks(low, high):
    """About four round values (1, 2, 2.5 or 5 times a power of ten apart) between low and high."""
    power = 10.0 ** math.floor(math.log10((high - low) / 4))
    steps = [m * power for m in (1, 2, 2.5, 5, 10)]
    step = min(steps, key=lambda s: abs(math.floor(high / s) - math.ceil(low / s) + 1 - 4))  # nearest 4 ticks
    return [k * step for k in range(math.ceil(low / step), math.floor(high / step) + 1)]


def log_ticks(low, high):
    """Tick positions on a log10 axis: whole powers of ten, or round values when fewer than two fit."""
    powers = [t for t in nice_ticks(low, high) if t == int(t)]
    if len(powers) >= 2:
        return powers
    return [math.log10(v) for v in nice_ticks(10 ** low, 10 ** high) if v > 0]


def compact(v):
    """A short label for a number: 20000, 0.35, 1.2e-05."""
    return str(int(v)) if v == int(v) and abs(v) < 1e6 else f"{v:.3g}"


def scaler(low, high, start, end):
    """A function mapping data values in [low, high] to pixels in [start, end]."""
    return lambda v: start + (v - low) / (high - low) * (end - start)


def ramp(p):
    """The colour of p in [0, 1] (clipped): blue at 0, through purple, to red at 1."""
    p = min(max(float(p), 0.0), 1.0)
    return tuple(round(a + (b - a) * p) for a, b in zip(BLUE, RED))


# -----------------------------------------------------------------------------
# layout and the pieces every picture shares

def grid_size(count, columns, cell_size, title=""):
    """(width, height) of count cells of cell_size, columns per row, plus the title band if titled."""
    rows = max(1, math.ceil(count / columns))  # an empty figure still gets one row of blank cells
    return columns * cell_size[0], rows * cell_size[1] + (TITLE_HEIGHT if title else 0)


def cell_origin(index, columns, cell_size, title=""):
    """Top-left pixel of cell index in a grid_size layout."""
    top = TITLE_HEIGHT if title else 0
    return (index % columns) * cell_size[0], top + (index // columns) * cell_size[1]


def canvas(size, title=""):
    """A white image of size with title centred in the band at its top."""
    image = Image.new("RGB", tuple(size), WHITE)
    if title:
        ImageDraw.Draw(image).text((size[0] / 2, TITLE_HEIGHT / 2), title, fill=BLACK, font=FONT, anchor="mm")
    return image


def axes(draw, area, x_range, y_range, log_y=False):
    """Draw a frame round area with ticks and faint grid lines; return the data-to-pixel maps of x and y."""
    x0, y0, x1, y1 = area
    sx, sy = scaler(*x_range, x0, x1), scaler(*y_range, y1, y0)  # pixel rows grow downwards
    for t in nice_ticks(*x_range):
        draw.line([(sx(t), y1), (sx(t), y1 + 3)], fill=BLACK)
        draw.text((sx(t), y1 + 4), compact(t), fill=BLACK, font=FONT, anchor="mt")
    for t in log_ticks(*y_range) if log_y else nice_ticks(*y_range):
        draw.line([(x0, sy(t)), (x1, sy(t))], fill=LIGHT)
        draw.text((x0 - 3, sy(t)), compact(10 ** t if log_y else t), fill=BLACK, font=FONT, anchor="rm")
    draw.rectangle(area, outline=BLACK)
    return sx, sy


def legend(draw, corner, entries):
    """(label, colour) entries in a box hanging from the top-right corner (x, y); nothing if there are none."""
    if not entries:
        return
    width = max(FONT.getlength(label) for label, _ in entries) + 26
    x, y = corner[0] - width - 4, corner[1] + 4
    draw.rectangle((x, y, x + width, y + LINE_HEIGHT * len(entries) + 4), fill=WHITE, outline=LIGHT)
    for i, (label, colour) in enumerate(entries):
        middle = y + 2 + LINE_HEIGHT * i + LINE_HEIGHT / 2
        draw.line([(x + 4, middle), (x + 18, middle)], fill=colour, width=2)
        draw.text((x + 22, middle), label, fill=BLACK, font=FONT, anchor="lm")


def figure(size, title, x_label, y_label, right=12):
    """A titled canvas for one plot with its axis labels; returns the image, a draw on it and the plot area."""
    image = canvas(size, title)
    draw = ImageDraw.Draw(image)
    area = (60, (TITLE_HEIGHT if title else 4) + 16, size[0] - right, size[1] - 36)
    draw.text((area[0], area[1] - 4), y_label, fill=BLACK, font=FONT, anchor="ld")  # above the y axis
    draw.text(((area[0] + area[2]) / 2, size[1] - 4), x_label, fill=BLACK, font=FONT, anchor="md")
    return image, draw, area


def polyline(draw, pixels, colour):
    """A 2-pixel line through pixels; a lone point is drawn as a dot."""
    if len(pixels) == 1:
        x, y = pixels[0]
        draw.ellipse((x - 2, y - 2, x + 2, y + 2), fill=colour)
    elif pixels:
        draw.line(pixels, fill=colour, width=2)


# -----------------------------------------------------------------------------
# the pictures

def line_panels(panels, columns=3, panel_size=(360, 240), title=""):
    """Panels of curves (e.g. loss against step), row by row, columns panels per row."""
    image = canvas(grid_size(len(panels), columns, panel_size, title), title)
    draw = ImageDraw.Draw(image)
    for i, panel in enumerate(panels):
        left, top = cell_origin(i, columns, panel_size, title)
        draw_panel(draw, (left, top, left + panel_size[0], top + panel_size[1]), panel)
    return image


def draw_panel(draw, box, panel):
    """One panel of line_panels in box: title, axes, dashed marks, one curve per series, legend."""
    left, top, right, bottom = box
    draw.text(((left + right) / 2, top + 4), panel.get("title", ""), fill=BLACK, font=FONT, anchor="mt")
    area = (left + MARGINS[0], top + MARGINS[1], right - MARGINS[2], bottom - MARGINS[3])
    log_y = panel.get("log_y", False)
    series = panel.get("series", [])
    pieces = [segments(s["x"], s["y"], log_y) for s in series]
    bad = sorted({x for s in series for x in non_finite_steps(s["x"], s["y"])})
    marks = [(float(x), label) for x, label in panel.get("marks", []) if math.isfinite(x)]
    pooled = np.concatenate([np.zeros((0, 2))] + [p for curve in pieces for p in curve])
    x_range = padded_range(np.append(pooled[:, 0], [x for x, _ in marks] + bad), pad=0)  # steps span the width
    sx, sy = axes(draw, area, x_range, padded_range(pooled[:, 1]), log_y)
    for x in bad:  # a red x on the bottom edge at each step whose value was NaN or inf
        px, py = sx(x), area[3] - 5
        draw.line([(px - 3, py - 3), (px + 3, py + 3)], fill=RED, width=2)
        draw.line([(px - 3, py + 3), (px + 3, py - 3)], fill=RED, width=2)
    if bad:
        draw.text((area[0] + 4, area[3] - 14), f"x: {len(bad)} non-finite", fill=RED, font=FONT, anchor="ls")
    for x, label in marks:
        for y in range(area[1], area[3], 6):  # dashes: 4 pixels drawn, 2 left out
            draw.line([(sx(x), y), (sx(x), min(y + 3, area[3]))], fill=GREY)
        draw.text((sx(x) + 3, area[1] + 2), label, fill=GREY, font=FONT)
    colours = [PALETTE[i % len(PALETTE)] for i in range(len(pieces))]
    for curve, colour in zip(pieces, colours):
        for piece in curve:
            polyline(draw, [(sx(x), sy(y)) for x, y in piece], colour)
    if len(pieces) > 1:
        legend(draw, (area[2], area[1]), [(s["label"], c) for s, c in zip(series, colours)])


def scatter(x, y, colour=None, marker=None, title="", x_label="", y_label="", note="", size=(420, 380),
            equal_axes=False):
    """Points of y against x, coloured by values in [0, 1] through ramp (with a colour bar), shaped by marker."""
    image, draw, area = figure(size, title, x_label, y_label, right=14 if colour is None else 50)
    n = min(len(x), len(y))  # columns of values: x, y and the colour value (0 when there is none)
    values = np.column_stack([np.asarray(x, dtype=float)[:n], np.asarray(y, dtype=float)[:n],
                              np.zeros(n) if colour is None else np.asarray(colour, dtype=float)[:n]])
    shapes = ["circle"] * n if marker is None else list(marker)
    # a seeded shuffle, so that no class is always drawn on top of the others
    order = [i for i in np.random.default_rng(0).permutation(n) if np.isfinite(values[i]).all()]
    x_range, y_range = padded_range(values[order, 0]), padded_range(values[order, 1])
    if equal_axes:
        x_range, y_range = equalise(x_range, y_range, area)
    sx, sy = axes(draw, area, x_range, y_range)
    for i in order:
        fill = PALETTE[0] if colour is None else ramp(values[i, 2])
        px, py = sx(values[i, 0]), sy(values[i, 1])
        if shapes[i] == "triangle":
            draw.polygon([(px, py - 4), (px - 4, py + 3), (px + 4, py + 3)], fill=fill)
        else:
            draw.ellipse((px - 3, py - 3, px + 3, py + 3), fill=fill)
    if colour is not None:
        colour_bar(draw, area[2] + 12, area[1], area[3])
    draw.text((area[0] + 4, area[1] + 3), note, fill=BLACK, font=FONT)
    return image


def equalise(x_range, y_range, area):
    """Widen the narrower range so that one data unit spans as many pixels across as up."""
    width, height = area[2] - area[0], area[3] - area[1]
    unit = max((x_range[1] - x_range[0]) / width, (y_range[1] - y_range[0]) / height)
    cx, cy = sum(x_range) / 2, sum(y_range) / 2
    return (cx - unit * width / 2, cx + unit * width / 2), (cy - unit * height / 2, cy + unit * height / 2)


def colour_bar(draw, left, top, bottom):
    """A vertical strip of ramp from percentile 0 (bottom) to 100 (top), labelled at both ends."""
    for y in range(top, bottom + 1):
        draw.line([(left, y), (left + 10, y)], fill=ramp((bottom - y) / (bottom - top)))
    draw.text((left + 13, top), "100", fill=BLACK, font=FONT, anchor="lm")
    draw.text((left + 13, bottom), "0", fill=BLACK, font=FONT, anchor="lm")


def histogram(groups, bins=40, value_range=None, title="", x_label="", size=(420, 300)):
    """Outlined density histograms of groups over shared bins; the legend gives each group's mean."""
    image, draw, area = figure(size, title, x_label, "density")
    values = [finite(g["values"]) for g in groups]
    pooled = np.concatenate([np.zeros(0)] + values)
    low, high = padded_range(pooled if value_range is None else value_range, pad=0)
    edges = np.linspace(low, high, bins + 1)
    # counts over group size and bin width: a density, so groups of different sizes compare
    densities = [np.histogram(v, edges)[0] / (max(len(v), 1) * (edges[1] - edges[0])) for v in values]
    peak = max([d.max() for d in densities], default=0.0) * 1.1 or 1.0
    sx, sy = axes(draw, area, (low, high), (0.0, peak))
    colours = [PALETTE[i % len(PALETTE)] for i in range(len(groups))]
    for d, colour in zip(densities, colours):
        # the outline walks the bin edges: up to each bar's height, across it, on to the next
        outline = zip(np.repeat(edges, 2), np.concatenate([[0.0], np.repeat(d, 2), [0.0]]))
        polyline(draw, [(sx(a), sy(b)) for a, b in outline], colour)
    labels = [f"{g['label']} mean {compact(v.mean())}" if len(v) else f"{g['label']} (empty)"
              for g, v in zip(groups, values)]
    legend(draw, (area[2], area[1]), list(zip(labels, colours)))
    return image


def cell_size(thumb, text_width):
    """(width, height) of a retrieval_sheet cell: a thumbnail beside a header line and MAX_LINES of text."""
    return 3 * PAD + thumb + text_width, 2 * PAD + max(thumb, LINE_HEIGHT * (MAX_LINES + 1))


def sheet_size(num_rows, k, thumb=96, text_width=220, title=""):
    """(width, height) of retrieval_sheet for num_rows queries with k results each."""
    return grid_size(num_rows * (k + 1), k + 1, cell_size(thumb, text_width), title)


def retrieval_sheet(rows, thumb=96, text_width=220, title=""):
    """One row per query: its cell, then its results in rank order; the gold framed green, a wrong #1 red. Results
    with no "gold" key at all (a search without a known answer) are not judged: no frames, no note."""
    k = max([len(row["results"]) for row in rows], default=0)
    size = cell_size(thumb, text_width)
    image = canvas(sheet_size(len(rows), k, thumb, text_width, title), title)
    for r, row in enumerate(rows):
        results = row["results"]
        found = any(result.get("gold") for result in results)
        judged = any("gold" in result for result in results)
        left, top = cell_origin(r * (k + 1), k + 1, size, title)
        draw_cell(image, (left, top, left + size[0], top + size[1]), row["query"], thumb, "query", (GREY, 1),
                  "" if found or not judged else f"gold not in top {len(results)}")
        for rank, result in enumerate(results, 1):
            frame = (GREEN, FRAME) if result.get("gold") else (RED, FRAME) if rank == 1 and judged else (LIGHT, 1)
            header = f"#{rank}  {float(result['score']):.2f}"
            x = left + rank * size[0]
            draw_cell(image, (x, top, x + size[0], top + size[1]), result, thumb, header, frame)
    return image


def draw_cell(image, box, item, thumb, header, frame, note=""):
    """One retrieval_sheet cell in box: frame (colour, width), thumbnail, header, red note, wrapped text."""
    left, top, right, bottom = box
    draw = ImageDraw.Draw(image)
    draw.rectangle((left + 1, top + 1, right - 2, bottom - 2), outline=frame[0], width=frame[1])
    if item.get("image") is not None:
        picture = thumbnail(item["image"], thumb)
        if picture is None:
            draw.rectangle((left + PAD, top + PAD, left + PAD + thumb, top + PAD + thumb), fill=GREY)
            draw.text((left + PAD + thumb / 2, top + PAD + thumb / 2), "unreadable", fill=WHITE, font=FONT,
                      anchor="mm")
        else:
            offset = ((thumb - picture.width) // 2, (thumb - picture.height) // 2)  # centred in its square
            image.paste(picture, (left + PAD + offset[0], top + PAD + offset[1]))
    x, text_width = left + 2 * PAD + thumb, right - left - 3 * PAD - thumb
    lines = [(header, BLACK)] + ([(note, RED)] if note else [])
    text = (item.get("text") or "").replace(IMAGE_MARKER, "").strip()  # the picture is shown, not its marker
    lines += [(line, BLACK) for line in wrap(text, text_width, MAX_LINES + 1 - len(lines))]
    for i, (line, fill) in enumerate(lines):
        draw.text((x, top + PAD + i * LINE_HEIGHT), line, fill=fill, font=FONT)


def thumbnail(image, size):
    """image (a path or a PIL image) as the model sees it (model.load_image: upright, 8-bit, transparency on white),
    scaled to fit size x size, aspect kept; None when it cannot be read."""
    try:
        return ImageOps.contain(load_image(image), (size, size))
    except ValueError:  # load_image's UserError: missing, unreadable, not an image, over Pillow's pixel limit
        return None


def wrap(text, width, max_lines):
    """text in lines at most width pixels wide, at most max_lines; the last ends in '...' when text is cut."""
    words, lines = str(text).split(), []
    while words and len(lines) <= max_lines:
        line = words.pop(0)
        while words and FONT.getlength(f"{line} {words[0]}") <= width:
            line += " " + words.pop(0)
        cut = longest_fit(line, width)
        if cut < len(line):  # a word wider than the cell is broken across lines
            line, words = line[:cut], [line[cut:]] + words
        lines.append(line)
    if words or len(lines) > max_lines:
        lines = lines[:max_lines]
        while lines[-1] and FONT.getlength(lines[-1] + "...") > width:
            lines[-1] = lines[-1][:-1]
        lines[-1] += "..."
    return lines


def longest_fit(text, width):
    """How many leading characters of text fit in width pixels (at least one), by bisection."""
    low, high = 1, len(text)
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if FONT.getlength(text[:middle]) <= width else (low, middle - 1)
    return low


def grid(images, columns, titles=None, title=""):
    """images in equal cells (the largest image's size), columns per row, each under its title if titles."""
    band = TITLE_HEIGHT if titles else 0
    size = (max([im.width for im in images], default=1), max([im.height for im in images], default=1) + band)
    sheet = canvas(grid_size(len(images), columns, size, title), title)
    draw = ImageDraw.Draw(sheet)
    for i, im in enumerate(images):
        left, top = cell_origin(i, columns, size, title)
        if titles:
            draw.text((left + size[0] / 2, top + band / 2), titles[i], fill=BLACK, font=FONT, anchor="mm")
        sheet.paste(im.convert("RGB"), (left + (size[0] - im.width) // 2, top + band))
    return sheet


def save(image, path):
    """Write image to path as a PNG, atomically (common.replaced_atomically): never half a picture. -> path"""
    path = os.fspath(path)
    with replaced_atomically(path) as tmp:
        image.save(tmp, format="PNG")
    return path


# -----------------------------------------------------------------------------
# training curves from log.jsonl

CURVES = [  # panel title, the log.jsonl keys it draws, log scale
    ("loss (eq. 7)", ["loss"], False), ("positive's probability", ["pos_prob", "focal_confidence"], False),
    ("focal weights a_i (eq. 5)", ["weight_min", "weight_max"], False),
    ("embedding norms", ["query_norm", "candidate_norm"], False), ("cosine", ["pos_cos", "neg_cos"], False),
    ("learning rate", ["lr"], True), ("gradient norm", ["grad_norm"], True)]


def training_curves(log_paths, title=""):
    """train.py's log.jsonl files -> the CURVES panels against step; each file continues the one before (Stage II
    after Stage I), a dashed line where it begins: at the step of the one before that it started from (its
    config.json's init_from, e.g. Stage I's step_002000), the earlier run's later steps left out; else after
    the earlier run's last step. A line that is not JSON (a run still writing) is skipped."""
    records, marks = runs.curve_records(log_paths)
    steps = [r["step"] for r in records]
    panels = [{"title": name, "log_y": log_y, "marks": marks,
               "series": [{"label": key, "x": steps, "y": [r.get(key) for r in records]} for key in keys]}
              for name, keys, log_y in CURVES]
    return line_panels(panels, columns=4, title=title or " + ".join(log_paths))


def main(argv):
    """python plot.py OUT_DIR [OUT_DIR ...] [--out=PATH]: the training curves of train.py runs, each out_dir
    continuing the one before, into PATH (default: beside the runs, curves_<run>+<run>.png); -> the path written."""
    folders, options = [a for a in argv if not a.startswith("--")], [a for a in argv if a.startswith("--")]
    if not folders or any(not a.startswith("--out=") for a in options):
        raise UserError("usage: python plot.py OUT_DIR [OUT_DIR ...] [--out=PATH]   (each OUT_DIR a train.py out_dir)")
    for folder in folders:
        if not os.path.isfile(os.path.join(folder, "log.jsonl")):
            raise UserError(f"{folder}: no such folder" if not os.path.isdir(folder) else f"{folder}: no log.jsonl in "
                            "it: not a train.py out_dir, or its run has logged no step yet")
    logs = [os.path.join(folder, "log.jsonl") for folder in folders]
    empty = [log for log in logs if not runs.read_log(log)]
    for log in empty:
        print(f"warning: {log} holds no step yet (a run that has just started, or was cut before its first step)")
    if len(empty) == len(logs):
        raise UserError("nothing to draw: every log.jsonl is empty")
    names = "+".join(os.path.basename(os.path.abspath(folder)) for folder in folders)
    default = os.path.join(os.path.dirname(os.path.abspath(folders[-1])), f"curves_{names}.png")
    return save(training_curves(logs), options[-1][len("--out="):] if options else default)


if __name__ == "__main__":
    install_error_hook()
    print(f"drew {main(sys.argv[1:])}")
