"""
readers/mmeb_v2_rows.py: an MMEB-V2 video or visual-document task read from a local copy (readers/mmeb_v2_data.py
says which and where), built as VLM2Vec-V2's parser builds it: the query texts and videos, the de-duplicated
candidate pool, the gold names, graded relevances (visdoc) and, for eval_type local, each row's own candidates.

    task = read_v2_task("data/MMEB-V2", "MSR-VTT")     # the dict below; skip_bad_rows=True counts bad rows instead
    select_v2_tasks("data/MMEB-V2", ["VID_QA"])        # eval.py's v2_tasks -> task keys; check_v2_tasks: --check_data
    task["queries"][0]     # {"text": "Find a video that contains the following visual content: a cat", ...}
    task["candidates"][0]  # {"text": "<|video_1|> Understand the content of the provided video.", "image": None,
                           #  "video": [".../video7020/frame_0001.jpg", ...]}: every frame of the folder, sorted

The task dict: name, queries and query_ids (the row's number in the annotations; visdoc: the query-id),
candidates and candidate_names (the pool: every row's candidates and then the corpus, the first of each name kept,
in that order), labels (gold names per query), rel_scores (visdoc: the qrels' graded scores, aligned with labels;
else None), local (eval_type local: each row's candidate names as it lists them; else None) and report (files,
rows, skips, frames, pages, unreachable golds).
An item is {"text", "image", "video"}: the text holds media.VIDEO_MARKER or IMAGE_MARKER where VLM2Vec-V2 puts
<|video_pad|> or <|image_pad|>, the same text after it; "video" is the full frame list (the Preprocessor picks
frames: VLM2Vec-V2 keeps 8 evenly spaced, report["frame_budget"]). A visdoc pool is a read-only sequence whose
item i is built when asked for: a page is kept as its path or its compressed bytes, and each access opens a fresh
(lazily decoded) PIL image, so the pool's pixels never all sit in memory at once.
"""
import hashlib
import io
import os
from collections.abc import Sequence

from PIL import Image

from common import UserError
from readers import mmeb_v2
from readers.hf_files import annotation_files, rows
from readers.mmeb_v2_data import (CLS_INSTRUCTIONS, LABELS, MRET_QUERY, PAGE_QUERY, PAGE_TARGET, RETRIEVAL,
                                  SEEKER_QUERY, SEEKER_TARGET, V2_TASKS, VIDEO_TARGET, annotation_folder, bad_row,
                                  find_v2_tasks, first_root, index, item, new_report, option_text, own_tasks,
                                  prompt, qa_prompt, string, strings, v2_reader, value, video_frames, with_options)
from media import natural_key
from readers.records import BadRow, is_junk
from readers.reports import summary

# -----------------------------------------------------------------------------
# one row -> (query item, [(candidate name, candidate item), ...] as the row lists them, gold names)


def video_classification(record, root, task):
    video_id, label = string(record, "video_id"), string(record, "pos_text")
    frames = video_frames(os.path.join(root, video_id), "video_id")
    query = item(prompt(CLS_INSTRUCTIONS[task.extra["dataset"]], video=True), video=frames)
    names = [label]
    if task.parser == "ssv2":  # the row's own choices (neg_text holds the positive too), scored locally
        names = strings(record, "neg_text")  # a label not among them: a miss, as VLM2Vec scores it (counted)
    return query, [(name, item(name)) for name in names], [label]


def video_retrieval(record, root, task):
    instruction, name_column, caption_column, listed = RETRIEVAL[task.parser]
    name = string(record, name_column)
    if task.parser == "didemo":  # its `video` is a file name: the frame folder is its stem
        name = os.path.splitext(os.path.basename(name))[0]
    caption = strings(record, caption_column) if listed else string(record, caption_column)
    if listed and not caption:
        raise BadRow(caption_column, "no caption", "no caption")
    frames = video_frames(os.path.join(root, name), name_column)
    query = item(prompt(instruction, caption[0] if listed else caption))
    return query, [(name, item(prompt(VIDEO_TARGET, video=True), video=frames))], [name]


