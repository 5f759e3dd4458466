"""
The toy benchmark: rendered shapes in the two layouts PACE reads, small enough for a laptop.

    python -m shapes.prepare                                        # writes under data/shapes/
    python -m shapes.prepare --out_dir=/tmp/shapes --seed=1 --num_train=500 --num_eval=50
    python -m shapes.prepare --pretrain=False                       # the tiny model random, in seconds
    python -m shapes.prepare --force=True                           # again, over a toy already there
    python -m shapes.prepare --num_media=600                        # more training rows of videos and pages

Like nanoGPT's shakespeare_char: Pillow draws every image, in a few seconds, the same files for the
same seed. A scene is a 128 x 128 picture of two or three objects, each a colour (6), a shape (5), a
size (small, large) and a cell of a 2 x 2 grid; a classification picture is one object in the middle
of the whole picture, as classification datasets are object-centred. Objects are big on purpose: each
spans several image tokens (one token per 32 x 32 pixels), so a few minutes of training can learn to
see them. Six colour-shape combinations (UNSEEN) never appear in training, neither drawn nor named:
the OOD datasets ask about exactly those.

Written under out_dir (data/shapes/ by default, git-ignored like all of data/):
- train.jsonl: MMEB-train / mmE5 rows (qry, qry_image_path, pos_text, pos_image_path, neg_text,
  neg_image_path), the five task formats mixed. Rows carry 2 to 8 hard negatives (mostly 5), on
  purpose, so data.py's fill/cut rule runs on the demo too.
- eval/<Dataset>/test.parquet: MMEB-eval rows (qry_text, qry_img_path, tgt_text, tgt_img_path),
  candidate 0 the gold one, the others drawn at random from the task's pool; ten datasets:
  Shapes-{CLS, VQA, T2I, I2T, GRD} (in distribution) and the same five with -OOD (their gold answer
  involves an unseen combination).
- train_video.jsonl, train_docs.jsonl and v2/: the video and document families (shapes/media_tasks.py): shapes
  that move across 4 frames of 64 x 64, and report pages, as plain-layout training rows and as three evaluation
  tasks in the layouts of MMEB-V2's MSR-VTT, NExTQA and ViDoRe, which eval.py scores apart (v2/own_tasks.json).
- images/: every image, video frame and training page; the paths in the training files are relative to it.
- tiny-qwen3.5/: the command line also writes the tiny Qwen3.5 that config/shapes_*.py start from:
  random (tiny_model.make_tiny_checkpoint, its final norm weight spread by tiny_model.FINAL_NORM_STD, so the
  embedding norms vary across items), then pretrained for about two minutes by captioning the training scenes
  (shapes/pretrain.py; it never sees an UNSEEN pair). --pretrain=False keeps it random (seconds);
  --tiny_checkpoint=False writes no model.

Queries carry the paper's task instructions (Table 5, mmeb.PAPER_INSTRUCTIONS); grounding, absent from Table 5,
uses MMEB's.

    python train.py config/shapes_stage1.py --check_data=True       # the training rows as train.py reads them
    from readers.evaluation import read_eval_dataset
    cls, report = read_eval_dataset("data/shapes/eval/Shapes-CLS", "data/shapes/images")
"""

import json
import os
import random
import shutil
import sys
import zlib

import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image, ImageDraw

import configurator
from common import write_json
from media import IMAGE_MARKER
from readers.mmeb import IMAGE_CANDIDATE, PAPER_INSTRUCTIONS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository
DATA_DIR = os.path.join(ROOT, "data", "shapes")  # where the toy is written (data/ is git-ignored: the user's data)

COLOURS = {"red": (220, 50, 47), "green": (50, 160, 60), "blue": (40, 90, 220), "yellow": (235, 195, 30),
           "purple": (140, 70, 190), "orange": (245, 130, 30)}
SHAPES = ("circle", "square", "triangle", "diamond", "cross")
SIZES = {"small": 0.3, "large": 0.45}  # radius as a fraction of a cell
CELLS = ("top left", "top right", "bottom left", "bottom right")  # a 2 x 2 grid, row by row
GRID = 2
UNSEEN = {(colour, SHAPES[i % len(SHAPES)]) for i, colour in enumerate(COLOURS)}  # held out of training
SEEN = [(c, s) for c in COLOURS for s in SHAPES if (c, s) not in UNSEEN]
ALL_COMBOS = [(c, s) for c in COLOURS for s in SHAPES]
BACKGROUND = (242, 242, 242)

