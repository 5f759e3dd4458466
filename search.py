"""
search.py: nanoGPT's sample.py for embeddings. Embed a collection once into a vectors file, then search it.

    python search.py --init_from=out/shapes_stage2/export --index_images=data/shapes/images/Shapes-T2I \\
        --vectors=out/shapes_t2i.safetensors
    python search.py --init_from=out/shapes_stage2/export --vectors=out/shapes_t2i.safetensors --top_k=5 \\
        --sheet=out/search.png \\
        --query_text="Retrieve an image that best matches the following description. a small orange triangle at the top left and a large green circle at the bottom right"

Indexing reads any of: a folder of images (searched recursively), a text file (one item per non-empty line), a
JSONL file (objects with "text" and/or "image", relative to the file's folder, and an optional "id"). Ids: the
image's path in the folder, "file.txt:LINE", the "id" or "file.jsonl:LINE". The vectors file is safetensors:
"vectors" (N, D) float32; its metadata holds the items as JSON, the similarity, the checkpoint and its
fingerprint (checkpoint.fingerprint), and a SHA-256 of the vectors. A folder image is embedded with MMEB's
image-candidate text (image_text), as in training.

A query is text and/or an image, or a file of them (.jsonl as above, else one text query per line). The top_k
items by the similarity the checkpoint was trained with (its pace.json; cosine for a plain release) are printed
as rank, score, id and text, and drawn with --sheet=path.png (--gold_id frames one id green). As in training, a
query carries its instruction in its text; the paper's (Table 5) for text -> image is "Retrieve an image that
best matches the following description.", for image -> text (with --query_image=photo.png) "Find the caption
that best describes this image.". One command may index and then query, or many may query one --vectors file.
Vectors made by another checkpoint are refused (their space is another's): index again, or
--allow_other_checkpoint=True ranks them anyway, by the similarity they were indexed for. Non-finite vectors and
a file whose vectors no longer match their checksum are refused too.
"""
import hashlib
import json
import os
import sys

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

import checkpoint
import common
import configurator
import loss
import plot
from common import UserError
from mmeb import IMAGE_MARKER, IMAGE_SUFFIXES, is_junk
from model import kernel_report

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
top_k = 5  # results per query (at least 1)
similarity = ""  # 'dot' (eq. 2) or 'cos' (eq. 1); '' = what the checkpoint was trained with (cos if unknown)
allow_other_checkpoint = False  # rank vectors another checkpoint indexed (by the similarity they were indexed for)
sheet = ""  # a PNG path: draw the queries and their results there as a retrieval sheet
gold_id = ""  # the sheet frames the result of this id green
batch_size = 16  # items per forward pass
num_workers = 4  # DataLoader worker processes (decode, resize, tokenise); at most the cores there are
max_pixels = 1605632  # image pixel budget (paper: 1,605,632); 0 = the checkpoint's own
max_length = 8192  # tokens per item; text is truncated, never image placeholders or the template
device = "cuda" if torch.cuda.is_available() else "cpu"  # 'cuda' or 'cpu'
dtype = "bfloat16" if torch.cuda.is_available() else "float32"  # compute dtype of the model
# -----------------------------------------------------------------------------


# -----------------------------------------------------------------------------
# items: {"id", "text", "image"}, read and checked before the model loads

def folder_items(folder, text):
    """Every image under folder (not hidden, not macOS's ._ files), in sorted order, its id its path relative to
    folder, each with `text` beside it."""
    if not os.path.isdir(folder):
        raise UserError(f"index_images: no folder {folder!r}")
    items = []
    for root, subfolders, files in os.walk(folder):
        subfolders.sort()  # os.walk then visits them in this order
        for name in sorted(files):
            if name.lower().endswith(IMAGE_SUFFIXES) and not is_junk(name):
                path = os.path.join(root, name)
                items.append({"id": os.path.relpath(path, folder), "text": text, "image": os.path.abspath(path)})
    if not items:
        raise UserError(f"no images ({' '.join(IMAGE_SUFFIXES)}) in {folder}")
    return items


def numbered_lines(path):
    """(line number, stripped line) of each non-empty line of a UTF-8 text file."""
    if not os.path.isfile(path):
        raise UserError(f"no file {path!r}")
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
            raise UserError(f"{path}, line {number}: not JSON ({error})") from None
        record = record if isinstance(record, dict) else {}  # a list or a number: no text, no image
        text, image = record.get("text") or "", record.get("image") or None
        if not isinstance(text, str) or not isinstance(image, (str, type(None))) or not (text.strip() or image):
            raise UserError(f'{path}, line {number}: expected an object with a "text" and/or an "image" string')
        if image:
            image = os.path.join(folder, image)  # an absolute path stays as it is
            if not os.path.isfile(image):
                raise UserError(f"{path}, line {number}: no image {image!r}")
        items.append({"id": str(record.get("id", f"{name}:{number}")), "text": text, "image": image})
    return items