def moment_retrieval(record, root, task):
    """The query video is <video>/query/; every other folder beside it is a candidate clip, named by its path
    (root joined, as VLM2Vec names it), the one named positive* the gold one."""
    text = string(record, "query")
    folder = os.path.join(root, os.path.splitext(os.path.basename(string(record, "video_path")))[0])
    query = item(prompt(MRET_QUERY, text, video=True), video=video_frames(os.path.join(folder, "query"), "video_path"))
    clips = sorted((n for n in os.listdir(folder) if n != "query" and not is_junk(n)
                    and os.path.isdir(os.path.join(folder, n))), key=natural_key)
    positives = [os.path.join(folder, n) for n in clips if n.startswith("positive")]
    if len(positives) != 1:
        raise BadRow("video_path", f"{len(positives)} positive* clip folders in {folder}, one needed",
                     "not one positive clip")
    candidates = [(os.path.join(folder, n), item(prompt(VIDEO_TARGET, video=True),
                                                 video=video_frames(os.path.join(folder, n), "video_path")))
                  for n in clips]
    return query, candidates, positives


def clip_folder(root, path):
    """A MomentSeeker clip (a video path) -> its frame folder, which is also its name."""
    return os.path.join(root, "video_frames", path.replace("/", "_").split(".mp4")[0])


def momentseeker(record, root, task):
    """The query is text, text and an image (input_frames *.jpg), or text and a video (*.mp4); the candidates
    are the positive clips then the negative ones, each with all its frames."""
    text, given = string(record, "query"), record.get("input_frames") or ""
    if not isinstance(given, str):
        raise BadRow("input_frames", f"expected a path, got {given!r}", "not a string")
    if given.endswith(".mp4"):
        folder = os.path.join(root, "video_frames", given.split(".mp4")[0].replace("/", "_"))
        query = item(prompt(SEEKER_QUERY["video"], text, video=True), video=video_frames(folder, "input_frames"))
    elif given.endswith(".jpg"):
        image = os.path.join(root, f"query_{given}")
        if not os.path.isfile(image):
            raise BadRow("input_frames", f"no query image {image}", "missing query image")
        query = item(prompt(SEEKER_QUERY["image"], text, image=True), image=image)
    else:
        query = item(prompt(SEEKER_QUERY["text"], text))
    names = {}
    for field in ("positive_frames", "negative_frames"):
        clips = value(record, field)
        if not isinstance(clips, list) or not all(isinstance(c, dict) and isinstance(c.get("output_path"), str)
                                                  for c in clips):
            raise BadRow(field, f"expected a list of {{'output_path': ...}}, got {str(clips)[:80]!r}", "not clips")
        names[field] = [clip_folder(root, c["output_path"]) for c in clips]
    if not names["positive_frames"]:
        raise BadRow("positive_frames", "no positive clip", "no positive clip")
    candidates = [(name, item(prompt(SEEKER_TARGET, video=True), video=video_frames(name, field)))
                  for field in names for name in names[field]]
    return query, candidates, names["positive_frames"]


def videomme(record, root, task):
    options, answer = strings(record, "options"), string(record, "answer")
    if answer not in ("A", "B", "C", "D") or "ABCD".index(answer) >= len(options):
        raise BadRow("answer", f"{answer!r} names none of the {len(options)} options", "answer not an option")
    frames = video_frames(os.path.join(root, string(record, "videoID")), "videoID")
    query = item(qa_prompt(string(record, "question") + "\n" + "\n".join(options)), video=frames)
    return query, [(o, item(option_text(o))) for o in options], [options["ABCD".index(answer)]]


def nextqa(record, root, task):
    options = [string(record, f"a{k}") for k in range(5)]
    answer = index(record, "answer", len(options))
    frames = video_frames(os.path.join(root, string(record, "video")), "video")
    text, _ = with_options(qa_prompt(string(record, "question")), options)
    return item(text, video=frames), [(o, item(o)) for o in options], [options[answer]]


