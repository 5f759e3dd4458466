"""
Tests of plot.py: sizes are predictable (grid_size, sheet_size), colours land where they should, and
NaN, inf, empty, constant and single-point data draw without error.

    python -m pytest -q tests/test_plot.py
"""
import math
import os

import numpy as np
import pytest
from PIL import Image

import plot
import runs


def pixels(image):
    """image as a (height, width, 3) array."""
    return np.asarray(image.convert("RGB"))


def has_colour(image, colour):
    """Whether some pixel of image is exactly colour."""
    return bool((pixels(image) == colour).all(axis=-1).any())


def curve(label, y):
    """A series of line_panels: y against steps 0, 1, 2, ..."""
    return {"label": label, "x": list(range(len(y))), "y": list(y)}


def test_ticks_are_round_and_labels_compact():
    labels = [plot.compact(v) for v in (1.2e-05, 0.35, 120, 20000, 0.1 + 0.2)]
    assert labels == ["1.2e-05", "0.35", "120", "20000", "0.3"]
    for low, high in [(0, 1), (0, 1990), (-0.05, 1.05), (1e-6, 1.3e-5), (3.5, 4.5), (0, 28)]:
        ticks = plot.nice_ticks(low, high)
        assert 3 <= len(ticks) <= 5 and low <= ticks[0] < ticks[-1] <= high


@pytest.mark.parametrize("title", ["", "seven panels"])
def test_line_panels_size_is_grid_size(title):
    panels = [{"title": f"panel {i}", "series": [curve("a", [1, 2, 3])]} for i in range(7)]
    image = plot.line_panels(panels, columns=3, panel_size=(200, 150), title=title)
    assert image.mode == "RGB"
    assert image.size == plot.grid_size(7, 3, (200, 150), title) == (600, 450 + (plot.TITLE_HEIGHT if title else 0))


def test_line_panels_draw_each_series_in_its_palette_colour():
    image = plot.line_panels([{"title": "loss", "series": [curve(str(i), [i, i + 1, i + 3]) for i in range(3)]}])
    assert all(has_colour(image, colour) for colour in plot.PALETTE[:3])
    assert not has_colour(image, plot.PALETTE[3])


@pytest.mark.filterwarnings("error")  # and without numpy warnings about log(0)
def test_line_panels_survive_bad_data():
    bad = [curve("nan", [math.nan, math.inf, -math.inf, 1.0]), curve("constant", [2.0] * 3), curve("empty", []),
           curve("one point", [5.0])]
    log = [curve("zeros", [0.0, 0.0, -1.0]), curve("lr", [0.0, 1e-5, 2e-5])]
    image = plot.line_panels([{"title": "bad", "series": bad}, {"title": "log", "series": log, "log_y": True},
                              {"title": "nothing", "series": []}], panel_size=(300, 200))
    assert has_colour(image.crop((0, 0, 300, 200)), plot.PALETTE[1])  # the constant series is still drawn


def test_a_mark_draws_a_dashed_line_at_its_step():
    panel, (width, height), (left, top, right, bottom) = {"series": [curve("a", [0.0] * 101)]}, (400, 300), plot.MARGINS
    plain = pixels(plot.line_panels([panel], columns=1, panel_size=(width, height)))
    marked = pixels(plot.line_panels([dict(panel, marks=[(25, "Stage II")])], columns=1, panel_size=(width, height)))

    def dark_rows(a, x):  # rows of the plot area with a dark pixel within a pixel of column x
        band = a[top + 20:height - bottom - 20, x - 1:x + 2].astype(int).sum(axis=-1)
        return int((band < 3 * 200).any(axis=1).sum())
    column = round(left + 0.25 * (width - left - right))  # steps 0..100 span the plot area's width exactly
    assert dark_rows(marked, column) > 0.4 * (height - top - bottom - 40)
    assert dark_rows(plain, column) < 5 and dark_rows(marked, column + 30) < 5


