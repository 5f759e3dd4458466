"""
tools/mteb_model.py: a PACE checkpoint as an mteb encoder, for mteb's and MIEB's image and text tasks.

    python -m tools.mteb_model --init_from=out/stage2/export --tasks="['CIRRIT2IRetrieval']"   # one MIEB task
    python -m tools.mteb_model --init_from=out/stage2/export --benchmark="MIEB(lite)"          # MIEB's lite set
    model = pace_encoder("out/stage2/export"); mteb.evaluate(model, mteb.get_tasks(...))     # from Python

It needs mteb, and torchvision beside PyPI's torch: the peers' environment (tests/requirements-peers.txt; mteb
downloads each task's data). mteb (2.x) hands an encoder batches of columns ({"text": [...], "image": [PIL images]};
a batch may have either or both) and asks for one vector a row; it ranks by the similarity the model's metadata
names, here the spec's (dot for a Stage II export, cosine for Stage I). The vectors are Embedder.encode's, built
through this project's own prompt and image path (the PIL processor training used, a photo too large for max_length
shrunk to fit). A query's instruction is the task's own prompt (mteb's get_instruction), put before its text as
MMEB's instructions are; a document gets none. MMEB is not an mteb benchmark: eval.py is the way to score MMEB.
"""
import sys

import numpy as np
import torch

import configurator
from common import UserError, install_error_hook
from runs.export import load_for_inference

# -----------------------------------------------------------------------------
# config
init_from = ""  # checkpoint: an export/ folder, a training step folder or a release
tasks = []  # mteb task names, e.g. ['CIRRIT2IRetrieval']
benchmark = ""  # or an mteb benchmark, e.g. 'MIEB(lite)'
batch_size = 16  # items per forward pass
num_workers = 0  # DataLoader worker processes
device = "cuda" if torch.cuda.is_available() else "cpu"  # 'cuda' or 'cpu'
dtype = "bfloat16" if torch.cuda.is_available() else "float32"  # compute dtype of the model
out = "out/mteb"  # mteb's results folder
# -----------------------------------------------------------------------------


def pace_encoder(path, batch_size=16, device="cpu", dtype="float32", num_workers=0, name="pace/export"):
    """A checkpoint as mteb's EncoderProtocol: encode(DataLoader of column batches) -> (N, D) float32 array."""
    from mteb.models.abs_encoder import AbsEncoder
    from mteb.models.model_meta import ModelMeta, ScoringFunction
    from mteb.types import PromptType

    class PaceEncoder(AbsEncoder):
        def __init__(self):
            self.model, self.info = load_for_inference(path, dtype, device)
            spec = self.model.spec
            self.mteb_model_meta = ModelMeta.create_empty(overwrites=dict(
                name=name, revision="local", modalities=["image", "text"], embed_dim=self.model.dim,
                max_tokens=spec.max_length, framework=["PyTorch"], use_instructions=True, open_weights=True,
                similarity_fn_name=ScoringFunction.DOT_PRODUCT if spec.similarity == "dot" else ScoringFunction.COSINE))

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
                return self.model.encode(items, batch_size, num_workers).numpy().astype(np.float32)
    return PaceEncoder()


def main(argv=None):
    """Evaluate init_from on the mteb tasks or benchmark named. -> mteb's results"""
    configurator.configure(globals(), sys.argv[1:] if argv is None else argv)
    if not init_from or bool(tasks) == bool(benchmark):
        raise UserError("set --init_from=... and either --tasks=[...] or --benchmark=...")
    try:
        import mteb
    except ImportError:
        raise UserError("tools/mteb_model.py needs mteb and torchvision: the peers' environment, "
                        "pip install -r tests/requirements-peers.txt in a virtual environment of its own") from None
    chosen = mteb.get_benchmark(benchmark) if benchmark else mteb.get_tasks(tasks=tasks)
    results = mteb.evaluate(pace_encoder(init_from, batch_size, device, dtype, num_workers), chosen,
                            cache=mteb.ResultCache(out))
    print(results)
    return results


if __name__ == "__main__":
    install_error_hook()
    main()