def egoschema(record, root, task):
    options = strings(record, "option")
    answer = index(record, "answer", len(options))
    frames = video_frames(os.path.join(root, string(record, "video_idx")), "video_idx")
    query = item(qa_prompt(string(record, "question") + " ".join(options)), video=frames)  # no space between: V's
    return query, [(o, item(option_text(o))) for o in options], [options[answer]]


def mvbench(record, root, task):
    options, answer = strings(record, "candidates"), string(record, "answer")
    frames = video_frames(os.path.join(root, record["subset"], string(record, "video")), "video")
    text, lettered = with_options(qa_prompt(string(record, "question")), options)
    # qa_template keeps the last equal candidate; an answer none of them equals is "(@) answer" there (the letter
    # before A), which no option is: a miss
    gold = lettered[len(options) - 1 - options[::-1].index(answer)] if answer in options else f"(@) {answer}"
    return item(text, video=frames), [(o, item(o)) for o in lettered], [gold]


def activitynetqa(record, root, task):
    answer = string(record, "answer")  # other than yes or no: a miss, as VLM2Vec scores it (counted)
    frames = video_frames(os.path.join(root, "v_" + string(record, "video_name")), "video_name")
    query = item(qa_prompt(string(record, "question") + "? (A) yes; (B) no."), video=frames)
    return query, [(o, item(o)) for o in ("yes", "no")], [answer]


ROW_PARSERS = {"video_classification": video_classification, "ssv2": video_classification,
               "moment_retrieval": moment_retrieval, "momentseeker": momentseeker, "videomme": videomme,
               "nextqa": nextqa, "egoschema": egoschema, "mvbench": mvbench, "activitynetqa": activitynetqa,
               **dict.fromkeys(RETRIEVAL, video_retrieval)}
ROW_COLUMNS = ("video_id", "pos_text", "neg_text", "video", "caption", "id", "video_path", "sentence", "videoID",
               "enCap", "query", "input_frames", "positive_frames", "negative_frames", "question", "options",
               "answer", "question_id", "a0", "a1", "a2", "a3", "a4", "qid", "video_idx", "option", "candidates",
               "video_name")  # what the parsers read, of every layout (a file has one parser's)

# -----------------------------------------------------------------------------
# reading a task


class Pool:
    """The candidate pool: names in the order first seen, the first item of each name kept."""

    def __init__(self):
        self.names, self.items, self.seen = [], [], set()

    def add(self, name, candidate):
        if name not in self.seen:
            self.seen.add(name)
            self.names.append(name)
            self.items.append(candidate)


class Pages(Sequence):
    """A visdoc pool: item i is {"text": PAGE_TARGET behind the image marker, "image": ...} built on each access,
    its image the page's file path or a PIL image freshly opened on its bytes (decoded when first used), so an
    eval that drops its items drops their pixels too."""

    def __init__(self, sources):
        self.sources = sources  # per page: a path (str) or the image file's bytes

    def __len__(self):
        return len(self.sources)

    def __getitem__(self, k):
        if isinstance(k, slice):
            return [self[j] for j in range(*k.indices(len(self)))]
        source = self.sources[k]
        image = source if isinstance(source, str) else Image.open(io.BytesIO(source))
        return item(prompt(PAGE_TARGET, image=True), image=image)