QUESTION = PAPER_INSTRUCTIONS["VQA"]  # Table 5: VQA and classification
TEXT_TO_IMAGE = PAPER_INSTRUCTIONS["text->image"]
IMAGE_TO_TEXT = PAPER_INSTRUCTIONS["image->text"]
GROUNDING = "Select the portion of the image that isolates the object of the given label:"  # MMEB's
CROP_CANDIDATE = IMAGE_MARKER + "\nRepresent the given cropped image of the object."
TASKS = ("CLS", "VQA", "T2I", "I2T", "GRD")


# -----------------------------------------------------------------------------
# scenes: a scene is a tuple of objects (colour, shape, size, cell), sorted by cell

def random_scene(rng, num_objects, unseen_target):
    """Objects of distinct colours, shapes and cells, so every question has one answer. Object 0 (the
    target) is an UNSEEN combination when unseen_target, otherwise every object is SEEN.
    -> (scene, target)"""
    while True:
        colours = rng.sample(list(COLOURS), num_objects)
        shapes = rng.sample(SHAPES, num_objects)
        combos = list(zip(colours, shapes))
        if (combos[0] in UNSEEN) == unseen_target and all(c not in UNSEEN for c in combos[1:]):
            break
    cells = rng.sample(range(len(CELLS)), num_objects)
    objects = [(c, s, rng.choice(list(SIZES)), cell) for (c, s), cell in zip(combos, cells)]
    target = objects[0]
    return tuple(sorted(objects, key=lambda o: o[3])), target


def caption(scene):
    parts = [f"a {size} {colour} {shape} at the {CELLS[cell]}" for colour, shape, size, cell in scene]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def perturbed_captions(rng, scene, allowed_combos):
    """Captions of scenes that differ from `scene` in one attribute of one object: hard negatives."""
    out = set()
    for index, (colour, shape, size, cell) in enumerate(scene):
        others = [o for k, o in enumerate(scene) if k != index]
        used_cells = {o[3] for o in others}
        changes = [(c, shape, size, cell) for c in COLOURS if c != colour]
        changes += [(colour, s, size, cell) for s in SHAPES if s != shape]
        changes += [(colour, shape, z, cell) for z in SIZES if z != size]
        changes += [(colour, shape, size, k) for k in range(len(CELLS)) if k != cell and k not in used_cells]
        for new in changes:
            if (new[0], new[1]) in allowed_combos and all((new[0], new[1]) != (o[0], o[1]) for o in others):
                out.add(caption(sorted(others + [new], key=lambda o: o[3])))
    out = sorted(out)
    rng.shuffle(out)
    return out


def cell_box(cell, image_size):
    row, col = divmod(cell, GRID)
    side = image_size / GRID
    return round(col * side), round(row * side), round((col + 1) * side), round((row + 1) * side)


def draw_shape(draw, shape, x, y, radius, fill):
    """One object on an ImageDraw: its shape centred at (x, y), `radius` pixels from the centre to its edge."""
    if shape == "circle":
        draw.ellipse([x - radius, y - radius, x + radius, y + radius], fill=fill)
    elif shape == "square":
        r = radius * 0.85
        draw.rectangle([x - r, y - r, x + r, y + r], fill=fill)
    elif shape == "triangle":
        draw.polygon([(x, y - radius), (x - radius, y + radius * 0.8), (x + radius, y + radius * 0.8)], fill=fill)
    elif shape == "diamond":
        draw.polygon([(x, y - radius), (x + radius, y), (x, y + radius), (x - radius, y)], fill=fill)
    else:  # cross
        arm = radius * 0.35
        draw.rectangle([x - radius, y - arm, x + radius, y + arm], fill=fill)
        draw.rectangle([x - arm, y - radius, x + arm, y + radius], fill=fill)


def render(scene, rng, image_size, grid=GRID):
    """grid=1 draws a single object over the whole picture (classification images are object-centred)."""
    image = Image.new("RGB", (image_size, image_size), BACKGROUND)
    draw = ImageDraw.Draw(image)
    side = image_size / grid
    for colour, shape, size, cell in scene:
        row, col = divmod(cell % grid**2, grid)
        jitter = (0.5 - SIZES[size] - 0.02) * side  # the object stays inside its cell
        x = (col + 0.5) * side + rng.uniform(-jitter, jitter)
        y = (row + 0.5) * side + rng.uniform(-jitter, jitter)
        draw_shape(draw, shape, x, y, SIZES[size] * side, COLOURS[colour])
    return image


# -----------------------------------------------------------------------------
# examples: (query (text, image), gold (text, image), negatives [(text, image), ...])

def label(obj):
    return f"{obj[0]} {obj[1]}"


