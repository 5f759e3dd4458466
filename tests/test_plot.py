"""
Tests of tools/plot.py, read back through matplotlib's objects: the panels and their lines, scales, marks and
notes; the geometry panels; the sheet cells' frames, pictures and text; save; and the command line.

    python -m pytest -q tests/test_plot.py
"""
import json
import math
import os
import subprocess
import sys

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.colors import to_rgba
from PIL import Image

from common import UserError
from media import IMAGE_MARKER
from tools import plot

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def write_run(folder, records, init_from=None):
    """A train.py out_dir: log.jsonl of records (a last line cut short, as a run still writing leaves it) and,
    given init_from, config.json. -> its log path"""
    folder.mkdir(parents=True)
    (folder / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records) + '{"step": 9, "lo')
    if init_from is not None:
        (folder / "config.json").write_text(json.dumps({"config": {"init_from": init_from}, "history": []}))
    return str(folder / "log.jsonl")


def panel(figure, title):
    return next(ax for ax in figure.axes if ax.get_title() == title)


def series(ax, label):
    """The (x, y) data of the line labelled label."""
    line = next(line for line in ax.get_lines() if line.get_label() == label)
    return np.asarray(line.get_xdata(), float), np.asarray(line.get_ydata(), float)


def non_finite_marks(ax):
    return [line for line in ax.get_lines() if line.get_gid() == "non-finite"]


def texts(artist):
    return [t.get_text() for t in artist.texts]


def dashed(ax):
    """The x of the panel's dashed vertical lines."""
    return [line.get_xdata()[0] for line in ax.get_lines() if line.get_linestyle() == "--"]


# -----------------------------------------------------------------------------
# training curves

def test_one_panel_per_curve_each_series_against_step(tmp_path):
    keys = [key for _, keys, _ in plot.CURVES for key in keys]
    records = [{"step": s, **{key: 0.1 * s + i for i, key in enumerate(keys)}} for s in range(1, 21)]
    figure = plot.training_curves([write_run(tmp_path / "run", records)], title="shapes")
    assert len(figure.axes) == len(plot.CURVES) == 7 and figure.get_suptitle() == "shapes"
    for ax, (title, keys, log_y) in zip(figure.axes, plot.CURVES):
        assert ax.get_title() == title and ax.get_yscale() == ("log" if log_y else "linear")
        assert [line.get_label() for line in ax.get_lines()] == keys
        for key in keys:
            x, y = series(ax, key)
            assert list(x) == list(range(1, 21)) and list(y) == [r[key] for r in records]
        assert (ax.get_legend() is not None) == (len(keys) > 1)
        assert not non_finite_marks(ax) and not dashed(ax)


def test_a_rerankers_log_draws_its_scores_in_place_of_the_vectors_panels(tmp_path):
    keys = ["loss", "pos_prob", "pos_score", "neg_score", "lr", "grad_norm"]  # what a reranker's log.jsonl holds
    records = [{"step": s, **{key: 0.1 * s + i for i, key in enumerate(keys)}} for s in range(1, 11)]
    figure = plot.training_curves([write_run(tmp_path / "rerank", records)])
    assert [ax.get_title() for ax in figure.axes] == [title for title, _, _ in plot.RERANK_CURVES]
    x, y = series(panel(figure, "scores, eq. (R1)"), "neg_score")
    assert list(y) == [r["neg_score"] for r in records]


def test_stage_two_continues_where_it_branched_off(tmp_path):
    first = write_run(tmp_path / "stage1", [{"step": s, "loss": 1.0 / s} for s in range(1, 151)], "backbone")
    second = write_run(tmp_path / "stage2", [{"step": s, "loss": 1.0} for s in range(1, 51)],
                       "out/stage1/step_000100")
    assert plot.started_from(second, first) == 100 and plot.started_from(first, second) is None
    records, marks = plot.curve_records([first, second])
    assert [r["step"] for r in records] == list(range(1, 151)) and marks == [(100, "stage2")]
    assert records[99]["loss"] == 1.0 / 100 and records[100]["loss"] == 1.0  # Stage II's step 1 at step 101
    figure = plot.training_curves([first, second])
    assert figure.get_suptitle() == f"{first} + {second}"
    for ax in figure.axes:
        assert dashed(ax) == [100] and any("stage2" in t for t in texts(ax))
    x, y = series(panel(figure, "loss (eq. 7)"), "loss")
    assert list(x) == list(range(1, 151)) and y[99] == 1.0 / 100 and y[100] == 1.0