def read_video_task(v2_dir, name, task, skip_bad_rows):
    folder = annotation_folder(v2_dir, name, task)
    root = first_root(v2_dir, task)
    if root is None:
        tried = " or ".join(os.path.join(v2_dir, r) for r in task.roots)
        raise UserError(f"{name}: no frames at {tried}: unpack MMEB-V2's video-tasks/frames archives there")
    report = new_report(name, task, folder)
    report.update(root=root, frame_budget=dict(zip(("query", "candidates"), task.extra["budget"])))
    groups = []  # (files, subset): MVBench concatenates its 20 subsets, each marked with its name
    for config in task.config if isinstance(task.config, tuple) else (task.config,):
        files, report["chosen_by"] = annotation_files(folder, config, task.split)
        groups.append((files, config))
    queries, query_ids, labels, local, pool = [], [], [], [], Pool()
    limit, count = task.extra.get("num_sample"), 0
    for files, subset in groups:
        for path, location, record in rows(files, ROW_COLUMNS, None if limit is None else limit - count):
            report["files"][path] = report["files"].get(path, 0) + 1
            count += 1
            try:
                if isinstance(record, BadRow):
                    raise record
                if task.parser == "mvbench":
                    record = dict(record, subset=subset)
                query, candidates, gold = ROW_PARSERS[task.parser](record, root, task)
            except BadRow as error:
                bad_row(report, name, path, location, error, skip_bad_rows)
                continue
            queries.append(query)
            query_ids.append(str(count - 1))
            labels.append(gold)
            local.append([n for n, _ in candidates])
            if not set(gold) & set(local[-1]):  # an answer none of the row's options is: scored a miss, as VLM2Vec
                report["unreachable"] = report.get("unreachable", 0) + 1
            for candidate_name, candidate in candidates:
                pool.add(candidate_name, candidate)
    if task.parser == "video_classification":  # the corpus: every class, after the rows' own labels
        for label in LABELS[task.extra["dataset"]]:
            pool.add(label, item(label))
    lengths = [len(i["video"]) for i in queries + pool.items if i["video"]]
    report.update(rows=count, queries=len(queries), candidates=len(pool.names),
                  frames={"videos": len(lengths), "min": min(lengths, default=0), "max": max(lengths, default=0)})
    return {"name": name, "queries": queries, "query_ids": query_ids, "candidates": pool.items,
            "candidate_names": pool.names, "labels": labels, "rel_scores": None,
            "local": local if task.eval_type == "local" else None, "report": report}


def page_file(parser, corpus_id):
    """A page's file name: ViDoRe's <corpus-id>.png; VisRAG's <base[:50]>_<md5[:8]><ext>, its ids being long."""
    if parser == "vidore":
        return f"{corpus_id}.png"
    base, ext = os.path.splitext(corpus_id)
    return f"{base[:50]}_{hashlib.md5(corpus_id.encode('utf-8')).hexdigest()[:8]}{ext}"


def page_bytes(found):
    """The corpus's `image` value (Hugging Face's Image feature {"bytes", "path"}, or plain bytes) -> bytes that
    open as an image."""
    data = found.get("bytes") if isinstance(found, dict) else found
    if not isinstance(data, bytes) or not data:
        raise BadRow("image", "no image bytes", "no page image")
    try:
        with Image.open(io.BytesIO(data)):  # its header only
            pass
    except Exception as error:  # noqa: BLE001 - Pillow raises several kinds
        raise BadRow("image", f"not an image: {error}", "no page image") from None
    return data


def vlm2vec_pairing(golds, int_ids):
    """A query's golds in the order VLM2Vec's RankingMetrics pairs them with its grades (rel_scores, in the qrels'
    order): list(set(golds)). For integer ids (ViDoRe's) that order is fixed, CPython's set of those ints built in
    the qrels' order, so its published graded nDCG carries it: the golds are put in that order here, and grade i
    goes to gold i as there (a gold may so take another's grade, as it does in VLM2Vec; binary qrels are unaffected).
    For string ids (VisRAG's) the set's order follows PYTHONHASHSEED and changes from run to run: each gold keeps its
    own grade, which is VLM2Vec's reading whenever its set keeps the qrels' order."""
    if not int_ids:
        return golds
    return [str(i) for i in set(int(g) for g in golds)]


