"""
readers/mmeb_v2_data.py: what MMEB-V2's video and visual-document tasks are and where their files lie: the 18 video
and 27 visdoc tasks (24 scored) with the repos, configs, splits and folders VLM2Vec-V2 reads them from, the texts
its parsers write, the row fields and frame folders, and which tasks a download holds. readers/mmeb_v2_rows.py
builds a task from its rows; readers/hf_files.py picks a repo's files.

    present, partial = find_v2_tasks("data/MMEB-V2")   # tasks readable here; {name: what is missing} for others
    V2_TASKS["MSR-VTT"]    # Task(family='VID_RET', parser='msrvtt', repo='VLM2Vec/MSR-VTT', config='test_1k', ...)
    own_tasks("data/shapes/v2")   # your own tasks in these layouts (v2_dir/own_tasks.json): the toy's, scored apart

What is read under v2_dir (the tree of TIGER-Lab/MMEB-V2 after its download script, plus annotations/; which
files of a download hold a config and split: readers/hf_files.py):

    annotations/<repo>/            huggingface-cli download --repo-type dataset <owner>/<repo> --local-dir
                                   v2_dir/annotations/<repo> (owner VLM2Vec, vidore, openbmb or lmms-lab)
      README.md                    its YAML `configs:` (data_files per config and split), when it has them
      **/*.parquet, *.json, *.jsonl  the rows; without README configs the config is a folder (EgoSchema
                                   Subset/, NExTQA MC/, BEIR's queries/ qrels/ corpus/) or a file stem (MVBench
                                   json/<subset>.json) and the split a word of the file name or a folder
                                   (test-00000-of-00001.parquet, msvd_test.json, data/test.jsonl)
    video-tasks/frames/
      video_cls/{SSv2,HMDB51,UCF101,K700,Breakfast}/<video_id>/*.jpg
      video_ret/{MSR-VTT,MSVD,DiDeMo,YouCook2,VATEX}/<video>/                                  (VLM2Vec's yaml)
        or video_ret/data/ziyan/video_retrieval/<dataset>/frames/<video>/                      (Qwen3-VL-Embedding's)
      video_mret/{QVHighlight, Charades_STA (VLM2Vec) or Charades-STA (Qwen)}/<video>/{query,positive*,...}/
      video_mret/MomentSeeker/{video_frames/<clip path, / as _, no .mp4>/, query_<image>.jpg}
      video_qa/{Video-MME,NExTQA,EgoSchema (VLM2Vec) or egoschema (Qwen),ActivityNetQA/v_<name>}/<video>/,
        video_qa/MVBench/<subset>/<video>/
    visdoc-tasks/<image dir>/<page>  or  visdoc-tasks/images/<image dir>/<page>   (optional, either)

CONFIRMED from the official code (VLM2Vec @6e1e1d4, src/data/eval_dataset/*.py, src/utils/dataset_utils.py,
vision_utils.py, processor.py, experiments/public/eval/{video,visdoc}.yaml, src/constant/dataset_hf_path.py):
the HF repos, configs and splits; every text, instruction and option format; candidate names, labels, the pool's
order and de-duplication (base_eval_dataset.generate_cand_dataset); qrels kept when score > 0, the larger score of
a repeated pair; the frame folders and the natural sort of .jpg/.jpeg/.png; SmthSmthV2's first 1000 rows; the
classes of the global classification tasks (LABELS: video_classification_utils.py's lists, copied as data); the
ViDoRe page file <corpus-id>.png and VisRAG's <base[:50]>_<md5[:8]><ext>; Qwen3-VL-Embedding's spellings of
three frame folders and its visdoc-tasks/images/ (its download_data.sh and yaml files). From the Hugging Face
pages: some VLM2Vec/* repos hold JSON, not Parquet (SmthSmthV2 data/test.jsonl, MSVD msvd_test.json, MVBench
json/<subset>.json), EgoSchema's Subset/test-00000-of-00001.parquet, vidore's and VisRAG's BEIR folders.
ASSUMED by this project (no download was possible here; check against yours): annotations/<repo>/ as the place
of the annotation downloads; the config and split of a repo without README configs read from its folders and
file names as above; the archives' inner folder names (the yamls disagree; both are accepted); page bytes in the
corpus's `image` column (Hugging Face's Image feature: {"bytes", "path"}); SmthSmthV2's neg_text holding the
positive (INFERRED: it is scored locally on those choices).
Where this reader differs from VLM2Vec on purpose: it never extracts frames or writes pages (a missing frame
folder is an error naming it, or a counted skip); moment-retrieval clip folders are taken in natural order, not
os.listdir's (which only breaks ties differently); a row VLM2Vec would crash on or score by chance (a Video-MME
letter naming no option, no or two positive clips, a query without a qrel above 0) is a bad row, while one whose
answer is none of its options (SmthSmthV2, MVBench, ActivityNetQA) is kept and scored a miss, as there, and
counted (report["unreachable"]); hidden files (macOS '._' companions) are never frames; ids are read as text
(ViDoRe's int corpus-id 5 is named "5"; their set order, which VLM2Vec's graded nDCG depends on, is kept:
readers.mmeb_v2_rows.vlm2vec_pairing).
"""
import collections
import json
import os

