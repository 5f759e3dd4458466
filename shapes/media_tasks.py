"""
shapes/media_tasks.py: the toy's video and document families: shapes that move across a few frames, and pages about
shapes, written for training as plain-layout rows (readers/records.py) and for evaluation in the on-disk layouts of
three of MMEB-V2's tasks, which eval.py reads with those tasks' own parsers and scores by their metrics, apart from
MMEB-V2's means.

    python -m shapes.prepare                                   # writes these with the rest of the toy
    python -m shapes.prepare --num_media=600                   # more training rows of these families
    from shapes.media_tasks import prepare_media
    paths = prepare_media("data/shapes", "data/shapes/images", seed=0, num_train=300, num_eval=100)

A video is FRAMES frames of FRAME_SIZE x FRAME_SIZE pixels: 4 of 128 x 128, two temporal patches of 4 x 4 tokens, so
32 tokens, each patch alike to one of the toy's images (at 64 x 64, 8 tokens, the tiny model told the videos hardly
apart: a mean cosine of 0.97 between the pool's videos after Stage I, hit@1 at chance). It shows one large object (a
SEEN colour-shape pair, so no UNSEEN pair is ever drawn) that moves right, left, up or down by 56 pixels, from one
half of the frame's tokens into the other, or stays where it is; it is captioned "a red circle moves to the right"
and asked "Which way does the red circle move?". A page is a short report on a white sheet of 128 x 192 pixels (4 x
6 tokens): a title, a figure (a two-object scene drawn as the image families draw one, 128 pixels a side) and a line
of text per object ("red circle: top left"); it is retrieved by a question it answers ("Where is the red circle in
the report that also shows a blue square?"). The tiny model's tokens are 32 pixels wide and the lines' type 8 pixels
high: it cannot read them and can only find a page by its figure, so this family tests the document layout, the page
pool and nDCG@5, not reading. Every video and page is in distribution (SEEN pairs, new draws).

Written under out_dir (prepare.py's):
- train_video.jsonl: video retrieval rows (query: the caption under MSR-VTT's instruction; positive and 5 hard
  negatives: videos, those sharing the most of colour, shape and motion first) and video QA rows (query: the video
  and the question with its five lettered options, as NExTQA's are written; positive: the answer; negatives: the
  other four options); train_docs.jsonl: page retrieval rows (query: the question under ViDoRe's instruction;
  positive and 5 hard negatives: pages, those sharing an object first). Texts are those eval.py gives the same
  tasks (readers/mmeb_v2_data.py), so training and evaluation meet the same prompts.
- images/train/{VID-RET,VID-QA}/<i>/frame_<k>.png, images/train/DOC/<i>.png: their videos and pages.
- v2/ (eval.py's v2_dir, config/shapes_eval.py):
    own_tasks.json                                   {"Shapes-VID-RET": "MSR-VTT", ...}: each task's layout
    annotations/Shapes-VID-RET/README.md, test_1k.json    MSR-VTT's: config test_1k, {video_id, video, caption}
    annotations/Shapes-VID-QA/MC/test-00000-of-00001.parquet   NExTQA's: video, question, answer, qid, a0..a4
    annotations/Shapes-DOC-RET/README.md, {corpus,queries,qrels}/test-00000-of-00001.parquet   ViDoRe's BEIR
    video-tasks/frames/Shapes-VID-RET/<video_id>/, video-tasks/frames/Shapes-VID-QA/<video>/   the frames
    visdoc-tasks/Shapes-DOC-RET/<corpus-id>.png      the pages (also as bytes in the corpus, as ViDoRe's)
  Shapes-VID-RET ranks every query against its num_eval videos (eval_type global, hit@1: chance 1 in num_eval),
  Shapes-VID-QA each question's five options (local, hit@1: chance 20), Shapes-DOC-RET against the num_eval pages
  (global, nDCG@5 over one relevant page).
"""
import io
import json
import os
import random
import sys

import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image, ImageDraw, ImageFont