def make_examples(task, rng, count, unseen, folder, image_dir, image_size, num_hard, hardest):
    """`count` examples of one task format, each with num_hard negatives: the hardest first (training:
    mined hard negatives), or drawn at random from the task's pool of distinct candidates (evaluation,
    as most MMEB datasets draw theirs: hardest first, a model reading only the text ranked the gold
    below chance, the gold being the centre of its one-attribute variants). Images are saved under
    image_dir/folder."""
    os.makedirs(os.path.join(image_dir, folder), exist_ok=True)
    allowed = set(ALL_COMBOS) if unseen else set(SEEN)
    scenes = []
    for i in range(count):
        scene, target = random_scene(rng, 1 if task == "CLS" else rng.randint(2, 3), unseen)
        image = render(scene, rng, image_size, 1 if task == "CLS" else GRID)
        path = f"{folder}/{i:05d}.png"
        image.save(os.path.join(image_dir, path), compress_level=1)
        crops = {}
        if task == "GRD":  # the cell of each object, a candidate of the grounding task
            for obj in scene:
                crops[obj] = f"{folder}/{i:05d}_{obj[3]}.png"
                image.crop(cell_box(obj[3], image_size)).save(os.path.join(image_dir, crops[obj]), compress_level=1)
        scenes.append((scene, target, path, crops, caption(scene), {o[:2] for o in scene}))
    examples = []
    for i in range(count):
        query, gold, hard = TASK_EXAMPLE[task](rng, scenes, i, allowed, num_hard, hardest)
        hard = list(dict.fromkeys(hard))  # distinct (text, image) pairs, in order
        if len(hard) < num_hard:
            raise ValueError(f"{folder}: {len(hard)} distinct negatives for an example, {num_hard} needed; "
                             "raise num_train / num_eval or lower num_candidates")
        examples.append((query, gold, hard[:num_hard] if hardest else rng.sample(hard, num_hard)))
    return examples


def in_random_order(rng, items):
    items = list(items)
    rng.shuffle(items)
    return items


# one example of each task from scene i: -> (query (text, image), gold (text, image), negatives, hardest first)

def classification_example(rng, scenes, i, allowed, num_hard, hardest):
    _, target, path, _, _, _ = scenes[i]
    query = (f"<|image_1|>\n{QUESTION} What colour and shape is the object?", path)
    others = [c for c in sorted(allowed) if c != target[:2]]
    near = [c for c in others if c[0] == target[0] or c[1] == target[1]]  # one attribute right
    hard = [(f"{c} {s}", "") for c, s in in_random_order(rng, near) + in_random_order(rng, (c for c in others if c not in near))]
    return query, (label(target), ""), hard


def vqa_example(rng, scenes, i, allowed, num_hard, hardest):
    _, (colour, shape, size, cell), path, _, _, _ = scenes[i]
    kind = rng.choice(["colour", "shape", "where"])
    question, answer, options = {
        "colour": (f"What colour is the {shape}?", colour, list(COLOURS)),
        "shape": (f"What shape is the {colour} object?", shape, list(SHAPES)),
        "where": (f"Where is the {colour} {shape}?", CELLS[cell], list(CELLS))}[kind]
    rest = set(COLOURS) | set(SHAPES) | set(CELLS)
    hard = [(option, "") for option in in_random_order(rng, (o for o in options if o != answer))
            + in_random_order(rng, sorted(rest - set(options)))]  # answers of the asked kind first
    return (f"<|image_1|>\n{QUESTION} {question}", path), (answer, ""), hard


def text_to_image_example(rng, scenes, i, allowed, num_hard, hardest):
    _, _, path, _, text, combos = scenes[i]
    # other scenes, those sharing the most colour-shape pairs first (ties in random order)
    others = in_random_order(rng, (k for k in range(len(scenes)) if scenes[k][4] != text))
    others.sort(key=lambda k: -len(scenes[k][5] & combos))
    return (f"{TEXT_TO_IMAGE} {text}", ""), (IMAGE_CANDIDATE, path), [(IMAGE_CANDIDATE, scenes[k][2]) for k in others]


def image_to_text_example(rng, scenes, i, allowed, num_hard, hardest):
    scene, _, path, _, text, _ = scenes[i]
    hard = [(t, "") for t in perturbed_captions(rng, scene, allowed)]
    if not hardest:  # the pool also holds the captions of other scenes
        hard += [(scenes[k][4], "") for k in range(len(scenes)) if scenes[k][4] != text]
    return (f"<|image_1|>\n{IMAGE_TO_TEXT}", path), (text, ""), hard