from common import UserError
from media import IMAGE_MARKER, VIDEO_MARKER, frame_files
from readers.hf_files import data_files
from readers.records import BadRow

# -----------------------------------------------------------------------------
# the tasks: VLM2Vec-V2's video.yaml and visdoc.yaml, with the HF repos their parsers load

Task = collections.namedtuple("Task", "family parser repo config split roots eval_type extra")
# repo: "owner/name" (annotations/<name>/); config: a config name, a tuple of them (concatenated), or None;
# roots: the frame or page folders under v2_dir, the first that exists used; extra: parser settings


def frames_at(*relative):
    return tuple(f"video-tasks/frames/{path}" for path in relative)


def retrieval(dataset, repo=None, split="test", config=None):
    roots = frames_at(f"video_ret/{dataset}", f"video_ret/data/ziyan/video_retrieval/{dataset}/frames")
    return Task("VID_RET", dataset.lower().replace("-", ""), repo or f"VLM2Vec/{dataset}", config, split, roots,
                "global", {"budget": (None, 8)})


def classification(dataset, folder, parser="video_classification"):
    return Task("VID_CLS", parser, f"VLM2Vec/{dataset}", None, "test", frames_at(f"video_cls/{folder}"),
                "local" if parser == "ssv2" else "global",
                {"dataset": dataset, "budget": (8, None), "num_sample": 1000 if parser == "ssv2" else None})


def qa(parser, dataset, config=None, split="test", spellings=None):
    roots = frames_at(*(f"video_qa/{folder}" for folder in (spellings or (dataset,))))
    return Task("VID_QA", parser, f"VLM2Vec/{dataset}", config, split, roots, "local", {"budget": (8, None)})


MVBENCH_SUBSETS = ("episodic_reasoning", "action_sequence", "action_prediction", "action_antonym",
                   "fine_grained_action", "unexpected_action", "object_existence", "object_interaction",
                   "object_shuffle", "moving_direction", "action_localization", "scene_transition", "action_count",
                   "moving_count", "moving_attribute", "state_change", "fine_grained_pose", "character_order",
                   "egocentric_navigation", "counterfactual_inference")  # VLM2Vec's order of concatenation

VIDEO_TASKS = {
    "SmthSmthV2": classification("SmthSmthV2", "SSv2", parser="ssv2"),
    "HMDB51": classification("HMDB51", "HMDB51"),
    "UCF101": classification("UCF101", "UCF101"),
    "K700": classification("Kinetics-700", "K700"),
    "Breakfast": classification("Breakfast", "Breakfast"),
    "MSR-VTT": retrieval("MSR-VTT", config="test_1k"),
    "MSVD": retrieval("MSVD"),
    "DiDeMo": retrieval("DiDeMo"),
    "YouCook2": retrieval("YouCook2", repo="lmms-lab/YouCook2", split="val"),
    "VATEX": retrieval("VATEX"),
    "QVHighlight": Task("VID_MRET", "moment_retrieval", "VLM2Vec/QVHighlight", None, "test",
                        frames_at("video_mret/QVHighlight"), "local", {"budget": (8, 8)}),
    "Charades-STA": Task("VID_MRET", "moment_retrieval", "VLM2Vec/Charades-STA", None, "test",
                         frames_at("video_mret/Charades_STA", "video_mret/Charades-STA"), "local", {"budget": (8, 8)}),
    "MomentSeeker": Task("VID_MRET", "momentseeker", "VLM2Vec/MomentSeeker", None, "test",
                         frames_at("video_mret/MomentSeeker"), "local", {"budget": ("all", "all")}),
    "Video-MME": qa("videomme", "Video-MME"),
    "NExTQA": qa("nextqa", "NExTQA", config="MC"),
    "EgoSchema": qa("egoschema", "EgoSchema", config="Subset", spellings=("EgoSchema", "egoschema")),
    "MVBench": qa("mvbench", "MVBench", config=MVBENCH_SUBSETS, split="train"),
    "ActivityNetQA": qa("activitynetqa", "ActivityNetQA"),
}


