"""
tools/mteb_model.py: a PACE checkpoint as an mteb encoder, for mteb's and MIEB's image and text tasks.

    # in the peers' environment (tests/requirements-peers.txt: mteb, and torchvision beside PyPI's torch)
    import mteb
    from tools.mteb_model import PaceEncoder
    model = PaceEncoder("out/stage2/export")          # an export, a step folder or a release
    results = mteb.evaluate(model, mteb.get_tasks(tasks=["CIRRIT2IRetrieval"]))   # one MIEB task
    results = mteb.evaluate(model, mteb.get_benchmark("MIEB(lite)"))             # MIEB's lite set

mteb (2.x) hands an encoder batches of columns ({"text": [...], "image": [PIL images]}; a batch may have either or
both) and asks for one vector a row; it ranks by the similarity the model's metadata names, here the spec's (dot
for a Stage II export, cosine for Stage I). The vectors are Embedder.encode's, built through this project's own
prompt and image path (the PIL processor training used, a photo too large for max_length shrunk to fit). A query's
instruction is the task's own prompt (mteb's get_instruction), put before its text as MMEB's instructions are; a
document gets none. MMEB is not an mteb benchmark: eval.py is the way to score MMEB.
"""
import numpy as np
import torch
from mteb.models.abs_encoder import AbsEncoder
from mteb.models.model_meta import ModelMeta, ScoringFunction
from mteb.types import PromptType

from runs.export import load_for_inference


class PaceEncoder(AbsEncoder):
    """mteb's EncoderProtocol over model.Embedder: encode(DataLoader of column batches) -> (N, D) float32 array."""

    def __init__(self, path, batch_size=16, device="cpu", dtype="float32", num_workers=0, name="pace/export"):
        self.model, self.info = load_for_inference(path, dtype, device)
        self.batch_size, self.num_workers = batch_size, num_workers
        spec = self.model.spec
        self.mteb_model_meta = ModelMeta.create_empty(overwrites=dict(
            name=name, revision="local", modalities=["image", "text"], embed_dim=self.model.dim,
            max_tokens=spec.max_length, similarity_fn_name=ScoringFunction.DOT_PRODUCT if spec.similarity == "dot" else ScoringFunction.COSINE,
            framework=["PyTorch"], use_instructions=True, open_weights=True))

    def encode(self, inputs, *, task_metadata, hf_split, hf_subset, prompt_type=None, **kwargs):
        instruction = self.get_instruction(task_metadata, prompt_type) if prompt_type != PromptType.document else ""
        items = []
        for batch in inputs:
            texts, images = batch.get("text"), batch.get("image")
            for k in range(len(texts if texts is not None else images)):
                text = texts[k] if texts is not None else ""
                text = f"{instruction} {text}".strip() if instruction and text else (instruction or text)
                items.append({"text": text, "image": images[k] if images is not None else None})
        with torch.no_grad():
            return self.model.encode(items, self.batch_size, self.num_workers).numpy().astype(np.float32)