import common
from readers.mmeb_v2_data import (OWN_TASKS, PAGE_QUERY, PAGE_TARGET, RETRIEVAL, VIDEO_TARGET, prompt, qa_prompt,
                                  with_options)
from shapes.prepare import BACKGROUND, CELLS, COLOURS, SEEN, draw_shape, random_scene, render

FRAMES = 4  # a video's frames
FRAME_SIZE = 128  # pixels a side, as the toy's images: 4 x 4 tokens of 32 pixels a temporal patch, 32 in all
RADIUS = 28  # a moving object's radius, pixels (the image families' objects: 19 to 29 in scenes, 38 to 58 alone)
TRAVEL = 56  # pixels a moving object travels: from the left (top) half of the frame's tokens into the right (bottom)
MOTIONS = {  # name: (dx, dy) over the whole video, the caption's words, the answer's words
    "right": ((1, 0), "moves to the right", "to the right"),
    "left": ((-1, 0), "moves to the left", "to the left"),
    "up": ((0, -1), "moves up", "up"),
    "down": ((0, 1), "moves down", "down"),
    "still": ((0, 0), "stays where it is", "it does not move")}
PAGE_WIDTH, PAGE_HEIGHT = 128, 192  # 4 x 6 tokens: the configs' max_pixels (128 * 192) keeps a page whole
FIGURE = 128  # the page's figure, pixels a side: a scene as the image families draw one
TITLE_SIZE, FONT_SIZE = 11, 8  # pixels: the title's and the lines' type (a line is at most 99 pixels wide)
NEGATIVES = 5  # hard negatives of a retrieval row
TASKS = {"Shapes-VID-RET": "MSR-VTT", "Shapes-VID-QA": "NExTQA", "Shapes-DOC-RET": "ViDoRe_arxivqa"}
# each eval task and the MMEB-V2 task whose layout, parser and metric it takes (eval.py reads v2/own_tasks.json)
V2_DIR = "v2"  # under out_dir: eval.py's v2_dir for the toy
TRAIN_FILES = {"video": "train_video.jsonl", "docs": "train_docs.jsonl"}  # under out_dir
RETRIEVAL_INSTRUCTION = RETRIEVAL["msrvtt"][0]  # "Find a video that contains the following visual content:"


# -----------------------------------------------------------------------------
# videos: (colour, shape, motion) -> FRAMES frames in a folder

def article(word):
    return "an" if word[0] in "aeiou" else "a"


def caption(colour, shape, motion):
    return f"{article(colour)} {colour} {shape} {MOTIONS[motion][1]}"


def question(colour, shape):
    return f"Which way does the {colour} {shape} move?"


def render_video(colour, shape, motion, rng, folder):
    """Write the video's frames as folder/frame_1.png ... frame_<FRAMES>.png (natural order is frame order): the
    object starts where its whole path stays inside the frame and moves TRAVEL pixels, the same step a frame."""
    os.makedirs(folder, exist_ok=True)
    (dx, dy), _, _ = MOTIONS[motion]
    low, high = RADIUS + 1, FRAME_SIZE - RADIUS - 1  # the centre's range that keeps the object whole
    x = rng.uniform(low + TRAVEL * max(-dx, 0), high - TRAVEL * max(dx, 0))
    y = rng.uniform(low + TRAVEL * max(-dy, 0), high - TRAVEL * max(dy, 0))
    for k in range(FRAMES):
        step = TRAVEL * k / (FRAMES - 1)
        frame = Image.new("RGB", (FRAME_SIZE, FRAME_SIZE), BACKGROUND)
        draw_shape(ImageDraw.Draw(frame), shape, x + dx * step, y + dy * step, RADIUS, COLOURS[colour])
        frame.save(os.path.join(folder, f"frame_{k + 1}.png"), compress_level=1)


