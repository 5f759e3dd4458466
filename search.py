"""
search.py: nanoGPT's sample.py for embeddings. Embed a collection once into a vectors file, then search it.

    python search.py --init_from=out/shapes_stage2/export --index_images=data/shapes/images/Shapes-T2I \
        --vectors=out/shapes_t2i.safetensors
    python search.py --init_from=out/shapes_stage2/export --vectors=out/shapes_t2i.safetensors --top_k=5 \
        --sheet=out/search.png \
        --query_text="Retrieve an image that best matches the following description. a large red circle at the top left"

Indexing reads any of: a folder of images (searched recursively), a text file (one item per non-empty line), a
JSONL file (objects with "text" and/or "image", relative to the file's folder, and an optional "id"). Ids: the
image's path in the folder, "file.txt:LINE", the "id" or "file.jsonl:LINE". The vectors file is safetensors:
"vectors" (N, D) float32; its metadata holds the items as JSON, the similarity and the checkpoint. A folder image
is embedded with MMEB's image-candidate text (image_text), as in training.

A query is text and/or an image, or a file of them (.jsonl as above, else one text query per line). The top_k
items by the similarity the checkpoint was trained with (its pace.json; cosine for a plain release) are printed
as rank, score, id and text, and drawn with --sheet=path.png (--gold_id frames one id green). As in training, a
query carries its instruction in its text; the paper's (Table 5) for text -> image is "Retrieve an image that
best matches the following description.", for image -> text (with --query_image=photo.png) "Find the caption
that best describes this image.". One command may index and then query, or many may query one --vectors file.
init_from is a Hugging Face folder (a release or an export/) or a training step folder, as in eval.py.
"""
import json
import os
import sys

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

import configurator
import plot
from data import IMAGE_MARKER
from loss import similarity_matrix
from model import load_embedder

# -----------------------------------------------------------------------------
# config: every default can be overridden by a config file or --key=value
init_from = ""  # checkpoint: a Hugging Face folder, an export/ folder or a training step folder
vectors = ""  # the vectors file (.safetensors): written when indexing, read when only querying
index_images = ""  # a folder of images to index, searched recursively
index_text = ""  # a text file to index, one item per non-empty line
index_jsonl = ""  # a JSONL file to index: objects with "text" and/or "image", and an optional "id"
image_text = IMAGE_MARKER + "\nRepresent the given image."  # text beside each folder image (MMEB's); '' = none
query_text = ""  # a query's text, its instruction written in it
query_image = ""  # a query's image
queries = ""  # a file of queries instead: .jsonl as index_jsonl, else one text query per non-empty line
top_k = 5  # results per query
similarity = ""  # 'dot' (eq. 2) or 'cos' (eq. 1); '' = what the checkpoint was trained with (cos if unknown)
sheet = ""  # a PNG path: draw the queries and their results there as a retrieval sheet
gold_id = ""  # the sheet frames the result of this id green
batch_size = 16  # items per forward pass
num_workers = 4  # DataLoader worker processes (decode, resize, tokenise)
max_pixels = 1605632  # image pixel budget (paper: 1,605,632); 0 = the checkpoint's own
max_length = 8192  # tokens per item; text is truncated, never image placeholders or the template
device = "cuda" if torch.cuda.is_available() else "cpu"  # 'cuda' or 'cpu'
dtype = "bfloat16" if torch.cuda.is_available() else "float32"  # compute dtype of the model
DEFAULTS = configurator.config_keys(globals())  # main() starts from these each call, so tests can call it twice
# -----------------------------------------------------------------------------

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff")


# -----------------------------------------------------------------------------
# items: {"id", "text", "image"}, read and checked before the model loads

def folder_items(folder):
    """Every image under folder, in sorted order, its id its path relative to folder."""
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"no folder {folder!r}")
    items = []
    for root, subfolders, files in os.walk(folder):
        subfolders.sort()  # os.walk then visits them in this order
        for name in sorted(files):
            if name.lower().endswith(IMAGE_EXTENSIONS):
                path = os.path.join(root, name)
                items.append({"id": os.path.relpath(path, folder), "text": image_text, "image": os.path.abspath(path)})
    if not items:
        raise ValueError(f"no images ({' '.join(IMAGE_EXTENSIONS)}) in {folder}")
    return items