def grounding_example(rng, scenes, i, allowed, num_hard, hardest):
    """The target's crop; the other objects' crops, then crops of other scenes."""
    scene, target, path, crops, _, _ = scenes[i]
    hard = [(CROP_CANDIDATE, crops[obj]) for obj in scene if obj != target]
    for k in in_random_order(rng, (k for k in range(len(scenes)) if k != i)):
        hard += [(CROP_CANDIDATE, crop) for obj, crop in scenes[k][3].items() if obj[:2] != target[:2]]
        if hardest and len(hard) >= num_hard:
            break
    return (f"<|image_1|>\n{GROUNDING} {label(target)}", path), (CROP_CANDIDATE, crops[target]), hard


TASK_EXAMPLE = {"CLS": classification_example, "VQA": vqa_example, "T2I": text_to_image_example,
                "I2T": image_to_text_example, "GRD": grounding_example}


# -----------------------------------------------------------------------------
# the two layouts

def write_train(path, rng, examples):
    """MMEB-train rows; the number of hard negatives varies (2-8, mostly 5) so the fill/cut rule runs."""
    with open(path, "w", encoding="utf-8") as f:
        for (query, gold, hard) in examples:
            count = rng.choice([5] * 6 + [2, 3, 4, 6, 7, 8])
            negatives = hard[:count]
            f.write(json.dumps({"qry": query[0], "qry_image_path": query[1], "pos_text": gold[0],
                                "pos_image_path": gold[1], "neg_text": [n[0] for n in negatives],
                                "neg_image_path": [n[1] for n in negatives]}) + "\n")


def write_eval(path, examples, num_candidates):
    """MMEB-eval rows: the gold candidate first, then num_candidates - 1 negatives."""
    columns = {"qry_text": [], "qry_img_path": [], "tgt_text": [], "tgt_img_path": []}
    for query, gold, hard in examples:
        candidates = [gold] + hard[:num_candidates - 1]
        columns["qry_text"].append(query[0])
        columns["qry_img_path"].append(query[1])
        columns["tgt_text"].append([c[0] for c in candidates])
        columns["tgt_img_path"].append([c[1] for c in candidates])
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pq.write_table(pa.table(columns), path)


def prepare(out_dir, seed=0, num_train=2000, num_eval=100, num_candidates=10, image_size=128, num_media=300):
    """Write the benchmark under out_dir. -> {"train": train.jsonl, "eval": eval dir, "images": image dir,
    "train_video", "train_docs", "v2": the video and document families' (media_tasks.prepare_media)}"""
    from shapes import media_tasks  # which draws with this module's shapes
    image_dir, eval_dir = os.path.join(out_dir, "images"), os.path.join(out_dir, "eval")
    num_hard = max(8, num_candidates - 1)  # training rows take up to 8
    if num_train < len(TASKS) * (num_hard + 1) or num_eval < num_hard + 1:
        raise ValueError(f"num_train must be at least {len(TASKS) * (num_hard + 1)} and num_eval at least "
                         f"{num_hard + 1}: a task's hard negatives come from its other scenes")
    for stale in (image_dir, eval_dir, os.path.join(out_dir, media_tasks.V2_DIR)):  # only what this script writes
        shutil.rmtree(stale, ignore_errors=True)
    os.makedirs(out_dir, exist_ok=True)

    train = []
    for k, task in enumerate(TASKS):
        count = num_train // len(TASKS) + (k < num_train % len(TASKS))
        rng = random.Random(f"{seed}/train/{task}")
        train += make_examples(task, rng, count, False, f"train/{task}", image_dir, image_size, num_hard, True)
    write_train(os.path.join(out_dir, "train.jsonl"), random.Random(f"{seed}/train"), train)

    for task in TASKS:
        for unseen in (False, True):
            name = f"Shapes-{task}" + ("-OOD" if unseen else "")
            rng = random.Random(f"{seed}/{name}")
            examples = make_examples(task, rng, num_eval, unseen, name, image_dir, image_size, num_hard, False)
            write_eval(os.path.join(eval_dir, name, "test.parquet"), examples, num_candidates)
    media = media_tasks.prepare_media(out_dir, image_dir, seed, num_media, num_eval)
    return {"train": os.path.join(out_dir, "train.jsonl"), "eval": eval_dir, "images": image_dir, **media}


# -----------------------------------------------------------------------------
# written once: what out_dir holds, so that a second run rewrites nothing

STAMP = "prepared.json"  # in out_dir: the settings it was written with, and the size and CRC-32 of every file


def file_crc(path):
    with open(path, "rb") as f:
        return zlib.crc32(f.read())