def draw_videos(rng, count, folder, distinct=False, prefix="video"):
    """`count` videos under folder/<prefix><i>/ -> [(colour, shape, motion, name)]. distinct: no two share colour,
    shape and motion (an evaluation pool, where two videos of one caption would make its gold ambiguous)."""
    everything = [(c, s, m) for c, s in SEEN for m in MOTIONS]
    if distinct and count > len(everything):
        raise ValueError(f"{count} distinct videos asked for, but there are {len(everything)} (colour, shape, motion)")
    chosen = rng.sample(everything, count) if distinct else [rng.choice(everything) for _ in range(count)]
    videos = []
    for i, (colour, shape, motion) in enumerate(chosen):
        name = f"{prefix}{i}"
        render_video(colour, shape, motion, rng, os.path.join(folder, name))
        videos.append((colour, shape, motion, name))
    return videos


def closest_first(rng, items, k, shared):
    """The items other than item k whose key differs from its own, those sharing the most (shared(a, b)) first,
    ties in random order: hard negatives."""
    others = [j for j in range(len(items)) if shared(items[j], items[k]) is not None]
    rng.shuffle(others)
    others.sort(key=lambda j: -shared(items[j], items[k]))
    return others


def video_overlap(a, b):
    """How many of colour, shape and motion two videos share; None when all three (one caption for both)."""
    same = sum(x == y for x, y in zip(a[:3], b[:3]))
    return None if same == 3 else same


def lettered_options(rng):
    """The five answers in a random order -> (their texts, the motions they answer)."""
    motions = list(MOTIONS)
    rng.shuffle(motions)
    return [MOTIONS[m][2] for m in motions], motions


def video_rows(rng, retrieval, qa, folder):
    """Plain-layout rows of the two video formats; folder: the videos' folder relative to image_dir."""
    rows, target = [], prompt(VIDEO_TARGET, video=True)
    for k, (colour, shape, motion, name) in enumerate(retrieval):
        hard = closest_first(rng, retrieval, k, video_overlap)[:NEGATIVES]
        rows.append({"query": prompt(RETRIEVAL_INSTRUCTION, caption(colour, shape, motion)), "positive": target,
                     "positive_video": f"{folder}/VID-RET/{name}", "negatives": [target] * len(hard),
                     "negative_videos": [f"{folder}/VID-RET/{retrieval[j][3]}" for j in hard]})
    for colour, shape, motion, name in qa:
        options, motions = lettered_options(rng)
        text, _ = with_options(qa_prompt(question(colour, shape)), options)
        answer = motions.index(motion)
        rows.append({"query": text, "query_video": f"{folder}/VID-QA/{name}", "positive": options[answer],
                     "negatives": [o for j, o in enumerate(options) if j != answer]})
    return rows


# -----------------------------------------------------------------------------
# pages: a two-object scene -> a report page

def page_question(scene, asked):
    """The question a page answers about its object `asked`, naming the other object too."""
    (colour, shape), (other_colour, other_shape) = scene[asked][:2], scene[1 - asked][:2]
    return (f"Where is the {colour} {shape} in the report that also shows {article(other_colour)} {other_colour} "
            f"{other_shape}?")


