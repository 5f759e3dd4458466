"""
readers/v2_train.py: VLM2Vec-V2's video and visual-document training sources, each record read as its own parser
reads it, into a record of the plain layout (readers/records.py) that the conversion then checks and keeps.

    {"path": "data/vlm2vec_train/.../video_caption_300k.jsonl", "parser": "llavahound_caption",
     "data_mode": "video_retrieval", "image_dir": "data/vlm2vec_train/.../train_300k", "weight": 5}   # train_data
    plain_record("llavahound_qa", {"id": ..., "video": "v_abc", "conversations": [...]})
    -> {"query": "Answer a question based on the content of a video. <|video_1|>\\nWhat ...", "query_video": "v_abc",
        "positive": "..."}

The four parsers (train_alltasks.yaml's dataset_parser; VLM2Vec-V2's src/data/dataset/*.py):
    llavahound_caption  JSON Lines {id, video, conversations: [{from, value}, ...]}; video names a folder of frames
                        under the entry's image_dir (VLM2Vec's video_frame_basedir). data_mode caption_retrieval:
                        the video and the first turn (its '<video>' the video) -> the second turn's caption;
                        video_retrieval: 'Find a video that contains the following visual content: ' + the caption
                        -> 'Understand the content of the provided video: ' and the video.
    llavahound_qa       the same files: 'Answer a question based on the content of a video. ' + the first turn
                        with the video -> the second turn's answer.
    vidore              vidore/colpali_train_set's Parquet {query, image, image_filename, answer, ...}: the page and
                        the query ('<image> query'; the prompt column left out, as VLM2Vec leaves it) -> the answer.
    visrag              openbmb/VisRAG-Ret-Train-In-domain-data's Parquet {query, image, source}: the query after
                        its source's prompt -> its source's page prompt and the page.
A page is the Parquet's image bytes, written once to the table's pages folder under its SHA-1 (a page that does not
decode is found as an image that does not decode). What differs from VLM2Vec-V2, on purpose: a video folder that is
missing or empty is a bad row (named, or counted with skip_bad_rows) where VLM2Vec passes over it silently; and
every row is kept, where its datasets.map(batch_size=128, drop_last_batch=True) drops a source's last rows % 128.
A video with fewer frames than video_frames keeps them all, as VLM2Vec's process_video_frames does. No source gives
hard negatives: the in-batch candidates are the negatives.
"""
import hashlib
import os

from media import IMAGE_MARKER, VIDEO_MARKER

VIDEO_RETRIEVAL_QUERY = "Find a video that contains the following visual content: "
VIDEO_RETRIEVAL_TARGET = "Understand the content of the provided video: "
VIDEO_QA_QUERY = "Answer a question based on the content of a video. "
VISRAG_QUERY = {  # the query's prompt by its row's source; a source not listed has none
    "NeurIPS Papers": "This query is about a research paper from NeurIPS, a leading AI/ML conference. The document "
                      "contains technical discussions, methodologies, and findings. Identify relevant papers and "
                      "sections that address the query: ",
    "Textbooks": "This query is related to a college-level textbook, which provides structured explanations, "
                 "definitions, and examples. Find the most relevant concepts or explanations that address the query: ",
    "ICML Papers": "This query is about a research paper from ICML, a leading AI/ML conference. The document contains "
                   "theoretical insights, experiments, and applications. Identify relevant papers and sections that "
                   "best answer the query: ",
    "Manuallib": "This query pertains to a product manual, which contains detailed technical specifications, usage "
                 "instructions, and troubleshooting steps. Find the most relevant section that answers the query: ",
    "ArxivQA": "This query is related to retrieving a relevant figure from an ArXiv research paper. The retrieved figure "
               "should contain scientific plots, mathematical visualizations, or experimental results that best "
               "address the query: ",
    "ChartQA": "This query is related to retrieving a relevant chart that visually represents numerical or categorical "
               "data. The retrieved chart should contain bar graphs, line charts, or other visual elements necessary "
               "to analyze trends, compare values, or extract insights related to the query: ",
    "MP-DocVQA": "This query is related to retrieving a relevant page from a multi-page document, such as reports, "
                 "invoices, or research papers. The retrieved document should contain text, tables, or structured "
                 "information necessary to answer the query: ",
    "InfoVQA": "This query is related to retrieving an infographic that visually presents statistical or factual "
               "information using charts, icons, and structured layouts. The retrieved image should contain the "
               "necessary visual elements to provide the best context for answering the query: ",
    "PlotQA": "This query relates to retrieving a relevant plot or chart that visually represents numerical data. The "
              "retrieved figure should contain the necessary information to analyze trends, compare values, or "
              "extract key insights related to the query: ",
    "SlideVQA": "This query is related to retrieving a relevant presentation slide that visually presents structured "
                "information. The retrieved slide should contain the necessary text, charts, or graphics to provide "
                "the best answer to the query: ",
}
VISRAG_TARGET = {  # the page's prompt by source
    "Textbooks": "A textbook page with structured educational content and explanations.",
    "ICML Papers": "A research paper from ICML, covering machine learning topics.",
    "NeurIPS Papers": "A research paper from NeurIPS on AI and ML topics.",
    "Manuallib": "A product manual page with technical specifications and instructions.",
    "InfoVQA": "An infographic with structured data, charts, and annotations.",
    "PlotQA": "A numerical data visualization, such as bar charts or line graphs.",
    "SlideVQA": "A presentation slide with text, bullet points, and diagrams.",
    "ArxivQA": "A figure from a research paper, including plots or experimental results.",
    "MP-DocVQA": "A page from a multi-page document with text or tables.",
    "ChartQA": "A statistical chart comparing values or analyzing trends.",
}
COLUMNS = {"llavahound_caption": ("id", "video", "conversations"), "llavahound_qa": ("id", "video", "conversations"),
           "vidore": ("query", "image", "image_filename", "answer"), "visrag": ("query", "image", "source")}