def manifest(folder, names):
    """{path relative to folder: [size, CRC-32]} of the files and of every file under the folders named."""
    files = {}
    for name in names:
        paths = [os.path.join(folder, name)] if os.path.isfile(os.path.join(folder, name)) else sorted(
            os.path.join(root, f) for root, _, fs in os.walk(os.path.join(folder, name)) for f in fs)
        files.update({os.path.relpath(p, folder): [os.path.getsize(p), file_crc(p)] for p in paths})
    return files


def already_prepared(out_dir, settings):
    """True when out_dir holds what these settings write, file for file (size and CRC-32): then nothing is
    rewritten, so neither the pretraining nor the files' times (which eval.py's kept results check) change."""
    try:
        with open(os.path.join(out_dir, STAMP)) as f:
            stamp = json.load(f)
    except (OSError, ValueError):
        return False
    return stamp.get("settings") == settings and all(
        os.path.isfile(os.path.join(out_dir, path)) and os.path.getsize(os.path.join(out_dir, path)) == size
        and file_crc(os.path.join(out_dir, path)) == crc for path, (size, crc) in stamp.get("files", {}).items())


# -----------------------------------------------------------------------------
# the command line (every default can be overridden by --key=value)
out_dir = DATA_DIR  # where the toy is written (default data/shapes)
seed = 0  # seeds every picture and row
num_train = 2000  # training rows, over the five task formats
num_media = 300  # training rows of videos and pages, 100 a format (long rows: 300 make a step about 11 % dearer)
num_eval = 100  # queries per evaluation dataset
num_candidates = 10  # candidates per evaluation query
image_size = 128  # pixels; 128 = a 2 x 2 grid of 64-pixel cells
tiny_checkpoint = True  # also write out_dir/tiny-qwen3.5, the model config/shapes_*.py start from
final_norm_std = -1.0  # spread of the tiny model's final norm weight (-1: tiny_model.FINAL_NORM_STD)
pretrain = True  # pretrain the tiny model on the training scenes (shapes/pretrain.py, about 2 minutes); False: random
pretrain_steps = 0  # pretraining steps (0: pretrain.EPOCHS epochs)
force = False  # write everything again, even where out_dir already holds this very toy
def main(argv=None):
    """Write the toy (and its tiny model) as the config says, unless out_dir already holds exactly that (then
    --force=True writes it again). -> prepare()'s paths"""
    config = configurator.configure(globals(), sys.argv[1:] if argv is None else argv)
    settings = {key: value for key, value in config.items() if key not in ("out_dir", "force")}
    from shapes.media_tasks import TRAIN_FILES, V2_DIR
    paths = {"train": os.path.join(out_dir, "train.jsonl"), "eval": os.path.join(out_dir, "eval"),
             "images": os.path.join(out_dir, "images"), "v2": os.path.join(out_dir, V2_DIR),
             **{f"train_{key}": os.path.join(out_dir, name) for key, name in TRAIN_FILES.items()}}
    if not force and already_prepared(out_dir, settings):
        print(f"{out_dir} already holds this toy (the same settings, every file identical): nothing rewritten; "
              "--force=True writes it again")
        return paths
    stamp = os.path.join(out_dir, STAMP)
    if os.path.exists(stamp):
        os.remove(stamp)  # written last: a stopped prepare leaves none
    paths = prepare(out_dir, seed, num_train, num_eval, num_candidates, image_size, num_media)
    print(f"wrote {paths['train']}, {paths['eval']}/ (10 datasets), {paths['train_video']}, {paths['train_docs']}, "
          f"{paths['v2']}/ (3 video and document tasks) and {paths['images']}/")
    if tiny_checkpoint:
        from shapes import pretrain as pretraining
        from shapes.tiny_model import FINAL_NORM_STD, make_tiny_checkpoint
        spread = FINAL_NORM_STD if final_norm_std < 0 else final_norm_std
        stale = os.path.join(out_dir, "tiny-qwen3.5", pretraining.RECORD)  # an earlier pretraining's record
        if os.path.exists(stale):
            os.remove(stale)
        folder = make_tiny_checkpoint(os.path.join(out_dir, "tiny-qwen3.5"), seed=seed, final_norm_std=spread)
        print(f"wrote {folder} (random, final norm weight std {spread:g})")
        if pretrain:
            pretraining.pretrain(folder, paths["train"], paths["images"], steps=pretrain_steps or None, seed=seed)
    written = ["train.jsonl", *TRAIN_FILES.values(), "eval", V2_DIR, "images"]
    written += ["tiny-qwen3.5"] if tiny_checkpoint else []
    write_json(stamp, {"settings": settings, "files": manifest(out_dir, written)})
    return paths


if __name__ == "__main__":
    from common import install_error_hook
    install_error_hook()
    main()