def render_page(scene, title, rng):
    """A white page: the title, the scene's figure (FIGURE pixels, prepare.render's drawing), a line per object."""
    page = Image.new("RGB", (PAGE_WIDTH, PAGE_HEIGHT), (255, 255, 255))
    draw = ImageDraw.Draw(page)
    draw.text((4, 3), title, fill=(0, 0, 0), font=ImageFont.load_default(size=TITLE_SIZE))
    page.paste(render(scene, rng, FIGURE), ((PAGE_WIDTH - FIGURE) // 2, 20))
    for line, (colour, shape, _, cell) in enumerate(scene):
        draw.text((8, FIGURE + 28 + 14 * line), f"{colour} {shape}: {CELLS[cell]}", fill=(0, 0, 0),
                  font=ImageFont.load_default(size=FONT_SIZE))
    return page


def draw_pages(rng, count, distinct=False):
    """`count` pages -> [(scene, the object asked about (0 or 1), PIL page)]. distinct: no two pages show the same
    two colour-shape pairs (an evaluation corpus, where each question has one relevant page)."""
    pages, seen = [], set()
    while len(pages) < count:
        scene, _ = random_scene(rng, 2, False)
        pairs = frozenset(o[:2] for o in scene)
        if distinct and pairs in seen:
            continue
        seen.add(pairs)
        pages.append((scene, rng.randrange(2), render_page(scene, f"Report {len(pages) + 1}", rng)))
    return pages


def page_overlap(a, b):
    """How many colour-shape pairs two pages share; None when both (the same question would fit either)."""
    same = len({o[:2] for o in a[0]} & {o[:2] for o in b[0]})
    return None if same == 2 else same


def doc_rows(rng, pages, folder):
    """Plain-layout page retrieval rows; folder: the pages' folder relative to image_dir."""
    rows, target = [], prompt(PAGE_TARGET, image=True)
    for k, (scene, asked, _) in enumerate(pages):
        hard = closest_first(rng, pages, k, page_overlap)[:NEGATIVES]
        rows.append({"query": prompt(PAGE_QUERY, page_question(scene, asked)), "positive": target,
                     "positive_image": f"{folder}/{k:05d}.png", "negatives": [target] * len(hard),
                     "negative_images": [f"{folder}/{j:05d}.png" for j in hard]})
    return rows


# -----------------------------------------------------------------------------
# the evaluation tasks, each in its MMEB-V2 task's layout

def write_parquet(path, rows, schema):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=pa.schema(schema)), path)


def write_card(folder, configs):
    """A dataset card README.md whose YAML header lists {config: {split: file pattern}}, as the hub's do."""
    lines = ["---", "configs:"]
    for config, splits in configs.items():
        lines += [f"- config_name: {config}", "  data_files:"]
        lines += [f"  - split: {split}\n    path: {pattern}" for split, pattern in splits.items()]
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "README.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines + ["---", "The toy's own task in an MMEB-V2 task's layout (shapes/media_tasks.py)."])
                + "\n")


def write_video_retrieval(v2_dir, name, rng, count):
    """MSR-VTT's layout: a card with config test_1k, a JSON array of {video_id, video, caption}, one caption a
    video, and video-tasks/frames/<name>/<video_id>/."""
    videos = draw_videos(rng, count, os.path.join(v2_dir, "video-tasks", "frames", name), distinct=True)
    folder = os.path.join(v2_dir, "annotations", name)
    write_card(folder, {"test_1k": {"test": "test_1k.json"}})
    with open(os.path.join(folder, "test_1k.json"), "w", encoding="utf-8") as f:
        json.dump([{"video_id": v, "video": f"{v}.mp4", "caption": caption(c, s, m)} for c, s, m, v in videos], f)


def write_video_qa(v2_dir, name, rng, count):
    """NExTQA's layout: MC/test-00000-of-00001.parquet (no card: the config is the folder) of {video (a number),
    frame_count, width, height, question, answer (the option's number), qid, type, a0..a4}, and
    video-tasks/frames/<name>/<video>/."""
    frames = os.path.join(v2_dir, "video-tasks", "frames", name)
    rows = []
    for qid, (colour, shape, motion, _) in enumerate(draw_videos(rng, count, frames, prefix="")):  # video <qid>
        options, motions = lettered_options(rng)
        rows.append({"video": qid, "frame_count": FRAMES, "width": FRAME_SIZE, "height": FRAME_SIZE,
                     "question": question(colour, shape), "answer": motions.index(motion), "qid": qid,
                     "type": "motion", **{f"a{k}": option for k, option in enumerate(options)}})
    numbers = [(k, pa.int64()) for k in ("video", "frame_count", "width", "height")]
    write_parquet(os.path.join(v2_dir, "annotations", name, "MC", "test-00000-of-00001.parquet"), rows,
                  numbers + [("question", pa.string()), ("answer", pa.int64()), ("qid", pa.int64()),
                             ("type", pa.string())] + [(f"a{k}", pa.string()) for k in range(len(MOTIONS))])