def read_visdoc_task(v2_dir, name, task, skip_bad_rows):
    """BEIR's three configs: qrels (score > 0 kept, the larger of a repeated pair), the corpus (pages from
    files beside it when there, else its bytes), then the queries (of one language, where asked)."""
    folder = annotation_folder(v2_dir, name, task)
    root = first_root(v2_dir, task)
    on_disk = {n for n in os.listdir(root) if not is_junk(n)} if root else set()
    report = new_report(name, task, folder)
    report["root"] = root

    def config_rows(config, columns, count=True):
        files, report["chosen_by"] = annotation_files(folder, config, task.split)
        for path, location, record in rows(files, columns):
            if count:
                report["files"][path] = report["files"].get(path, 0) + 1
            yield path, location, record

    qrels = {}  # query-id -> {corpus-id: score}, in the qrels' order
    int_ids = True  # ViDoRe's corpus-ids are integers (int64), VisRAG's strings: see vlm2vec_pairing
    for path, location, record in config_rows("qrels", ("query-id", "corpus-id", "score")):
        try:
            if isinstance(record, BadRow):
                raise record
            score = value(record, "score")
            if isinstance(score, bool) or not isinstance(score, (int, float)):
                raise BadRow("score", f"expected a number, got {score!r}", "not a number")
            query_id, corpus_id = string(record, "query-id"), string(record, "corpus-id")
        except BadRow as error:
            bad_row(report, name, path, location, error, skip_bad_rows)
            continue
        int_ids = int_ids and isinstance(record["corpus-id"], int)
        if score > 0:
            scores = qrels.setdefault(query_id, {})
            scores[corpus_id] = max(scores.get(corpus_id, 0), score)
    pages = {}  # corpus-id -> its file's path, or its bytes (None until read), in the corpus's order
    for path, location, record in config_rows("corpus", ("corpus-id",)):
        try:
            if isinstance(record, BadRow):
                raise record
            corpus_id = string(record, "corpus-id")
        except BadRow as error:
            bad_row(report, name, path, location, error, skip_bad_rows)
            continue
        if corpus_id not in pages:
            file = page_file(task.parser, corpus_id)
            pages[corpus_id] = os.path.join(root, file) if file in on_disk else None
    wanted = {k for k, v in pages.items() if v is None}
    if wanted:  # a second pass, for the bytes of the pages not on disk
        for path, location, record in config_rows("corpus", ("corpus-id", "image"), count=False):
            corpus_id = record.get("corpus-id") if isinstance(record, dict) else None
            if corpus_id is None or str(corpus_id) not in wanted:
                continue
            try:
                pages[str(corpus_id)] = page_bytes(value(record, "image"))
            except BadRow as error:
                bad_row(report, name, path, location, error, skip_bad_rows)
            wanted.discard(str(corpus_id))
    pages = {k: v for k, v in pages.items() if v is not None}  # a page without an image was a counted bad row
    queries, query_ids, labels, rel_scores, pool = [], [], [], [], Pool()
    language, considered = task.extra["language"], 0
    for path, location, record in config_rows("queries", ("query-id", "query", "language")):
        try:
            if isinstance(record, BadRow):
                raise record
            if language is not None and value(record, "language") != language:
                continue
            considered += 1
            query_id, text = string(record, "query-id"), string(record, "query")
            relevant = qrels.get(query_id)
            if not relevant:
                raise BadRow("query-id", f"{query_id}: no qrels with a score above 0", "no relevant page")
            for corpus_id in relevant:
                if corpus_id not in pages and page_file(task.parser, corpus_id) not in on_disk:
                    raise BadRow("query-id", f"{query_id}: its relevant page {corpus_id!r} is neither in the corpus "
                                 f"nor a file in {root or 'visdoc-tasks'}", "relevant page missing")
        except BadRow as error:
            bad_row(report, name, path, location, error, skip_bad_rows)
            continue
        queries.append(item(prompt(PAGE_QUERY, text)))
        query_ids.append(query_id)
        labels.append(vlm2vec_pairing(list(relevant), int_ids))
        rel_scores.append([float(s) for s in relevant.values()])  # the qrels' order
        for corpus_id in relevant:
            pool.add(corpus_id, pages.get(corpus_id) or os.path.join(root, page_file(task.parser, corpus_id)))
    for corpus_id, source in pages.items():
        pool.add(corpus_id, source)
    report.update(rows=considered, queries=len(queries), candidates=len(pool.names), language=language,
                  pages={"files": sum(isinstance(s, str) for s in pool.items),
                         "bytes": sum(not isinstance(s, str) for s in pool.items)})
    return {"name": name, "queries": queries, "query_ids": query_ids, "candidates": Pages(pool.items),
            "candidate_names": pool.names, "labels": labels, "rel_scores": rel_scores, "local": None,
            "report": report}