def test_scatter_colour_bar_only_when_coloured_and_bad_data():
    assert plot.ramp(-1) == plot.ramp(0) != plot.ramp(1) == plot.ramp(2)
    assert plot.ramp(0)[2] > plot.ramp(0)[0] and plot.ramp(1)[0] > plot.ramp(1)[2]  # blue low, red high
    coloured = plot.scatter([0, 1, 2], [1, 0, 2], colour=[0.5] * 3, size=(300, 260))
    assert coloured.size == (300, 260)
    assert has_colour(coloured, plot.ramp(0)) and has_colour(coloured, plot.ramp(1))  # the bar's two ends
    single = plot.scatter([0, 1, 2], [1, 0, 2])
    assert single.size == (420, 380) and has_colour(single, plot.PALETTE[0])
    assert not has_colour(single, plot.ramp(0)) and not has_colour(single, plot.ramp(1))  # no bar
    assert plot.scatter([], [], colour=[], equal_axes=True).size == plot.scatter([1, 1], [2, 2], equal_axes=True).size
    bad = plot.scatter([math.nan, 1, 2, 3], [0, math.inf, 3, 4], colour=[0.1, 0.2, math.nan, 1.0],
                       marker=["circle", "triangle", "triangle", "triangle"])
    assert has_colour(bad.crop((0, 0, bad.width - 50, bad.height)), plot.ramp(1))  # the one finite point


def test_scatter_draws_points_in_a_shuffled_order():
    x, colour = [i for i in range(40) for _ in range(2)], [0.0, 1.0] * 40  # each place: a 0 point, then a 1 point
    image = plot.scatter(x, [0.0] * 80, colour=colour)
    points = image.crop((0, 0, image.width - 50, image.height))  # without the colour bar
    assert has_colour(points, plot.ramp(0)) and has_colour(points, plot.ramp(1))  # neither is always on top


def test_equal_axes_put_the_diagonal_at_45_degrees():
    def offset(image):  # pixels from the (0, 0) point to the (1, 1) point, rightwards and upwards
        ys, xs = np.nonzero((pixels(image) == plot.PALETTE[0]).all(axis=-1))
        right = xs > xs.mean()
        return xs[right].mean() - xs[~right].mean(), ys[~right].mean() - ys[right].mean()
    dx, dy = offset(plot.scatter([0.0, 1.0], [0.0, 1.0], size=(420, 300), equal_axes=True))
    assert dx > 100 and abs(dx - dy) <= 1
    dx, dy = offset(plot.scatter([0.0, 1.0], [0.0, 1.0], size=(420, 300)))
    assert dx - dy > 50  # without it each axis fills the plot area


def test_scatter_note_is_written_in_a_top_corner():
    plain, noted = pixels(plot.scatter([0, 1], [0, 1])), pixels(plot.scatter([0, 1], [0, 1], note="r = -0.78"))
    ys, xs = np.nonzero((plain != noted).any(axis=-1))
    assert len(ys) > 20 and ys.max() < 60 and xs.max() < 210


def test_histogram_colours_densities_and_degenerate_groups():
    groups = [{"label": "PACE", "values": np.random.default_rng(0).normal(0.1, 0.1, 500)},
              {"label": "dot", "values": [0.4] * 20 + [math.nan, math.inf]}]
    image = plot.histogram(groups, size=(400, 280), title="cosine")
    assert image.size == (400, 280) and not has_colour(image, plot.PALETTE[2])
    assert has_colour(image, plot.PALETTE[0]) and has_colour(image, plot.PALETTE[1])
    for degenerate in ([{"label": "same", "values": [0.3] * 5}], [{"label": "empty", "values": []}], []):
        assert plot.histogram(degenerate).size == (420, 300)
    assert plot.histogram(groups, value_range=(0.2, 0.2)).size == (420, 300)
    small, large = (plot.histogram([{"label": "a", "values": [0.2, 0.4] * n}], value_range=(0, 1)) for n in (5, 500))
    assert (pixels(small) == pixels(large)).all()  # densities, not counts: the group's size does not show


def result(gold=False, image=None):
    """A result of retrieval_sheet, with text long enough to be cut."""
    return {"text": "a candidate " * 30, "image": image, "score": 1.5, "gold": gold}