DATA_MODES = {"llavahound_caption": ("caption_retrieval", "video_retrieval")}  # the first is the default
PAGES = ("vidore", "visrag")  # the parsers that write pages


class Malformed(ValueError):
    """A record its parser cannot read: the field, the problem, the reason it is counted under."""

    def __init__(self, field, problem, reason):
        super().__init__(problem)
        self.field, self.problem, self.reason = field, problem, reason


def text(record, field):
    value = record.get(field)
    if not isinstance(value, str):
        raise Malformed(field, f"expected a string, got {type(value).__name__}", f"no {field}")
    return value


def turns(record):
    """llavahound's conversations -> (the first turn's value, the second's)."""
    conversations = record.get("conversations")
    if not (isinstance(conversations, list) and len(conversations) >= 2 and all(
            isinstance(turn, dict) and isinstance(turn.get("value"), str) for turn in conversations[:2])):
        raise Malformed("conversations", f"expected two turns {{'from', 'value'}}, got {str(conversations)[:80]!r}",
                        "not two turns")
    return conversations[0]["value"], conversations[1]["value"]


def save_page(image, folder):
    """A Parquet image cell ({"bytes", "path"}, as Hugging Face's Image feature stores it) -> the file name it is
    written under in folder: <sha1 of the bytes><its format's suffix>, written once."""
    data = image.get("bytes") if isinstance(image, dict) else None
    if not isinstance(data, (bytes, bytearray)) or not data:
        raise Malformed("image", f"expected an image cell with bytes, got {str(image)[:80]!r}", "page without bytes")
    suffix = ".png" if data[:4] == b"\x89PNG" else ".jpg" if data[:2] == b"\xff\xd8" else \
        os.path.splitext(image.get("path") or "")[1].lower() or ".png"
    name = hashlib.sha1(data).hexdigest() + suffix
    if not os.path.exists(os.path.join(folder, name)):
        tmp = os.path.join(folder, f".{name}.{os.getpid()}")
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, os.path.join(folder, name))
    return name


def plain_record(parser, record, data_mode=None, pages=None):
    """One record of a source -> a record of the plain layout, as the parser reads it (the file docstring). pages:
    the folder vidore's and visrag's pages are written to (their image paths are relative to it)."""
    if parser in ("llavahound_caption", "llavahound_qa"):
        first, second, video = *turns(record), text(record, "video")
        if parser == "llavahound_qa":
            return {"query": VIDEO_QA_QUERY + first.replace("<video>", VIDEO_MARKER), "query_video": video,
                    "positive": second}
        if (data_mode or "caption_retrieval") == "caption_retrieval":
            return {"query": first.replace("<video>", VIDEO_MARKER), "query_video": video, "positive": second}
        return {"query": VIDEO_RETRIEVAL_QUERY + second, "positive": VIDEO_RETRIEVAL_TARGET + VIDEO_MARKER,
                "positive_video": video}
    query = text(record, "query")
    if parser == "vidore":
        return {"query": f"{IMAGE_MARKER} {query}", "query_image": save_page(record.get("image"), pages),
                "positive": text(record, "answer")}
    if parser == "visrag":
        source = record.get("source")
        prompt, target = VISRAG_QUERY.get(source, ""), VISRAG_TARGET.get(source, "")
        return {"query": f"{prompt} {query} " if prompt else f"{query} ",
                "positive": f"{target}  {IMAGE_MARKER}" if target else f" {IMAGE_MARKER}",
                "positive_image": save_page(record.get("image"), pages)}
    raise ValueError(f"unknown parser {parser!r}: one of {', '.join(COLUMNS)}")