def test_a_run_without_init_from_continues_after_the_last_step(tmp_path):
    first = write_run(tmp_path / "a", [{"step": s, "loss": 1.0} for s in range(1, 11)])
    second = write_run(tmp_path / "b", [{"step": s, "loss": 2.0} for s in range(1, 6)])
    assert plot.curve_records([first, second])[1] == [(10, "b")]
    x, _ = series(panel(plot.training_curves([first, second]), "loss (eq. 7)"), "loss")
    assert list(x) == list(range(1, 16))


@pytest.mark.filterwarnings("error")  # and no numpy or matplotlib warning on NaN, inf, log(0) or empty data
def test_nan_and_inf_break_the_line_and_are_marked_none_is_a_gap(tmp_path):
    losses = [1.0, 0.9, 0.8, math.nan, math.inf, 0.5, 0.4, 0.3, 0.2, 0.1]
    records = [{"step": s, "loss": v, "pos_prob": 0.5 if s % 3 == 0 else None,
                "grad_norm": -math.inf if s == 7 else 1.0,
                "lr": [0.0, -1.0, 1e-5, 2e-5][s % 4]} for s, v in zip(range(1, 11), losses)]
    figure = plot.training_curves([write_run(tmp_path / "run", records)])
    loss = panel(figure, "loss (eq. 7)")
    x, y = series(loss, "loss")
    assert list(np.isfinite(y)) == [True] * 3 + [False] * 2 + [True] * 5  # nothing drawn across steps 4 and 5
    [mark] = non_finite_marks(loss)
    assert list(mark.get_xdata()) == [4, 5] and mark.get_color() == plot.RED and mark.get_marker() == "x"
    assert all(v > 0.9 for v in mark.get_ydata()) and "x: 2 non-finite" in texts(loss)  # at the top of the panel
    assert list(non_finite_marks(panel(figure, "gradient norm"))[0].get_xdata()) == [7]
    probability = panel(figure, "positive's probability")
    assert not non_finite_marks(probability)  # an absent value is a gap, no non-finite one
    _, y = series(probability, "pos_prob")
    assert list(np.flatnonzero(np.isfinite(y))) == [2, 5, 8]
    line = probability.get_lines()[0]
    assert line.get_marker() == "." and list(line.get_markevery()) == [2, 5, 8]  # lone points still show
    lr = panel(figure, "learning rate")
    assert lr.get_yscale() == "log" and not non_finite_marks(lr)
    _, y = series(lr, "lr")
    assert list(np.isfinite(y)) == [False, True, True, False] * 2 + [False, True]  # 0 and -1 left out, not marked
    cosine = panel(figure, "cosine")  # no value at all: it draws, on the same step axis
    assert cosine.get_lines()[0].get_marker() == "None" and cosine.get_xlim() == loss.get_xlim()


def test_a_spread_within_rounding_draws_flat(tmp_path):
    records = [{"step": s, "query_norm": 8.0 + (s % 2) * 1e-7, "candidate_norm": 8.0, "loss": 1.0 + s % 2,
                "lr": 2e-5 * (1 + (s % 2) * 1e-9)} for s in range(1, 21)]
    figure = plot.training_curves([write_run(tmp_path / "run", records)])
    low, high = panel(figure, "embedding norms").get_ylim()
    assert low == pytest.approx(7.2) and high == pytest.approx(8.8)  # norms that are all 8: no zig-zag on noise
    low, high = panel(figure, "learning rate").get_ylim()
    assert high / low >= 4  # on a log scale too
    low, high = panel(figure, "loss (eq. 7)").get_ylim()
    assert 0.8 < low < 1.0 and 2.0 < high < 2.2  # a real spread fills the panel


# -----------------------------------------------------------------------------
# geometry