def test_retrieval_sheet_layout_frames_and_images(tmp_path):
    blue = tmp_path / "blue.png"
    Image.new("RGB", (40, 80), (0, 0, 255)).save(blue)
    rows = [{"query": {"text": "first", "image": Image.new("RGB", (300, 100), (255, 255, 0))},
             "results": [result(), result(True, str(blue)), result(image=str(tmp_path / "missing.png"))]},
            {"query": {"text": "second", "image": None}, "results": [result(True), result(), result()]},
            {"query": {"text": "third", "image": str(blue)}, "results": [result(), result(), result()]}]
    image = plot.retrieval_sheet(rows, thumb=64, text_width=160, title="sheet")
    width, height = plot.cell_size(64, 160)
    assert image.size == plot.sheet_size(3, 3, 64, 160, "sheet") == (4 * width, 3 * height + plot.TITLE_HEIGHT)

    def cell(row, column):  # the pixels of one cell
        top = plot.TITLE_HEIGHT + row * height
        return pixels(image)[top:top + height, column * width:(column + 1) * width]

    def frame(row, column):  # a pixel on the left side of a cell's frame
        return tuple(cell(row, column)[height // 2, 2])

    def reddish(a):  # the red "gold not in top 3" note
        return bool(((a[..., 0] > 150) & (a[..., 1] < 100) & (a[..., 2] < 100)).any())

    assert frame(0, 2) == plot.GREEN and frame(1, 1) == plot.GREEN  # the gold
    assert frame(0, 1) == plot.RED and frame(2, 1) == plot.RED  # a wrong first result is a miss
    assert frame(1, 2) not in (plot.GREEN, plot.RED) and frame(0, 3) not in (plot.GREEN, plot.RED)
    assert (cell(0, 0) == (255, 255, 0)).all(-1).any() and (cell(0, 2) == (0, 0, 255)).all(-1).any()  # PIL, path
    assert tuple(cell(0, 3)[plot.PAD + 2, plot.PAD + 2]) == plot.GREY  # the unreadable path is a grey box
    assert reddish(cell(2, 0)) and not reddish(cell(0, 0)) and not reddish(cell(1, 0))


def test_grid_puts_each_image_in_its_cell():
    colours = [(255, 0, 0), (0, 255, 0), (0, 0, 255)]
    images = [Image.new("RGB", (50 + 10 * i, 40), colour) for i, colour in enumerate(colours)]
    sheet = plot.grid(images, columns=2, titles=["a", "b", "c"], title="models")
    size = (70, 40 + plot.TITLE_HEIGHT)  # the largest image with its title above it
    assert sheet.size == plot.grid_size(3, 2, size, "models") == (140, 2 * size[1] + plot.TITLE_HEIGHT)
    for i, (image, colour) in enumerate(zip(images, colours)):
        left, top = i % 2 * size[0], plot.TITLE_HEIGHT + i // 2 * size[1]
        below_title = pixels(sheet.crop((left, top + plot.TITLE_HEIGHT, left + size[0], top + size[1])))
        assert (below_title == colour).all(axis=-1).sum() == image.width * image.height  # all of it, in its cell


def test_save_writes_a_whole_png_and_no_temporary_file(tmp_path):
    image = plot.scatter([0, 1], [0, 1], size=(200, 150))
    path = tmp_path / "figures" / "new" / "scatter.png"
    assert plot.save(image, path) == str(path)
    with Image.open(path) as reopened:
        assert reopened.format == "PNG" and reopened.size == (200, 150)
        assert (pixels(reopened) == pixels(image)).all()
    assert [p.name for p in path.parent.iterdir()] == ["scatter.png"]


def test_a_sheet_without_gold_keys_judges_nothing():
    red_in = lambda image: any(pixel == plot.RED for pixel in image.getdata())  # noqa: E731
    unjudged = plot.retrieval_sheet([{"query": {"text": "q", "image": None},
                                      "results": [{"text": "a", "image": None, "score": 1.0}]}])
    judged = plot.retrieval_sheet([{"query": {"text": "q", "image": None},
                                    "results": [{"text": "a", "image": None, "score": 1.0, "gold": False}]}])
    assert not red_in(unjudged) and red_in(judged)  # a wrong #1 is red only when there is a gold to miss


def test_stage_two_curves_start_where_stage_two_branched_off(tmp_path):
    import json
    for name, steps, init_from in (("stage1", range(1, 151), "backbone"), ("stage2", range(1, 51), "out/stage1/step_000100")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "log.jsonl").write_text("".join(json.dumps({"step": s, "loss": 1.0 / s}) + "\n" for s in steps)
                                                   + '{"step": 51, "lo')  # a line still being written
        (tmp_path / name / "config.json").write_text(json.dumps({"init_from": init_from}))
    assert runs.started_from(str(tmp_path / "stage2" / "log.jsonl"), str(tmp_path / "stage1" / "log.jsonl")) == 100
    assert runs.started_from(str(tmp_path / "stage1" / "log.jsonl"), str(tmp_path / "stage2" / "log.jsonl")) is None
    logs = [str(tmp_path / "stage1" / "log.jsonl"), str(tmp_path / "stage2" / "log.jsonl")]
    records, marks = runs.curve_records(logs)
    assert [r["step"] for r in records] == list(range(1, 151)) and marks == [(100, "stage2")]
    assert records[100]["loss"] == 1.0 and records[99]["loss"] == 1.0 / 100  # Stage II's step 1 at step 101
    image = plot.training_curves(logs)
    assert image.size == plot.grid_size(len(plot.CURVES), 4, (360, 240), "x")


def test_non_finite_values_break_the_curve_and_are_marked():
    steps = list(range(1, 11))
    losses = [1.0, 0.9, 0.8, math.nan, math.inf, 0.5, 0.4, 0.3, 0.2, 0.1]
    panel = {"title": "loss", "series": [{"label": "loss", "x": steps, "y": losses}]}
    assert [len(s) for s in plot.segments(steps, losses)] == [3, 5]  # two runs, nothing drawn across the gap
    assert plot.non_finite_steps(steps, losses) == [4.0, 5.0]
    assert plot.non_finite_steps(steps, [None] * 10) == []  # an absent value is no non-finite one
    image = plot.line_panels([panel], columns=1)
    assert plot.RED in set(image.getdata())  # the red x marks
    clean = plot.line_panels([{"title": "loss", "series": [{"label": "loss", "x": steps, "y": [1.0] * 10}]}], columns=1)
    assert plot.RED not in set(clean.getdata())


def test_a_spread_within_rounding_draws_flat():
    low, high = plot.padded_range(np.array([8.0, 8.0000005, 7.9999995]))
    assert low == pytest.approx(7.2) and high == pytest.approx(8.8)  # norms that are all 8: no zig-zag on noise
    assert plot.padded_range(np.array([1.0, 2.0])) == pytest.approx((0.95, 2.05))


def test_the_command_line_says_what_it_drew_and_what_is_wrong(tmp_path):
    import json
    import subprocess
    import sys
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "log.jsonl").write_text("".join(json.dumps({"step": s, "loss": 1.0 / s}) + "\n" for s in range(1, 5)))
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "log.jsonl").write_text("")
    (tmp_path / "nolog").mkdir()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    plot_py = lambda *args: subprocess.run([sys.executable, os.path.join(root, "plot.py"), *map(str, args)],  # noqa: E731
                                           capture_output=True, text=True, timeout=60)
    done = plot_py(run_dir)
    assert done.returncode == 0 and done.stdout.strip() == f"drew {tmp_path / 'curves_run.png'}"
    assert not (run_dir / "curves.png").exists()  # training's own picture is never overwritten
    assert plot_py(run_dir, f"--out={tmp_path / 'x.png'}").stdout.strip() == f"drew {tmp_path / 'x.png'}"
    for args, message in (([tmp_path / "missing"], "no such folder"), ([tmp_path / "nolog"], "no log.jsonl in it"),
                          ([tmp_path / "empty"], "nothing to draw: every log.jsonl is empty"), ([], "usage:")):
        run = plot_py(*args)
        assert run.returncode == 1 and message in run.stderr and "Traceback" not in run.stderr, run.stderr
    both = plot_py(run_dir, tmp_path / "empty")
    assert both.returncode == 0 and "holds no step yet" in both.stdout
