"""
The peers' lane: an export used where embedders are used, sentence-transformers, mteb and plain transformers with
torchvision installed (so transformers would pick its torchvision processors), against Embedder.encode. These need
torchvision, which the project's CPU torch does not pair with, so they run in a virtual environment of their own
(.ci/run makes it; docs/export.md has the commands); elsewhere they are skipped.

    PACE_PEERS=1 python -m pytest -q tests/test_peers.py          # in that environment
"""
import os

import pytest
import torch
from PIL import Image

if os.environ.get("PACE_PEERS"):  # the lane itself: a missing peer is a failure, never a skip
    import mteb
    import sentence_transformers
    import torchvision  # noqa: F401
else:
    pytest.importorskip("torchvision")
    sentence_transformers = pytest.importorskip("sentence_transformers")
    mteb = pytest.importorskip("mteb")

from media import VIDEO_MARKER  # noqa: E402
from model import Embedder  # noqa: E402
from runs.export import save_hf_folder  # noqa: E402
from shapes.tiny_model import make_tiny_checkpoint  # noqa: E402


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """A Stage II (dot) and a Stage I (cosine) export of a tiny Qwen3.5 whose norms vary, one with mean pooling (the
    fork of docs/forks.md), one of a tiny Qwen3-VL (the second backbone family), a merge (tools/merge.py), and three
    pictures."""
    root = tmp_path_factory.mktemp("peers")
    embedder = Embedder.from_pretrained(make_tiny_checkpoint(str(root / "tiny"), seed=0, final_norm_std=0.15))
    second = Embedder.from_pretrained(make_tiny_checkpoint(str(root / "tiny_vl"), seed=0, final_norm_std=0.15,
                                                           family="qwen3_vl"))
    paths = {}
    for name, model, changes in [("dot", embedder, {"similarity": "dot"}), ("cos", embedder, {"similarity": "cos"}),
                                 ("mean", embedder, {"similarity": "dot", "pooling": "mean"}),
                                 ("qwen3_vl", second, {"similarity": "dot"}),
                                 ("mrl", embedder, {"similarity": "dot", "matryoshka_dims": (16, 32)})]:
        paths[name] = str(root / f"export_{name}")
        save_hf_folder(model.state_dict(), model.spec.replace(**changes), paths[name], {"step": 1, "config": {}})
    # tools/merge.py's average of the Stage II export and a perturbed copy of it: an export like any other
    from tools import merge
    torch.manual_seed(0)
    perturbed = {k: v + 0.02 * torch.randn_like(v) for k, v in embedder.state_dict().items()}
    save_hf_folder(perturbed, embedder.spec.replace(similarity="dot"), str(root / "export_dot_b"), {"step": 1, "config": {}})
    paths["merged"] = merge.main([f"--inputs={[paths['dot'], str(root / 'export_dot_b')]!r}",
                                  f"--out={root / 'export_merged'}"])
    pictures = []
    for k, size in enumerate([(90, 60), (300, 200), (64, 64)]):  # the second is resized: where processors differ
        pictures.append(str(root / f"picture{k}.jpg"))
        Image.effect_noise(size, 40 + 10 * k).convert("RGB").save(pictures[-1])
    return paths, pictures


def items_of(pictures):
    return [{"text": "a red circle at the top left", "image": None}, {"text": "", "image": pictures[0]},
            {"text": "What shape is in the middle?", "image": pictures[1]}, {"text": "", "image": pictures[2]}]


def as_sentence_transformers_input(item):
    image = Image.open(item["image"]) if item["image"] else None
    if image is None:
        return item["text"]
    return {"text": item["text"], "image": image} if item["text"] else image


def test_sentence_transformers_gives_encodes_vectors(exports):
    paths, pictures = exports
    items = items_of(pictures)
    for export, name in (("dot", "dot"), ("cos", "cosine"), ("mean", "dot"), ("qwen3_vl", "dot"), ("merged", "dot")):
        expected = Embedder.from_pretrained(paths[export]).encode(items)
        model = sentence_transformers.SentenceTransformer(paths[export], device="cpu")
        assert model.similarity_fn_name == name
        assert type(model[0].processor.image_processor).__name__ == "Qwen2VLImageProcessorPil"  # training's, not torchvision's
        inputs = [as_sentence_transformers_input(item) for item in items]
        for k, value in enumerate(inputs):  # text alone, an image alone, text with an image, one at a time
            got = model.encode([value], convert_to_tensor=True)[0].float()
            torch.testing.assert_close(got, expected[k], atol=1e-5, rtol=0)
        mixed = model.encode(inputs, convert_to_tensor=True).float()  # and a batch mixing them, not normalised
        torch.testing.assert_close(mixed, expected, atol=1e-5, rtol=0)
        torch.testing.assert_close(mixed.norm(dim=-1), expected.norm(dim=-1), atol=1e-5, rtol=0)