def numbered_lines(path):
    """(line number, stripped line) of each non-empty line of a UTF-8 text file."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no file {path!r}")
    with open(path, encoding="utf-8") as f:
        return [(number, line.strip()) for number, line in enumerate(f, 1) if line.strip()]


def text_items(path):
    name = os.path.basename(path)
    return [{"id": f"{name}:{number}", "text": line, "image": None} for number, line in numbered_lines(path)]


def jsonl_items(path):
    """One item per line of a JSONL file; an image path is relative to the file's folder unless absolute."""
    name, folder = os.path.basename(path), os.path.dirname(os.path.abspath(path))
    items = []
    for number, line in numbered_lines(path):
        try:
            record = json.loads(line)
        except ValueError as error:
            raise ValueError(f"{path}, line {number}: not JSON ({error})") from None
        record = record if isinstance(record, dict) else {}  # a list or a number: no text, no image
        text, image = record.get("text") or "", record.get("image") or None
        if not isinstance(text, str) or not isinstance(image, (str, type(None))) or not (text.strip() or image):
            raise ValueError(f'{path}, line {number}: expected an object with a "text" and/or an "image" string')
        if image:
            image = os.path.join(folder, image)  # an absolute path stays as it is
            if not os.path.isfile(image):
                raise FileNotFoundError(f"{path}, line {number}: no image {image!r}")
        items.append({"id": str(record.get("id", f"{name}:{number}")), "text": text, "image": image})
    return items


def index_items():
    """The items to index: index_images', index_text's and index_jsonl's, in that order."""
    items = folder_items(index_images) if index_images else []
    items += text_items(index_text) if index_text else []
    return items + (jsonl_items(index_jsonl) if index_jsonl else [])


def query_items():
    """The queries file's items, or the one query of query_text and query_image; [] when none is asked."""
    if queries:
        return jsonl_items(queries) if queries.endswith(".jsonl") else text_items(queries)
    if not (query_text or query_image):
        return []
    if not query_text.strip() and not query_image:
        raise ValueError("a query needs text or an image: --query_text=... and/or --query_image=...")
    if query_image and not os.path.isfile(query_image):
        raise FileNotFoundError(f"no query image {query_image!r}")
    return [{"id": "query", "text": query_text, "image": query_image or None}]


# -----------------------------------------------------------------------------
# the vectors file

def index(embedder, items, ranking):
    """Embed items into the vectors file. -> (vectors (N, D), items, metadata), as read_vectors gives them"""
    embeddings = embedder.encode(items, batch_size, num_workers, progress="indexing")
    metadata = {"items": json.dumps(items), "similarity": ranking, "init_from": os.path.abspath(init_from)}
    os.makedirs(os.path.dirname(os.path.abspath(vectors)), exist_ok=True)
    save_file({"vectors": embeddings}, vectors + ".tmp", metadata)
    os.replace(vectors + ".tmp", vectors)  # written aside, then renamed: a crash never leaves half a file
    print(f"wrote {len(items)} vectors of dimension {embedder.dim} to {vectors}")
    return embeddings, items, metadata