def numbers(all_equal=False, n=50):
    rng = np.random.default_rng(0)
    return {"random_pair_cos": list(rng.uniform(-0.5, 0.9, n)) + [math.nan], "random_pair_mean_cos": 0.1234,
            "num_random_pairs": n * n, "all_norms_equal": all_equal,
            "query_norm": {"mean": 8.0, "std": 0.0, "min": 8.0, "max": 8.0},
            "norm_cos_pearson_r": None if all_equal else -0.78,
            "pairs": {"standardised_log_norm_product": [0.0] * n if all_equal else list(rng.normal(size=n)),
                      "cos_positive": list(rng.uniform(0, 1, n))},
            "pca": {"x": list(rng.normal(size=2 * n)), "y": list(0.1 * rng.normal(size=2 * n)),
                    "norm_percentile": None if all_equal else list(np.linspace(0, 1, 2 * n)),
                    "is_query": [i < n for i in range(2 * n)]},
            "pca_explained_variance": [0.4567, 0.1234],
            "norm_from_direction_r2": {"2": None, "10": None} if all_equal else {"2": 0.91, "10": None}}


def test_geometry_draws_the_histogram_the_pairs_and_the_pca():
    figure = plot.geometry(numbers(), title="shapes")
    histogram, pairs, pca, bar = figure.axes  # the fourth: the PCA's colour bar
    assert figure.get_suptitle() == "shapes" and bar.get_ylabel() == "norm percentile"
    assert histogram.get_xlim() == (-1, 1) and "0.123" in histogram.get_title() and "2,500" in histogram.get_title()
    assert [t.get_text() for t in histogram.get_legend().get_texts()] == ["50 drawn pairs"]  # the NaN left out
    [outline] = histogram.patches
    edges, heights = outline.get_xy()[:, 0], outline.get_xy()[:, 1]
    assert edges.min() == -1 and edges.max() == 1 and np.sum(heights[1:-1:2] * 2 / 40) == pytest.approx(1)  # density
    [points] = pairs.collections
    assert np.allclose(points.get_offsets(), np.column_stack([numbers()["pairs"]["standardised_log_norm_product"],
                                                              numbers()["pairs"]["cos_positive"]]))
    assert "r = -0.78" in texts(pairs)
    assert pca.get_aspect() == 1.0 and pca.get_xlabel() == "PC1 46%" and pca.get_ylabel() == "PC2 12%"
    assert "0.91 (k=2)" in pca.get_title() and "- (k=10)" in pca.get_title()
    [points] = pca.collections
    offsets, colours = np.asarray(points.get_offsets()), np.asarray(points.get_array())
    x, percentile = numbers()["pca"]["x"], numbers()["pca"]["norm_percentile"]
    order = [x.index(v) for v in offsets[:, 0]]  # which embedding each drawn point is
    assert sorted(order) == list(range(100)) and order != list(range(100))  # all, shuffled: no kind always on top
    assert np.allclose(colours, np.array(percentile)[order])
    circle, triangle = (len(plot.marker_path(m).vertices) for m in ("o", "^"))
    assert circle != triangle
    assert [len(path.vertices) for path in points.get_paths()] == [circle if i < 50 else triangle for i in order]


def test_geometry_with_equal_norms_says_so_and_draws_no_noise():
    figure = plot.geometry(numbers(all_equal=True))
    assert len(figure.axes) == 3  # no colour bar
    _, pairs, pca = figure.axes
    assert not pairs.collections and "all norms 8.00: no norm to standardise" in texts(pairs)
    assert "all norms 8.00" in texts(pca) and pca.collections[0].get_array() is None  # one colour
    assert "- (k=2)" in pca.get_title()


# -----------------------------------------------------------------------------
# retrieval sheets

def result(gold=None, image=None, text="a candidate " * 30):
    """A sheet result; gold None: no "gold" key (an unjudged search)."""
    return {"text": text, "image": image, "score": 1.5, **({} if gold is None else {"gold": gold})}


def cells(figure):
    """{axes label: axes} of a sheet's cells."""
    return {ax.get_label(): ax for ax in figure.axes}


def frame(ax):
    spine = ax.spines["left"]
    return spine.get_edgecolor(), spine.get_linewidth()