def test_sentence_transformers_truncate_dim_gives_encodes_matryoshka_prefix(exports):
    from runs.export import load_embedder
    paths, pictures = exports
    items = items_of(pictures)
    for dim in (16, 32):
        expected = load_embedder(paths["mrl"], dim=dim)[0].encode(items)
        model = sentence_transformers.SentenceTransformer(paths["mrl"], device="cpu", truncate_dim=dim)
        got = model.encode([as_sentence_transformers_input(item) for item in items], convert_to_tensor=True).float()
        assert got.shape == (len(items), dim) == expected.shape
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def test_the_processors_chat_template_builds_the_preprocessors_ids(exports):
    from transformers import AutoProcessor
    paths, pictures = exports
    embedder = Embedder.from_pretrained(paths["dot"])
    processor = AutoProcessor.from_pretrained(paths["dot"], use_fast=False)
    for item in items_of(pictures):
        content = ([{"type": "image", "image": Image.open(item["image"]).convert("RGB")}] if item["image"] else []) + \
                  ([{"type": "text", "text": item["text"]}] if item["text"] else [])
        ids = processor.apply_chat_template([{"role": "user", "content": content}], tokenize=True, return_dict=True)
        assert list(ids["input_ids"][0]) == embedder.preprocessor(item["text"], item["image"])["input_ids"].tolist()


def test_the_cards_code_gives_encodes_vectors_with_torchvision_installed(exports):
    paths, pictures = exports
    card = open(os.path.join(paths["dot"], "README.md")).read()
    namespace = {}
    exec(card.split("```python\n")[2].split("```")[0], namespace)  # noqa: S102 - the plain-transformers code
    items = items_of(pictures)[:3]
    expected = Embedder.from_pretrained(paths["dot"]).encode(items)
    got = torch.stack([namespace["embed"](item["text"], item["image"]) for item in items])
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


def test_the_mteb_wrapper_scores_a_local_image_task_with_encodes_vectors(exports):
    from datasets import Dataset
    from mteb.abstasks.retrieval import AbsTaskRetrieval
    from mteb.abstasks.retrieval_dataset_loaders import RetrievalSplitData
    from mteb.abstasks.task_metadata import TaskMetadata
    from mteb.types import PromptType
    from tools.mteb_model import pace_encoder
    paths, pictures = exports
    captions = ["a picture of noise", "more noise, larger", "a small square of noise"]

    class LocalTextToImage(AbsTaskRetrieval):  # three captions, each with its own picture: no download
        metadata = TaskMetadata(
            type="Any2AnyRetrieval", name="LocalT2I", main_score="ndcg_at_10", description="a local test task",
            reference="https://example.org", dataset={"path": "NA", "revision": "NA"}, category="t2i",
            eval_splits=["test"], eval_langs=["eng-Latn"], date=("2026-01-01", "2026-01-01"), dialect=["Written"],
            domains=[], task_subtypes=[], license="cc-by-4.0", annotations_creators="derived",
            modalities=["image", "text"], sample_creation="found", bibtex_citation="",
            prompt={"query": "Retrieve an image that best matches the following description."})

        def load_data(self, num_proc=None, **kwargs):
            split = RetrievalSplitData(
                queries=Dataset.from_dict({"id": [f"q{k}" for k in range(3)], "text": captions}),
                corpus=Dataset.from_dict({"id": [f"d{k}" for k in range(3)],
                                          "image": [Image.open(p).convert("RGB") for p in pictures]}),
                relevant_docs={f"q{k}": {f"d{k}": 1} for k in range(3)}, top_ranked=None)
            self.dataset, self.data_loaded = {"default": {"test": split}}, True

    task = LocalTextToImage()
    encoder = pace_encoder(paths["dot"], batch_size=2)
    assert encoder.mteb_model_meta.similarity_fn_name.value == "dot" and "image" in encoder.mteb_model_meta.modalities
    results = mteb.evaluate(encoder, task, cache=None)
    score = results.task_results[0].scores["test"][0]["main_score"]
    assert 0.0 <= score <= 1.0
    # the vectors mteb ranked are encode()'s: the queries with the task's instruction, the pictures without
    task.load_data()
    loader = torch.utils.data.DataLoader([{"text": c} for c in captions], batch_size=2,
                                         collate_fn=lambda rows: {"text": [r["text"] for r in rows]})
    queries = encoder.encode(loader, task_metadata=task.metadata, hf_split="test", hf_subset="default",
                             prompt_type=PromptType.query)
    expected = encoder.model.encode([{"text": "Retrieve an image that best matches the following description. " + c,
                                      "image": None} for c in captions])
    torch.testing.assert_close(torch.from_numpy(queries), expected, atol=1e-6, rtol=0)
    scores = expected @ encoder.model.encode([{"text": "", "image": p} for p in pictures]).T  # (3, 3), dot
    hits = sum(int(scores[k].argmax()) == k for k in range(3))
    assert (score == 1.0) == (hits == 3)  # ndcg@10 is 1 exactly when every caption ranks its own picture first