def visdoc(family, parser, repo, image_dir, split="test", language=None, scored=True):
    roots = (f"visdoc-tasks/{image_dir}", f"visdoc-tasks/images/{image_dir}")  # VLM2Vec's, Qwen3-VL-Embedding's
    return Task(family, parser, repo, None, split, roots, "global", {"language": language, "scored": scored})


VISDOC_TASKS = {f"ViDoRe_{name}": visdoc("ViDoRe_v1", "vidore", f"vidore/{repo}", f"ViDoRe_{name}") for name, repo in (
    ("arxivqa", "arxivqa_test_subsampled_beir"), ("docvqa", "docvqa_test_subsampled_beir"),
    ("infovqa", "infovqa_test_subsampled_beir"), ("tabfquad", "tabfquad_test_subsampled_beir"),
    ("tatdqa", "tatdqa_test_beir"), ("shiftproject", "shiftproject_test_beir"),
    *((f"syntheticDocQA_{topic}", f"syntheticDocQA_{topic}_test_beir") for topic in (
        "artificial_intelligence", "energy", "government_reports", "healthcare_industry")))}
VISDOC_TASKS["ViDoRe_esg_reports_human_labeled_v2"] = visdoc(
    "ViDoRe_v2", "vidore", "vidore/esg_reports_human_labeled_v2", "esg_reports_human_labeled_v2")
for _topic in ("biomedical_lectures", "economics_reports", "esg_reports"):  # the English-only runs are not scored
    VISDOC_TASKS[f"ViDoRe_{_topic}_v2"] = visdoc("ViDoRe_v2", "vidore", f"vidore/{_topic}_v2", f"{_topic}_v2",
                                                 language="english", scored=False)
    VISDOC_TASKS[f"ViDoRe_{_topic}_v2_multilingual"] = visdoc("ViDoRe_v2", "vidore", f"vidore/{_topic}_v2",
                                                              f"{_topic}_v2_multilingual")
for _name in ("ArxivQA", "ChartQA", "MP-DocVQA", "SlideVQA", "InfoVQA", "PlotQA"):
    VISDOC_TASKS[f"VisRAG_{_name}"] = visdoc("VisRAG", "visrag", f"openbmb/VisRAG-Ret-Test-{_name}", f"VisRAG_{_name}",
                                             split="train")
for _name, _repo in (("ViDoSeek-page", "ViDoSeek-page-fixed"), ("ViDoSeek-doc", "ViDoSeek"),
                     ("MMLongBench-doc", "MMLongBench-doc"), ("MMLongBench-page", "MMLongBench-page-fixed")):
    VISDOC_TASKS[_name] = visdoc("OOD", "vidore", f"VLM2Vec/{_repo}", _name)

V2_TASKS = {**VIDEO_TASKS, **VISDOC_TASKS}  # 18 video + 27 visdoc (24 scored: extra["scored"])

# -----------------------------------------------------------------------------
# the texts, as VLM2Vec-V2's parsers write them (src/data/eval_dataset/*.py, processor.process_input_text)

CLS_INSTRUCTIONS = {
    "Kinetics-700": "Recognize the category of the video content.",
    "SmthSmthV2": "What actions or object interactions are being performed by the person in the video?",
    "UCF101": "What activities or sports are being performed by the person in the video?",
    "HMDB51": "What actions or objects interactions are the person in the video doing?",
    "Breakfast": "Recognize the breakfast type that the person is cooking in the video. ",  # its trailing space
}
RETRIEVAL = {  # parser -> (query instruction, the candidate's name column, the caption column, captions a list)
    "msrvtt": ("Find a video that contains the following visual content:", "video_id", "caption", False),
    "msvd": ("Find the video snippet that corresponds to the given summary:", "video_id", "caption", True),
    "didemo": ("Find a video that includes the following described scenes:", "video", "caption", False),
    "youcook2": ("Find a video that demonstrates the following action while making a recipe:", "id", "sentence",
                 False),
    "vatex": ("Select a video that fits the description provided:", "videoID", "enCap", True),
}
VIDEO_TARGET = "Understand the content of the provided video."
MRET_QUERY = "Find the clip that corresponds to the described scene in the given video:"
SEEKER_QUERY = {"text": "Find the clip that corresponds to the given text:",
                "image": "Select the video clip that aligns with the given text and image:",
                "video": "Find the clip that corresponds to the given sentence and video segment:"}