def test_retrieval_sheet_frames_the_gold_green_and_a_wrong_first_red():
    rows = [{"query": {"text": "first", "image": None}, "results": [result(False), result(True), result(False)]},
            {"query": {"text": "second", "image": None}, "results": [result(True), result(False), result(False)]},
            {"query": {"text": "third", "image": None}, "results": [result(False)] * 3},
            {"query": {"text": "fourth", "image": None}, "results": [result(), result()]}]
    figure = plot.retrieval_sheet(rows, title="Shapes: top 3")
    cell = cells(figure)
    assert len(figure.axes) == 4 + 3 + 3 + 3 + 2 and figure.get_suptitle() == "Shapes: top 3"
    green, red = to_rgba(plot.GREEN), to_rgba(plot.RED)
    assert frame(cell["query 0 #2"])[0] == green and frame(cell["query 1 #1"])[0] == green
    assert frame(cell["query 0 #1"])[0] == red and frame(cell["query 2 #1"])[0] == red
    plain = [frame(cell[name])[0] for name in ("query 0 #3", "query 1 #2", "query 3 #1", "query 3 #2", "query 0")]
    assert not {green, red} & set(plain)  # and an unjudged row (no "gold" keys) frames nothing
    assert frame(cell["query 0 #2"])[1] > frame(cell["query 0 #3"])[1]
    assert "gold not in top 3" in texts(cell["query 2"])
    assert not any("gold not" in t for name in ("query 0", "query 1", "query 3") for t in texts(cell[name]))
    assert "#2  1.50" in texts(cell["query 0 #2"])
    top = max(ax.get_position().y1 for ax in figure.axes)
    assert cell["query 0"].get_position().y1 == top and cell["query 0 #3"].get_position().x0 > 0.7  # rank order


def test_sheet_cells_show_upright_rgb_images_and_text_without_the_marker(tmp_path):
    blue, turned, broken = tmp_path / "blue.png", tmp_path / "turned.jpg", tmp_path / "broken.png"
    Image.new("RGB", (40, 80), (0, 0, 255)).save(blue)
    exif = Image.Exif()
    exif[0x0112] = 6  # the camera was held on its side: a viewer turns the 80 x 40 pixels to 40 x 80
    Image.new("L", (80, 40), 0).save(turned, exif=exif)
    broken.write_bytes(b"not a png")
    rows = [{"query": {"text": f"{IMAGE_MARKER}\nfind this", "image": Image.new("RGBA", (90, 30), (255, 255, 0, 255))},
             "results": [result(True, str(blue)), result(False, str(turned)), result(False, str(broken)),
                         result(False, str(tmp_path / "missing.png"), text=f"word{IMAGE_MARKER}")]}]
    cell = cells(plot.retrieval_sheet(rows))
    query = cell["query 0"].get_images()[0].get_array()
    assert query.shape[2] == 3 and (query == (255, 255, 0)).all(-1).any()  # a PIL image, RGB
    assert (cell["query 0 #1"].get_images()[0].get_array() == (0, 0, 255)).all(-1).any()  # a path
    picture = np.asarray(cell["query 0 #2"].get_images()[0].get_array())
    middle = picture.shape[0] // 2
    assert (picture[middle, :5] > 225).all() and (picture[:5, middle] < 30).all()  # upright: tall, white beside it
    for name in ("query 0 #3", "query 0 #4"):  # unreadable, missing: a grey box, no exception
        assert not cell[name].get_images() and "unreadable" in texts(cell[name])
        assert cell[name].patches[0].get_facecolor() == to_rgba(plot.GREY)
    assert "find this" in texts(cell["query 0"])
    assert not any(IMAGE_MARKER in t for ax in cell.values() for t in texts(ax))
    assert "word" in texts(cell["query 0 #4"])
    body = texts(cell["query 0 #1"])[-1].split("\n")  # 30 candidates: cut to the cell
    assert len(body) == plot.TEXT_LINES - 1 and body[-1].endswith("...")
    assert all(len(line) <= plot.TEXT_CHARS for line in body)
    assert plot.wrap("x" * 50, 20, 3) == "x" * 20 + "\n" + "x" * 20 + "\n" + "x" * 10  # a long word is broken


def test_an_empty_sheet_draws():
    assert not plot.retrieval_sheet([]).axes


# -----------------------------------------------------------------------------
# save and the command line