def processor_video_inputs(processor, preprocessor, text, frames):
    """transformers' Qwen3VLProcessor on the prompt of a video item ({text, video: frames}, no more frames than the
    spec keeps): <|video_pad|> where the Preprocessor puts the video, the frames already chosen (not sampled again),
    frames 0..n-1 taken at the spec's video_fps."""
    from transformers.video_utils import VideoMetadata
    before, after = preprocessor.split_text(text, VIDEO_MARKER)
    prompt = (f"<|im_start|>system\n{preprocessor.spec.system_prompt}<|im_end|>\n<|im_start|>user\n{before}"
              f"<|video_pad|>{after}<|im_end|>\n<|im_start|>assistant\n<|endoftext|>")
    metadata = VideoMetadata(total_num_frames=len(frames), fps=preprocessor.spec.video_fps,
                             frames_indices=list(range(len(frames))))
    return processor(text=[prompt], videos=[frames], video_metadata=[metadata], do_sample_frames=False,
                     return_tensors="pt")


def test_transformers_video_processor_gives_the_preprocessors_video_inputs(exports, tmp_path):
    """The ids, token types, grid and pixel values of a video item equal those of transformers' Qwen3VLProcessor with
    its torchvision video processor: bit for bit for frames already at the size it resizes to; for frames it resizes,
    the grid and ids equal and the pixels differ as PIL's resize and torchvision's do, by a little."""
    import json
    import shutil

    from transformers import AutoProcessor

    from tests.test_model import joining_space_and_bracket
    paths, _ = exports
    merging = joining_space_and_bracket(paths["dot"], str(tmp_path / "merging"))  # a tokenizer that joins " <"
    embedder = Embedder.from_pretrained(paths["dot"])
    with open(os.path.join(paths["dot"], "video_preprocessor_config.json")) as f:  # the export carries the budget
        assert json.load(f)["size"] == {"shortest_edge": embedder.spec.video_min_pixels,
                                        "longest_edge": embedder.spec.video_max_pixels}
    def noise(count, size):
        return [Image.effect_noise(size, 30 + 7 * k).convert("RGB") for k in range(count)]
    texts = [f"{VIDEO_MARKER} What happens?", f"before {VIDEO_MARKER} after", f"Question:{VIDEO_MARKER}x", "a caption"]
    differences = {}
    for folder in (paths["dot"], merging):
        preprocessor = embedder.preprocessor if folder == paths["dot"] else Embedder.from_pretrained(folder).preprocessor
        processor = AutoProcessor.from_pretrained(folder, use_fast=False)
        assert type(processor.video_processor).__name__ == "Qwen3VLVideoProcessor"  # the torchvision one
        for frames in (noise(8, (64, 32)), noise(7, (64, 32)), noise(8, (300, 170)), noise(6, (33, 95))):
            for text in texts:
                ours = preprocessor.collate([preprocessor(text, video=frames)])
                theirs = processor_video_inputs(processor, preprocessor, text, frames)
                assert torch.equal(ours["input_ids"], theirs["input_ids"]), (folder, text, frames[0].size)
                assert torch.equal(ours["mm_token_type_ids"], theirs["mm_token_type_ids"].int())
                assert torch.equal(ours["video_grid_thw"], theirs["video_grid_thw"])
            values = embedder.pixel_values(ours["pixel_values_videos"], video=True)
            difference = (values - theirs["pixel_values_videos"]).abs()
            if frames[0].size == (64, 32):  # already the size: no resize, the same floats
                assert torch.equal(values, theirs["pixel_values_videos"])
            differences[frames[0].size] = (difference.max().item(), difference.mean().item())
    print(f"video pixels, PIL against torchvision resize (max, mean abs difference): {differences}")
    (big_max, big_mean), (near_max, near_mean) = differences[(300, 170)], differences[(33, 95)]
    assert big_max <= 1.01 / 127.5 and big_mean < 1e-4  # 300x170 to 64x32: at most one byte level
    assert near_max < 0.2 and near_mean < 0.005  # 33x95 to 32x64, a scale near 1: a few pixels, a few levels
    # and the vectors: encode() of a video item, and the model on the processor's inputs (its own positions)
    frames, text = noise(7, (64, 32)), f"{VIDEO_MARKER} What happens?"
    theirs = processor_video_inputs(AutoProcessor.from_pretrained(paths["dot"], use_fast=False), embedder.preprocessor,
                                    text, frames)
    with torch.no_grad():
        got = embedder(theirs["input_ids"], theirs["attention_mask"], None, theirs["mm_token_type_ids"],
                       pixel_values_videos=theirs["pixel_values_videos"], video_grid_thw=theirs["video_grid_thw"])
    torch.testing.assert_close(got, embedder.encode([{"text": text, "video": frames}]), atol=1e-5, rtol=0)
    shutil.rmtree(merging)