SEEKER_TARGET = "Understand the content of the provided video clip."
QA_PROMPT = ("Given a video and a question, select the most accurate answer from the provided candidates. "
             "Return only the exact text of your chosen answer. Question: ")
PAGE_QUERY = "Find a document image that matches the given query:"
PAGE_TARGET = "Understand the content of the provided document image."


def prompt(instruction, text="", video=False, image=False):
    """process_input_text for Qwen2-VL: the instruction, a space and the text (when there is one), behind the
    video's or image's marker and a space."""
    out = instruction + (" " + text if text else "")
    if video:
        out = VIDEO_MARKER + " " + out
    if image:
        out = IMAGE_MARKER + " " + out
    return out


def qa_prompt(question):
    """The QA parsers' process_query: marker, space, QA_PROMPT (its own trailing space), space, question."""
    return f"{VIDEO_MARKER} {QA_PROMPT} {question}"


def with_options(question, options):
    """vision_utils.qa_template's text: the question, 'Options:' and an '(A) option' line each, trailing
    whitespace cut. -> (the text, the lettered options)"""
    lettered = [f"({chr(ord('A') + k)}) {option}" for k, option in enumerate(options)]
    return (f"{question}\nOptions:\n" + "".join(line + "\n" for line in lettered)).rstrip(), lettered


def option_text(option):
    """'A. a dog' -> 'a dog', as Video-MME's and EgoSchema's parsers cut the letter off (from the first '. ')."""
    return option[option.find(". "):].strip(". ")


def item(text, image=None, video=None):
    return {"text": text, "image": image, "video": video}

# -----------------------------------------------------------------------------
# fields and frames


def value(record, field):
    if field not in record:
        raise BadRow(field, "missing column", "missing column")
    return record[field]


def string(record, field):
    """A text column, or an id (a number is read as its digits)."""
    found = value(record, field)
    if isinstance(found, bool) or not isinstance(found, (str, int)):
        raise BadRow(field, f"expected a string, got {str(found)[:80]!r}", "not a string")
    return str(found)


def strings(record, field):
    found = value(record, field)
    if not isinstance(found, (list, tuple)) or not all(isinstance(v, str) for v in found):
        raise BadRow(field, f"expected a list of strings, got {str(found)[:80]!r}", "not a list of strings")
    return list(found)


def index(record, field, count):
    """An answer given as a number (or its digits) in 0..count-1."""
    found = value(record, field)
    if isinstance(found, str) and found.strip().isdigit():
        found = int(found)
    if isinstance(found, bool) or not isinstance(found, int) or not 0 <= found < count:
        raise BadRow(field, f"expected an option number 0..{count - 1}, got {found!r}", "answer not an option")
    return found


def video_frames(folder, field):
    frames = frame_files(folder)
    if frames is None:
        raise BadRow(field, f"no frame folder {folder}", "missing frame folder")
    if not frames:
        raise BadRow(field, f"no .jpg/.jpeg/.png frames in {folder}", "empty frame folder")
    return frames


def new_report(name, task, folder):
    return {"task": name, "family": task.family, "parser": task.parser, "eval_type": task.eval_type,
            "annotations": folder, "chosen_by": "", "files": {}, "root": None, "rows": 0, "queries": 0,
            "candidates": 0, "skipped": {}, "examples": {}}


def bad_row(report, name, path, location, error, skip_bad_rows):
    """Raise a row's problem naming the task, file and row, or count it (skip_bad_rows)."""
    if not skip_bad_rows:
        raise UserError(f"{name}: {error.at(f'{path} {location}')}") from None
    report["skipped"][error.reason] = report["skipped"].get(error.reason, 0) + 1
    report["examples"].setdefault(error.reason, error.at(f"{path} {location}"))


def first_root(v2_dir, task):
    return next((os.path.join(v2_dir, r) for r in task.roots if os.path.isdir(os.path.join(v2_dir, r))), None)


