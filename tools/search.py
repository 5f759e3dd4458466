"""
tools/search.py: nanoGPT's sample.py for embeddings. Embed a collection once into a vectors file, then search it.

    python -m tools.search --init_from=out/shapes_stage2/export --index_images=data/shapes/images/Shapes-T2I \\
        --vectors=out/shapes_t2i.safetensors
    python -m tools.search --init_from=out/shapes_stage2/export --vectors=out/shapes_t2i.safetensors --top_k=5 \\
        --sheet=out/search.png \\
        --query_text="Retrieve an image that best matches the following description. a small orange triangle at the top left and a large green circle at the bottom right"

Indexing reads any of: a folder of images (searched recursively), a text file (one item per non-empty line), a
JSONL file (objects with "text" and/or "image", relative to the file's folder, and an optional "id"). Ids: the
image's path in the folder, "file.txt:LINE", the "id" or "file.jsonl:LINE". The vectors file is safetensors:
"vectors" (N, D) float32; its metadata holds the items as JSON, the embedding spec, the checkpoint and its
fingerprint (runs/checkpoint.py), and a SHA-256 of the vectors. A folder image is embedded with MMEB's
image-candidate text (image_text), as in training.

A query is text and/or an image, or a file of them (.jsonl as above, else one text query per line). The top_k
items by the similarity the checkpoint was trained with (its embedding spec; cosine for a plain release) are printed
as rank, score, id and text, and drawn with --sheet=path.png; --gold_id=ID prints where that item ranks, and the
sheet frames it green. As in training, a
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

import common
import configurator
import loss
from common import UserError
from media import IMAGE_MARKER
from readers.records import IMAGE_SUFFIXES, is_junk
from runs.checkpoint import fingerprint
from runs.export import dim_line, load_for_inference

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
gold_id = ""  # the id of the item a query should find: its rank is printed, and the sheet frames it green
batch_size = 16  # items per forward pass
num_workers = 4  # DataLoader worker processes (decode, resize, tokenise); at most the cores there are
max_pixels = 0  # image pixel budget; 0 = the checkpoint's own (its spec's; a release: the paper's 1,605,632)
max_length = 0  # tokens per item, text truncated (never the image or template); 0 = the checkpoint's own (8,192)
dim = 0  # the vectors' first dim dimensions (Matryoshka: see the spec's matryoshka_dims); 0 = the checkpoint's
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


def index_items(images, image_text, text, jsonl):
    """The items to index: a folder of images (each with image_text), a text file's lines, a JSONL file's objects,
    in that order ('' for none of one kind)."""
    items = folder_items(images, image_text) if images else []
    items += text_items(text) if text else []
    return items + (jsonl_items(jsonl) if jsonl else [])


def query_items(queries, text, image):
    """The queries file's items, or the one query of text and image; [] when none is asked."""
    if queries:
        asked = jsonl_items(queries) if queries.endswith(".jsonl") else text_items(queries)
        if not asked:
            raise UserError(f"queries: {queries} holds no query (every line is empty)")
        return asked
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


def report_shrunk(embedder):
    """Say how many images were too large for max_length and embedded at the largest grid that fits."""
    shrunk, embedder.preprocessor.shrunk = embedder.preprocessor.shrunk, []
    if shrunk:
        print(f"{len(shrunk)} images too large for max_length were shrunk to fit, e.g. {shrunk[0]}")


def index(embedder, items, path, init_from, batch_size, num_workers):
    """Embed items into the vectors file at path. -> (vectors (N, D), items, metadata), as read_vectors gives them"""
    embeddings = embedder.encode(items, batch_size, num_workers, progress="indexing")
    report_shrunk(embedder)
    finite_or_refuse(embeddings, items, f"indexing with {init_from}")
    metadata = {"items": json.dumps(items), "similarity": embedder.spec.similarity, "spec": json.dumps(embedder.spec.to_dict()),
                "init_from": os.path.abspath(init_from), "fingerprint": fingerprint(init_from),
                "sha256": vectors_checksum(embeddings)}
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
        raise UserError(f"{path} was not written by tools/search.py (no vectors, items, fingerprint and checksum)")
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


def sheet_rows(asked, results, gold_id):
    """The queries with their results, as tools/plot.py's retrieval_sheet draws them: each result's text its id and
    text, and with gold_id a "gold" mark on each (the one of that id framed green; without it none is judged)."""
    rows = []
    for query, found in zip(asked, results):
        cells = [dict(result, text=f"{result['id']} {short(result['text'])}") for result in found]
        if gold_id:
            cells = [dict(cell, gold=cell["id"] == gold_id) for cell in cells]
        rows.append({"query": query, "results": cells})
    return rows


