"""
runs/reranker.py: the loader of a reranker's checkpoints (rerank.py; train.py's objective='rerank'), as
runs/export.py's load_embedder loads an embedder's, apart from it so that train.py's imports stay shallow.

    reranker, info = load_reranker("out/rerank/export")          # an export, a step folder or a release
    scores = reranker.score([({"text": "a red circle"}, {"text": "", "image": "circle.png"})])   # (n,) log-odds
"""
import torch

from common import UserError
from rerank import Reranker
from runs.export import check_checkpoint, load_embedder


def load_reranker(path, dtype=torch.float32, **changes):
    """Any checkpoint a reranker is read from -> (rerank.Reranker, info), as load_embedder reads it (changes: spec
    fields, max_length=..., max_pixels=...): a reranker's export or training step folder, or a Hugging Face release
    (untrained, as a zero-shot judge is). An embedder's checkpoint is refused: its weights never learnt the answer."""
    embedder, info = load_embedder(path, dtype, **changes)
    if info and info.get("config", {}).get("objective", "embed") != "rerank":
        raise UserError(f"{path} is an embedder's checkpoint (objective 'embed'), not a reranker's (objective 'rerank')")
    return Reranker.of(embedder, path if check_checkpoint(path) == "hf" else embedder.spec.backbone), info