def read_vectors(path):
    """-> (vectors (N, D), items, metadata) of a file index() wrote."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no vectors file {path!r}: index first (--index_images, --index_text, --index_jsonl)")
    try:
        with safe_open(path, framework="pt") as f:
            metadata = f.metadata() or {}
            stored = f.get_tensor("vectors") if "vectors" in f.keys() else None
    except SafetensorError as error:
        raise ValueError(f"{path} is not a safetensors file ({error})") from None
    if stored is None or not {"items", "init_from"} <= metadata.keys():
        raise ValueError(f"{path} was not written by search.py (no vectors and items in it)")
    return stored, json.loads(metadata["items"]), metadata


# -----------------------------------------------------------------------------
# ranking and showing

def top(query_vectors, stored, ranking, k):
    """-> (scores (Q, k), indices (Q, k)) of the k best stored vectors for each query, best first: the scores
    training used, eq. (1) or (2) (loss.similarity_matrix)."""
    return torch.topk(similarity_matrix(query_vectors, stored, ranking), min(k, len(stored)), dim=1)


def short(text, width=70):
    """text on one line, the image marker dropped, cut to width characters."""
    text = " ".join(text.replace(IMAGE_MARKER, "").split())
    return text if len(text) <= width else text[:width - 3] + "..."


def print_results(query, results):
    image = f" [image {query['image']}]" if query["image"] else ""
    print(f"query {query['id']}: {short(query['text'], 200)}{image}")
    for rank, result in enumerate(results, 1):
        print(f"{rank:>4}  {result['score']:9.4f}  {result['id']}  {short(result['text'])}")


def draw_sheet(asked, results, ranking):
    """The queries in rows, each with its results; the result whose id is gold_id framed green (without gold_id,
    the results carry no "gold" and none is marked)."""
    rows = []
    for query, found in zip(asked, results):
        cells = [dict(result, text=f"{result['id']} {short(result['text'])}") for result in found]
        if gold_id:
            cells = [dict(cell, gold=cell["id"] == gold_id) for cell in cells]
        rows.append({"query": query, "results": cells})
    title = f"{init_from}: top {top_k} by {'cosine' if ranking == 'cos' else 'dot product'}"
    return plot.save(plot.retrieval_sheet(rows, title=title), sheet)


def answer(embedder, asked, stored, ranking):
    """Rank the stored items for each query, print them and, if asked, draw the sheet. -> each query's results"""
    stored_vectors, stored_items, metadata = stored
    if stored_vectors.shape[1] != embedder.dim:
        raise ValueError(f"{vectors} holds vectors of dimension {stored_vectors.shape[1]} made by "
                         f"{metadata['init_from']}; {init_from} makes {embedder.dim}: index again with it")
    if metadata["init_from"] != os.path.abspath(init_from):  # same dimension, maybe other weights
        print(f"note: {vectors} was indexed with {metadata['init_from']}, not {init_from}")
    query_vectors = embedder.encode(asked, batch_size, num_workers, progress="queries" if len(asked) > 1 else "")
    scores, indices = top(query_vectors, stored_vectors, ranking, top_k)
    results = [[dict(stored_items[j], score=score) for score, j in zip(row_scores, row_indices)]
               for row_scores, row_indices in zip(scores.tolist(), indices.tolist())]
    for query, found in zip(asked, results):
        print_results(query, found)
    if sheet:
        print(f"drew {draw_sheet(asked, results, ranking)}")
    return results


# -----------------------------------------------------------------------------
# the run

def main(args=None):
    """Index and/or query with config overrides `args` (default: the command line).
    -> {"similarity", "indexed": items written, "results": per query, its results {"id", "text", "image", "score"}}"""
    config = configurator.configure(dict(DEFAULTS), sys.argv[1:] if args is None else args)
    globals().update(config)  # the config globals above, read by name as in eval.py
    for key in ("init_from", "vectors"):
        if not config[key]:
            raise ValueError(f"set --{key}=...")
    if similarity not in ("", "cos", "dot"):
        raise ValueError(f"similarity must be 'cos', 'dot' or '' (the checkpoint's), got {similarity!r}")
    items, asked = index_items(), query_items()
    if not items and not asked:
        raise ValueError("nothing to do: index with --index_images, --index_text or --index_jsonl, "
                         "query with --query_text, --query_image or --queries")
    stored = None if items else read_vectors(vectors)  # a bad vectors file fails before the model loads
    _, _, _, run_device = configurator.compute_init(device)
    embedder, info = load_embedder(init_from, getattr(torch, dtype), max_length=max_length,
                                   **({"max_pixels": max_pixels} if max_pixels else {}))
    embedder.to(run_device).eval()
    print(configurator.kernel_report(run_device))
    ranking = similarity or info.get("similarity") or "cos"
    if items:
        stored = index(embedder, items, ranking)
    results = answer(embedder, asked, stored, ranking) if asked else []
    return {"similarity": ranking, "indexed": len(items), "results": results}


if __name__ == "__main__":
    configurator.install_error_hook()
    main()