def annotation_folder(v2_dir, name, task):
    folder = os.path.join(v2_dir, "annotations", task.repo.split("/")[1])
    if not os.path.isdir(folder):
        raise UserError(f"{name}: no annotations at {folder}: download them with `huggingface-cli download "
                        f"--repo-type dataset {task.repo} --local-dir {folder}`")
    return folder


def find_v2_tasks(v2_dir):
    """Which tasks v2_dir holds, its own (own_tasks) too. -> (names readable: annotations there and, for video, a
    frame folder; {name: what is missing} for a task with one part there but not the other)"""
    if not os.path.isdir(v2_dir):
        raise UserError(f"v2_dir: {v2_dir} is not a folder")
    present, partial = [], {}
    for name, task in {**V2_TASKS, **own_tasks(v2_dir)}.items():
        folder = os.path.join(v2_dir, "annotations", task.repo.split("/")[1])
        annotated = os.path.isdir(folder) and bool(data_files(folder))
        framed = first_root(v2_dir, task) is not None or not task.family.startswith("VID")
        if annotated and framed:
            present.append(name)
        elif annotated:
            partial[name] = f"no frames at {' or '.join(os.path.join(v2_dir, r) for r in task.roots)}"
        elif first_root(v2_dir, task) is not None:
            partial[name] = f"no annotations at {folder} (huggingface-cli download --repo-type dataset {task.repo})"
    return present, partial


# -----------------------------------------------------------------------------
# your own tasks in these layouts (the toy's): read and scored as the MMEB-V2 task whose layout they take, apart

OWN_TASKS = "own_tasks.json"  # in a v2_dir: {your task's name: the MMEB-V2 task whose layout it takes}


def own_tasks(v2_dir):
    """v2_dir/own_tasks.json ({"Shapes-VID-RET": "MSR-VTT", ...}) -> {name: Task}; {} when there is no such file.
    Each is read by its MMEB-V2 task's parser, config, split and eval_type (eval.py scores it by that task's metric,
    in a part of its own and in no MMEB-V2 mean), from annotations/<name>/ and video-tasks/frames/<name>/ (a video
    task) or visdoc-tasks/<name>/ (its pages). Any task's layout but a globally scored classification task's, whose
    pool is its dataset's class list (LABELS)."""
    path = os.path.join(v2_dir, OWN_TASKS)
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            declared = json.load(f)
    except (OSError, ValueError) as error:
        raise UserError(f"{path}: not a JSON file ({error})") from None
    if not isinstance(declared, dict):
        raise UserError(f"{path}: expected an object {{task name: MMEB-V2 task}}, got {type(declared).__name__}")
    tasks = {}
    for name, like in declared.items():
        base = V2_TASKS.get(like) if isinstance(like, str) else None
        if name in V2_TASKS or name in (".", "..") or not name or os.path.basename(name) != name:
            raise UserError(f"{path}: {name!r} is not a folder name, or is one of MMEB-V2's own tasks: name yours "
                            "apart")
        if base is None or base.parser == "video_classification":
            raise UserError(f"{path}: {name!r} takes the layout of {like!r}, which is not an MMEB-V2 video or visdoc "
                            "task or is a globally scored classification task (ranked against its dataset's classes); "
                            f"one of {', '.join(n for n, t in V2_TASKS.items() if t.parser != 'video_classification')}")
        root = f"video-tasks/frames/{name}" if base.family.startswith("VID") else f"visdoc-tasks/{name}"
        tasks[name] = base._replace(repo=f"own/{name}", roots=(root,), extra=dict(base.extra, like=like))
    return tasks


def v2_reader(v2_dir, name):
    """A task's name -> its Task: one of V2_TASKS, or one of v2_dir's own (own_tasks, extra["like"] naming the MMEB-V2
    task whose layout it takes)."""
    if not os.path.isdir(v2_dir):
        raise UserError(f"v2_dir: {v2_dir} is not a folder")
    task = V2_TASKS.get(name) or own_tasks(v2_dir).get(name)
    if task is None:
        raise UserError(f"{name!r} is not an MMEB-V2 video or visdoc task (one of {', '.join(V2_TASKS)}) nor one of "
                        f"{os.path.join(v2_dir, OWN_TASKS)}")
    return task


# the classes of the globally scored classification tasks, in VLM2Vec-V2's order (its video_classification_utils'
# VIDEOCLS_LABEL_MAPPING, kept as data): a global task's pool is every class, not only those its rows name
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "video_classes.json"), encoding="utf-8") as _f:
    LABELS = json.load(_f)