def test_save_writes_a_whole_png_and_no_temporary_file(tmp_path):
    figure = plot.retrieval_sheet([{"query": {"text": "q", "image": None}, "results": [result(True)]}])
    path = tmp_path / "figures" / "new" / "sheet.png"
    assert plot.save(figure, path) == str(path)
    with Image.open(path) as reopened:
        reopened.load()
        assert reopened.format == "PNG" and reopened.size == (round(2 * plot.CELL[0] * 100), round(plot.CELL[1] * 100))
    assert [p.name for p in path.parent.iterdir()] == ["sheet.png"]
    assert not plt.fignum_exists(figure.number)  # closed


def test_the_command_line_draws_curves_of_run_folders(tmp_path, capsys):
    write_run(tmp_path / "stage1", [{"step": s, "loss": 1.0 / s} for s in range(1, 11)])
    write_run(tmp_path / "stage2", [{"step": s, "loss": 0.1} for s in range(1, 4)],
              str(tmp_path / "stage1" / "step_000005"))
    write_run(tmp_path / "empty", [])  # its one line cut short: no step yet
    folders = [str(tmp_path / "stage1"), str(tmp_path / "stage2")]
    assert plot.main([*folders, f"--out={tmp_path / 'x.png'}"]) == [str(tmp_path / "x.png")]
    assert capsys.readouterr().out == f"drew {tmp_path / 'x.png'}\n"
    default = str(tmp_path / "curves_stage1+empty.png")  # beside the runs: --out= was not kept from the last call
    assert plot.main([folders[0], str(tmp_path / "empty")]) == [default]
    said = capsys.readouterr().out
    assert f"warning: {tmp_path / 'empty' / 'log.jsonl'} holds no step yet" in said and f"drew {default}\n" in said
    for path in (default, tmp_path / "x.png"):
        with Image.open(path) as image:
            assert image.format == "PNG" and image.size == (1600, 640)


def test_the_command_line_draws_the_sheets_of_an_eval_json(tmp_path, capsys):
    sheet = [{"query": {"text": "q", "image": None}, "results": [result(True), result(False)]}]
    output = {"datasets": {"Shapes-CLS": {"precision_at_1": 50.0, "sheet": sheet},
                           "Shapes-VQA": {"precision_at_1": 1.0}},  # no sheet: none drawn
              "others": {"datasets": {"Toy-T2I": {"sheet": sheet * 2}}}}
    (tmp_path / "eval.json").write_text(json.dumps(output))
    drawn = plot.main([str(tmp_path / "eval.json")])
    assert drawn == [str(tmp_path / "eval_sheet_Shapes-CLS.png"), str(tmp_path / "eval_sheet_Toy-T2I.png")]
    assert capsys.readouterr().out.split("\n")[:2] == [f"drew {path}" for path in drawn]
    assert all(os.path.isfile(path) for path in drawn)
    (tmp_path / "nosheet.json").write_text(json.dumps({"datasets": {"Shapes-CLS": {"precision_at_1": 50.0}}}))
    with pytest.raises(UserError, match="--sheet_queries=N") as error:
        plot.main([str(tmp_path / "nosheet.json")])
    assert "nosheet.json" in str(error.value)


def test_the_command_line_names_what_is_wrong_in_one_line(tmp_path, capsys):
    (tmp_path / "nolog").mkdir()
    write_run(tmp_path / "empty", [])
    (tmp_path / "bad.json").write_text("{")
    for args, message in (([tmp_path / "missing"], f"{tmp_path / 'missing'}: no such folder"),
                          ([tmp_path / "nolog"], f"{tmp_path / 'nolog'}: no log.jsonl in it"),
                          ([tmp_path / "empty"], "nothing to draw: every log.jsonl is empty"),
                          ([tmp_path / "bad.json"], f"{tmp_path / 'bad.json'}: not JSON"),
                          ([tmp_path / "gone.json"], f"{tmp_path / 'gone.json'}: cannot read it"),
                          ([], "name run folders"), (["--outt=x.png"], "--outt=x.png: unknown config key 'outt'")):
        with pytest.raises(UserError) as error:
            plot.main([str(a) for a in args])
        assert str(error.value).startswith(message) and "\n" not in str(error.value)
    with pytest.raises(SystemExit) as done:
        plot.main(["--help"])
    assert done.value.code == 0 and "paths = []" in capsys.readouterr().out
    run = subprocess.run([sys.executable, "-m", "tools.plot", str(tmp_path / "missing")], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and run.stderr == f"error: {tmp_path / 'missing'}: no such folder\n"