def index_items(config):
    """The items to index: index_images', index_text's and index_jsonl's, in that order."""
    items = folder_items(config["index_images"], config["image_text"]) if config["index_images"] else []
    items += text_items(config["index_text"]) if config["index_text"] else []
    return items + (jsonl_items(config["index_jsonl"]) if config["index_jsonl"] else [])


def query_items(config):
    """The queries file's items, or the one query of query_text and query_image; [] when none is asked."""
    if config["queries"]:
        asked = jsonl_items(config["queries"]) if config["queries"].endswith(".jsonl") else text_items(config["queries"])
        if not asked:
            raise UserError(f"queries: {config['queries']} holds no query (every line is empty)")
        return asked
    text, image = config["query_text"], config["query_image"]
    if not (text or image):
        return []
    if not text.strip() and not image:
        raise UserError("a query needs text or an image: --query_text=... and/or --query_image=...")
    if image and not os.path.isfile(image):
        raise UserError(f"no query image {image!r}")
    return [{"id": "query", "text": text, "image": image or None}]


# -----------------------------------------------------------------------------
# the vectors file

def vectors_checksum(tensor):
    return hashlib.sha256(tensor.contiguous().numpy().tobytes()).hexdigest()


def finite_or_refuse(embeddings, items, what):
    """A UserError naming the first item whose vector is not finite (NaN would rank first)."""
    bad = (~torch.isfinite(embeddings).all(dim=1)).nonzero().flatten()
    if len(bad):
        raise UserError(f"{what}: {len(bad)} vectors are not finite, e.g. item {items[int(bad[0])]['id']!r}")


def index(embedder, items, similarity, path, init_from, batch_size, num_workers):
    """Embed items into the vectors file at path. -> (vectors (N, D), items, metadata), as read_vectors gives them"""
    embeddings = embedder.encode(items, batch_size, num_workers, progress="indexing")
    finite_or_refuse(embeddings, items, f"indexing with {init_from}")
    metadata = {"items": json.dumps(items), "similarity": similarity, "init_from": os.path.abspath(init_from),
                "fingerprint": checkpoint.fingerprint(init_from), "sha256": vectors_checksum(embeddings)}
    with common.replaced_atomically(path) as tmp:  # a crash never leaves half a file
        save_file({"vectors": embeddings}, tmp, metadata)
    print(f"wrote {len(items)} vectors of dimension {embedder.dim} to {path}")
    return embeddings, items, metadata


def read_vectors(path):
    """-> (vectors (N, D), items, metadata) of a file index() wrote, its checksum and finiteness checked."""
    if not os.path.isfile(path):
        raise UserError(f"no vectors file {path!r}: index first (--index_images, --index_text, --index_jsonl)")
    try:
        with safe_open(path, framework="pt") as f:
            metadata = f.metadata() or {}
            stored = f.get_tensor("vectors") if "vectors" in f.keys() else None
    except SafetensorError as error:
        raise UserError(f"{path} is not a safetensors file ({error})") from None
    if stored is None or not {"items", "init_from", "fingerprint", "sha256"} <= metadata.keys():
        raise UserError(f"{path} was not written by this search.py (no vectors, items, fingerprint and checksum)")
    if vectors_checksum(stored) != metadata["sha256"]:
        raise UserError(f"{path}: its vectors have changed since they were written (SHA-256): index again")
    items = json.loads(metadata["items"])
    finite_or_refuse(stored, items, path)
    return stored, items, metadata


# -----------------------------------------------------------------------------
# ranking and showing

def top(query_vectors, stored, similarity, k):
    """-> (scores (Q, k), indices (Q, k)) of the k best stored vectors for each query, best first: the scores
    training used, eq. (1) or (2) (loss.similarity_matrix)."""
    return torch.topk(loss.similarity_matrix(query_vectors, stored, similarity), min(k, len(stored)), dim=1)


def short(text, width=70):
    """text on one line, the image marker dropped, cut to width characters."""
    text = " ".join(text.replace(IMAGE_MARKER, "").split())
    return text if len(text) <= width else text[:width - 3] + "..."


def print_results(query, results):
    image = f" [image {query['image']}]" if query["image"] else ""
    print(f"{query['id']}: {short(query['text'], 200)}{image}")
    for rank, result in enumerate(results, 1):
        print(f"{rank:>4}  {result['score']:9.4f}  {result['id']}  {short(result['text'])}")