def stored_similarity(stored, embedder, vectors_path, init_from, checkpoint_id, allow_other_checkpoint):
    """The similarity to rank a vectors file by: this checkpoint's, when the file was indexed with it; for another
    checkpoint's vectors a UserError, or with allow_other_checkpoint the similarity they were indexed for."""
    stored_vectors, _, metadata = stored
    stored_dim, width = stored_vectors.shape[1], embedder.model.config.text_config.hidden_size
    if stored_dim != embedder.dim:
        fix = (f"query with --dim={stored_dim}, the dimension it was indexed at" if stored_dim <= width else
               "index again with it")
        raise UserError(f"{vectors_path} holds vectors of dimension {stored_dim} made by {metadata['init_from']}; "
                        f"{init_from} makes {embedder.dim} here: {fix}")
    if metadata["fingerprint"] == checkpoint_id:
        return embedder.spec.similarity
    if not allow_other_checkpoint:
        raise UserError(f"{vectors_path} was indexed with {metadata['init_from']} (another checkpoint, fingerprint "
                        f"{metadata['fingerprint']}), not {init_from} ({checkpoint_id}): its vectors live in "
                        "another space. Index again with this checkpoint, or --allow_other_checkpoint=True")
    print(f"note: ranking the vectors of {metadata['init_from']} (allow_other_checkpoint=True) by the similarity "
          f"they were indexed for: {metadata['similarity']}")
    return metadata["similarity"]


def answer(embedder, asked, stored, similarity, top_k, batch_size, num_workers, gold_id=""):
    """Rank the stored items for each query and print them, and with gold_id that item's rank among all (1 + the
    items scored strictly above it). -> (each query's results, each query's gold rank or None)"""
    stored_vectors, stored_items, _ = stored
    gold = next((j for j, item in enumerate(stored_items) if item["id"] == gold_id), None) if gold_id else None
    if gold_id and gold is None:
        raise UserError(f"gold_id {gold_id!r} is none of the {len(stored_items):,} indexed ids (e.g. "
                        f"{stored_items[0]['id']!r})")
    query_vectors = embedder.encode(asked, batch_size, num_workers, progress="queries" if len(asked) > 1 else "")
    report_shrunk(embedder)
    finite_or_refuse(query_vectors, asked, "the queries")
    scores, indices = top(query_vectors, stored_vectors, similarity, top_k)
    results = [[dict(stored_items[j], score=score) for score, j in zip(row_scores, row_indices)]
               for row_scores, row_indices in zip(scores.tolist(), indices.tolist())]
    ranks = [None] * len(asked)
    if gold is not None:  # (Q, N) -> each query's count of items strictly above the gold
        matrix = loss.similarity_matrix(query_vectors, stored_vectors, similarity)
        ranks = (1 + (matrix > matrix[:, gold:gold + 1]).sum(dim=1)).tolist()
    for query, found, rank in zip(asked, results, ranks):
        print_results(query, found)
        if rank is not None:
            print(f"gold {gold_id}: rank {rank} of {len(stored_items):,}")
    return results, ranks


# -----------------------------------------------------------------------------
# the run

def main(argv=None):
    """Index and/or query with config overrides argv (default: the command line).
    -> {"similarity", "indexed": items written, "results": per query, its results {"id", "text", "image", "score"},
    "gold_ranks": per query, the gold_id's rank (None without one)}"""
    configurator.configure(globals(), sys.argv[1:] if argv is None else argv)
    for key in ("init_from", "vectors"):
        if not globals()[key]:
            raise UserError(f"set --{key}=...")
    configurator.check_choice("similarity", similarity, ("",) + loss.SIMILARITIES)
    configurator.check_counts({"top_k": top_k}, ("top_k",))
    items, asked = index_items(index_images, image_text, index_text, index_jsonl), query_items(queries, query_text,
                                                                                              query_image)
    if not items and not asked:
        raise UserError("nothing to do: index with --index_images, --index_text or --index_jsonl, "
                        "query with --query_text, --query_image or --queries")
    stored = None if items else read_vectors(vectors)  # a bad vectors file fails before the model loads
    run_device = common.compute_init(device)[3]
    embedder, _ = load_for_inference(init_from, dtype, run_device, max_length=max_length, max_pixels=max_pixels,
                                     similarity=similarity, dim=dim)
    print(dim_line(init_from, embedder))
    workers = common.worker_count(num_workers)
    if items:
        stored = index(embedder, items, vectors, init_from, batch_size, workers)
        ranked_by = embedder.spec.similarity
    else:
        ranked_by = stored_similarity(stored, embedder, vectors, init_from, fingerprint(init_from), allow_other_checkpoint)
    results, ranks = answer(embedder, asked, stored, ranked_by, top_k, batch_size, workers, gold_id) if asked else ([], [])
    if sheet and results:
        from tools import plot  # matplotlib, only when a sheet is asked for
        title = f"{init_from}: top {top_k} by {'cosine' if ranked_by == 'cos' else 'dot product'}"
        print(f"drew {plot.save(plot.retrieval_sheet(sheet_rows(asked, results, gold_id), title), sheet)}")
    return {"similarity": ranked_by, "indexed": len(items), "results": results, "gold_ranks": ranks}


if __name__ == "__main__":
    common.install_error_hook()
    main()