def read_v2_task(v2_dir, name, skip_bad_rows=False):
    """One MMEB-V2 video or visdoc task (a yaml key of V2_TASKS, or one of v2_dir's own: own_tasks) -> its task dict
    (the module docstring). A bad row raises UserError naming the task, file and row, or with skip_bad_rows is
    counted in report["skipped"]."""
    task = v2_reader(os.fspath(v2_dir), name)
    read = read_video_task if task.family.startswith("VID") else read_visdoc_task
    return read(os.fspath(v2_dir), name, task, skip_bad_rows)


def select_v2_tasks(v2_dir, wanted, log=print):
    """eval.py's v2_tasks (task keys, families, 'video' / 'visdoc'; [] = every scored one found, v2_dir's own tasks
    too) -> the tasks to score. An English-only ViDoRe v2 run (mmeb_v2.ENGLISH_ONLY) or one of v2_dir's own tasks
    (own_tasks) is taken by its exact name only: a family or a modality means the 78. A task named but not in v2_dir
    is an error naming what it lacks; log says which tasks are half there."""
    present, partial = find_v2_tasks(v2_dir)
    own = own_tasks(v2_dir)
    scored = [n for n in present if n in own or V2_TASKS[n].extra.get("scored", True)]
    for name, lack in partial.items():
        log(f"{name}: not scored, {lack}")
    if not wanted:
        if not scored:
            raise UserError(f"v2_dir: no MMEB-V2 video or visdoc task found in {v2_dir} (see README: the data)")
        return scored
    names = []
    for want in wanted:
        key = mmeb_v2.task_key(want)
        if want in ("video", "visdoc"):
            group = mmeb_v2.MODALITIES[want]
        elif want in mmeb_v2.FAMILIES and mmeb_v2.V2_TASKS[mmeb_v2.FAMILIES[want][0]].modality != "image":
            group = mmeb_v2.FAMILIES[want]
        elif key in V2_TASKS:
            group = (key,)
        elif want in mmeb_v2.ENGLISH_ONLY or want in own:  # scored apart from the 78, in no mean
            group = (want,)
        elif key or want == "image" or want in mmeb_v2.FAMILIES:
            raise UserError(f"v2_tasks: {want!r} is an image task or family: the image tasks are read from mmeb_dir")
        else:
            families = [f for f, names in mmeb_v2.FAMILIES.items() if mmeb_v2.V2_TASKS[names[0]].modality != "image"]
            raise UserError(f"v2_tasks: {want!r} is no MMEB-V2 video or visdoc task, family ({', '.join(families)}), "
                            "modality (video, visdoc) or English-only ViDoRe v2 run "
                            f"({', '.join(mmeb_v2.ENGLISH_ONLY)})")
        names += [n for n in group if n not in names]
    absent = [n for n in names if n not in present]
    if absent:
        raise UserError(f"v2_tasks: not in {v2_dir}: {', '.join(absent)}" +
                        "".join(f"\n  {n}: {partial[n]}" for n in absent if n in partial))
    return names


def check_v2_tasks(names, v2_dir, skip_bad_rows, log=print):
    """--check_data=True with v2_dir: every V2 task read as the evaluation reads it. -> problems (strings)"""
    problems = []
    for name in names:
        try:
            report = read_v2_task(v2_dir, name, True)["report"]
        except UserError as error:
            problems.append(str(error))
            continue
        log(f"{name}: {report['rows']} rows, {report['queries']} queries, {report['candidates']} candidates"
            + (f", skipped {summary(report['skipped'])}" if report["skipped"] else ""))
        if report["skipped"] and not skip_bad_rows:
            problems.append(f"{name}: bad rows {summary(report['skipped'])} (--skip_bad_rows=True skips them), "
                            f"e.g. {next(iter(report['examples'].values()))}")
        if not report["queries"]:
            problems.append(f"{name}: no usable rows")
    return problems