def draw_sheet(asked, results, title, path, gold_id):
    """The queries in rows, each with its results; the result whose id is gold_id framed green (without gold_id,
    the results carry no "gold" and none is marked)."""
    rows = []
    for query, found in zip(asked, results):
        cells = [dict(result, text=f"{result['id']} {short(result['text'])}") for result in found]
        if gold_id:
            cells = [dict(cell, gold=cell["id"] == gold_id) for cell in cells]
        rows.append({"query": query, "results": cells})
    return plot.save(plot.retrieval_sheet(rows, title=title), path)


def stored_similarity(stored, embedder, config, fingerprint, similarity):
    """The similarity to rank a vectors file by: this checkpoint's, when the file was indexed with it; for another
    checkpoint's vectors a UserError, or with allow_other_checkpoint the similarity they were indexed for."""
    stored_vectors, _, metadata = stored
    if stored_vectors.shape[1] != embedder.dim:
        raise UserError(f"{config['vectors']} holds vectors of dimension {stored_vectors.shape[1]} made by "
                        f"{metadata['init_from']}; {config['init_from']} makes {embedder.dim}: index again with it")
    if metadata["fingerprint"] == fingerprint:
        return similarity
    if not config["allow_other_checkpoint"]:
        raise UserError(f"{config['vectors']} was indexed with {metadata['init_from']} (another checkpoint, fingerprint "
                        f"{metadata['fingerprint']}), not {config['init_from']} ({fingerprint}): its vectors live in "
                        "another space. Index again with this checkpoint, or --allow_other_checkpoint=True")
    print(f"note: ranking the vectors of {metadata['init_from']} (allow_other_checkpoint=True) by the similarity "
          f"they were indexed for: {metadata['similarity']}")
    return metadata["similarity"]


def answer(embedder, asked, stored, similarity, config):
    """Rank the stored items for each query, print them and, if asked, draw the sheet. -> each query's results"""
    stored_vectors, stored_items, _ = stored
    workers = common.worker_count(config["num_workers"])
    query_vectors = embedder.encode(asked, config["batch_size"], workers, progress="queries" if len(asked) > 1 else "")
    finite_or_refuse(query_vectors, asked, "the queries")
    scores, indices = top(query_vectors, stored_vectors, similarity, config["top_k"])
    results = [[dict(stored_items[j], score=score) for score, j in zip(row_scores, row_indices)]
               for row_scores, row_indices in zip(scores.tolist(), indices.tolist())]
    for query, found in zip(asked, results):
        print_results(query, found)
    if config["sheet"]:
        title = f"{config['init_from']}: top {config['top_k']} by {'cosine' if similarity == 'cos' else 'dot product'}"
        print(f"drew {draw_sheet(asked, results, title, config['sheet'], config['gold_id'])}")
    return results


# -----------------------------------------------------------------------------
# the run

def main(argv=None):
    """Index and/or query with config overrides argv (default: the command line).
    -> {"similarity", "indexed": items written, "results": per query, its results {"id", "text", "image", "score"}}"""
    config = configurator.configure(configurator.config_keys(globals()) | {"__file__": __file__, "__doc__": __doc__},
                                    sys.argv[1:] if argv is None else argv)
    for key in ("init_from", "vectors"):
        if not config[key]:
            raise UserError(f"set --{key}=...")
    configurator.check_choice("similarity", config["similarity"], ("",) + loss.SIMILARITIES)
    configurator.check_counts(config, ("top_k",))
    items, asked = index_items(config), query_items(config)
    if not items and not asked:
        raise UserError("nothing to do: index with --index_images, --index_text or --index_jsonl, "
                        "query with --query_text, --query_image or --queries")
    stored = None if items else read_vectors(config["vectors"])  # a bad vectors file fails before the model loads
    _, _, _, run_device = common.compute_init(config["device"])
    embedder, info, similarity = checkpoint.load_for_inference(config["init_from"], config["dtype"], run_device,
                                                               config["max_length"], config["max_pixels"],
                                                               config["similarity"])
    print(kernel_report(run_device))
    if items:
        stored = index(embedder, items, similarity, config["vectors"], config["init_from"], config["batch_size"],
                       common.worker_count(config["num_workers"]))
    else:
        similarity = stored_similarity(stored, embedder, config, checkpoint.fingerprint(config["init_from"]), similarity)
    results = answer(embedder, asked, stored, similarity, config) if asked else []
    return {"similarity": similarity, "indexed": len(items), "results": results}


if __name__ == "__main__":
    common.install_error_hook()
    main()