def write_page_retrieval(v2_dir, name, rng, count):
    """ViDoRe's BEIR layout: a card with configs corpus, queries and qrels, each test-00000-of-00001.parquet:
    corpus {corpus-id, image: {bytes, path}}, queries {query-id, query}, qrels {query-id, corpus-id, score}, the ids
    int64; one query a page, its page relevant with score 1. The pages also as visdoc-tasks/<name>/<corpus-id>.png,
    where VLM2Vec's download puts them."""
    pages_dir = os.path.join(v2_dir, "visdoc-tasks", name)
    os.makedirs(pages_dir, exist_ok=True)
    corpus, queries, qrels = [], [], []
    for k, (scene, asked, page) in enumerate(draw_pages(rng, count, distinct=True)):
        buffer = io.BytesIO()
        page.save(buffer, format="PNG", compress_level=1)
        with open(os.path.join(pages_dir, f"{k}.png"), "wb") as f:
            f.write(buffer.getvalue())
        corpus.append({"corpus-id": k, "image": {"bytes": buffer.getvalue(), "path": f"{k}.png"}})
        queries.append({"query-id": k, "query": page_question(scene, asked)})
        qrels.append({"query-id": k, "corpus-id": k, "score": 1})
    folder = os.path.join(v2_dir, "annotations", name)
    write_card(folder, {config: {"test": f"{config}/test-*"} for config in ("corpus", "queries", "qrels")})
    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])  # Hugging Face's Image feature
    for config, rows, schema in (("corpus", corpus, [("corpus-id", pa.int64()), ("image", image)]),
                                 ("queries", queries, [("query-id", pa.int64()), ("query", pa.string())]),
                                 ("qrels", qrels, [("query-id", pa.int64()), ("corpus-id", pa.int64()),
                                                   ("score", pa.int64())])):
        write_parquet(os.path.join(folder, config, "test-00000-of-00001.parquet"), rows, schema)


# -----------------------------------------------------------------------------

def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)


def prepare_media(out_dir, image_dir, seed=0, num_train=300, num_eval=100):
    """Write the video and document families under out_dir (the file docstring): num_train training rows over
    video retrieval, video QA and page retrieval, num_eval queries a task. -> {"train_video", "train_docs", "v2"}"""
    if num_train < 3 * (NEGATIVES + 1) or num_eval < NEGATIVES + 1:
        raise ValueError(f"num_media must be at least {3 * (NEGATIVES + 1)} and num_eval at least {NEGATIVES + 1}: "
                         "a retrieval row's hard negatives are other rows' videos and pages")
    counts = [num_train // 3 + (k < num_train % 3) for k in range(3)]  # video retrieval, video QA, pages
    train = os.path.join(image_dir, "train")
    retrieval = draw_videos(random.Random(f"{seed}/train/VID-RET"), counts[0], os.path.join(train, "VID-RET"))
    qa = draw_videos(random.Random(f"{seed}/train/VID-QA"), counts[1], os.path.join(train, "VID-QA"))
    pages = draw_pages(random.Random(f"{seed}/train/DOC"), counts[2])
    os.makedirs(os.path.join(train, "DOC"), exist_ok=True)
    for k, (_, _, page) in enumerate(pages):
        page.save(os.path.join(train, "DOC", f"{k:05d}.png"), compress_level=1)
    paths = {key: os.path.join(out_dir, name) for key, name in TRAIN_FILES.items()}
    write_jsonl(paths["video"], video_rows(random.Random(f"{seed}/train/video rows"), retrieval, qa, "train"))
    write_jsonl(paths["docs"], doc_rows(random.Random(f"{seed}/train/doc rows"), pages, "train/DOC"))

    v2_dir = os.path.join(out_dir, V2_DIR)
    for name, write in zip(TASKS, (write_video_retrieval, write_video_qa, write_page_retrieval)):
        write(v2_dir, name, random.Random(f"{seed}/{name}"), num_eval)
    with open(os.path.join(v2_dir, OWN_TASKS), "w", encoding="utf-8") as f:
        json.dump(TASKS, f, indent=1)
    return {"train_video": paths["video"], "train_docs": paths["docs"], "v2": v2_dir}


if __name__ == "__main__":  # a library: it says what it is and what runs it
    common.library_help(__doc__, sys.argv[1:])
