"""
The one embedding spec (model.EmbeddingSpec): every field reaches everything that derives from it, so a new field
cannot be half-registered: the spec file beside the weights (step folders and exports), the model card, the resume
check and train.py's config keys, eval.py's cache key, and every loader (runs/export.py's, eval.py's, the tools').

    python -m pytest -q tests/test_spec.py
"""
import dataclasses
import json
import os
import shutil

import pytest
import torch

import configurator
from common import UserError
from model import POOLINGS, SPEC_FILE, Embedder, EmbeddingSpec
from runs import checkpoint, outdir, results
from runs.export import load_embedder, model_card
from tests.toyrun import help_defaults

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# a value other than the default for every field: a new field must be given one here, and so checked below
CHANGED = {"system_prompt": "Represent this item for retrieval.", "pooling": "mean",
           "similarity": "dot", "max_length": 300, "min_pixels": 2048, "max_pixels": 8192, "video_frames": 6,
           "video_min_pixels": 4096, "video_max_pixels": 32768, "video_fps": 1.0, "dim": 32, "matryoshka_dims": (8, 16),
           "backbone": "/models/another-release"}


@pytest.fixture
def changed_spec():
    """A spec whose every field differs from the default."""
    return EmbeddingSpec(**CHANGED)


def test_every_field_has_a_changed_value_here():
    assert set(CHANGED) == set(EmbeddingSpec.fields())
    assert all(getattr(EmbeddingSpec(), field) != value for field, value in CHANGED.items())


def test_every_field_is_kept_beside_the_weights_and_said_in_the_model_card(changed_spec, tmp_path):
    changed_spec.save(str(tmp_path))
    assert EmbeddingSpec.load(str(tmp_path)) == changed_spec  # what step folders and exports hold
    assert json.load(open(tmp_path / SPEC_FILE)) == json.loads(json.dumps(dataclasses.asdict(changed_spec)))
    card = model_card(changed_spec, {"step": 3, "config": {"seed": 1}}, str(tmp_path / "export"))
    for field, value in CHANGED.items():
        assert f"| `{field}` | `{value!r}` |" in card, field  # every field in the card's table
    assert CHANGED["system_prompt"] in card.split("## Load it with plain transformers")[1]  # and in its snippet
    (tmp_path / SPEC_FILE).write_text(json.dumps(dict(CHANGED, colour="red")))
    with pytest.raises(UserError, match=r"embedding_spec.json: not an embedding spec .*colour"):
        EmbeddingSpec.load(str(tmp_path))


def test_every_field_is_a_training_key_a_resume_may_not_change():
    keys = help_defaults("train.py")  # train.py's config keys and defaults, as its --help prints them
    comments = configurator.key_comments(os.path.join(ROOT, "model.py"))  # and each with its field's comment
    for field in EmbeddingSpec.fields():
        if field == "backbone":  # the lineage: it follows init_from, which a resume may not change either
            assert "init_from" in checkpoint.defining(keys)
            continue
        assert keys[field] == getattr(EmbeddingSpec(), field) and comments[field] and field in checkpoint.defining(keys), field
        before = {field: getattr(EmbeddingSpec(), field), "learning_rate": 1e-3}
        with pytest.raises(UserError, match=field):
            outdir.resume_changes(before, dict(before, **{field: CHANGED[field]}), allow_config_change=False)


def test_every_field_changes_evals_cache_key(changed_spec, tmp_path):
    (tmp_path / "Set").mkdir()
    (tmp_path / "Set" / "test.parquet").write_bytes(b"rows")
    key = lambda spec: results.dataset_key("Set", str(tmp_path / "Set"), spec, "fingerprint", {"seed": 0})  # noqa: E731
    default = key(EmbeddingSpec())
    for field, value in CHANGED.items():
        assert key(dataclasses.replace(EmbeddingSpec(), **{field: value})) != default, field


def test_every_loader_gives_the_spec_an_export_holds(tiny_checkpoint, tmp_path):
    export = str(tmp_path / "export")
    shutil.copytree(tiny_checkpoint, export)
    spec = EmbeddingSpec(**dict(CHANGED, backbone=tiny_checkpoint))
    spec.save(export)
    loaded = Embedder.from_pretrained(export)
    assert loaded.spec == spec == load_embedder(export)[0].spec  # the model's loader and runs/export.py's
    prompt = loaded.preprocessor.tokenizer.decode(loaded.preprocessor("x")["input_ids"])
    assert spec.system_prompt in prompt  # the spec builds the prompt
    assert loaded.preprocessor.vision["image"].size == {"shortest_edge": 2048, "longest_edge": 8192}
    assert loaded.preprocessor.vision["video"].size == {"shortest_edge": 4096, "longest_edge": 32768}
    assert loaded.preprocessor.max_length == 300
    again = load_embedder(export, max_pixels=4096, similarity="cos")[0].spec  # a caller's changes, field by field
    assert (again.max_pixels, again.similarity, again.system_prompt) == (4096, "cos", spec.system_prompt)
    assert load_embedder(export, max_pixels=0, similarity="")[0].spec == spec  # 0 and '': the export's own
    release = Embedder.from_pretrained(tiny_checkpoint).spec  # a release: the defaults, itself the backbone
    assert release.backbone == tiny_checkpoint and release.similarity == "cos"
    assert (release.min_pixels, release.max_pixels) == (32 * 32, 1605632)  # its own least, the paper's most
    assert (release.video_min_pixels, release.video_max_pixels) == (32 * 32, 128 * 128)  # and its video processor's
    assert (release.video_frames, release.video_fps) == (8, 2.0)
    with pytest.raises(UserError, match=r"pooling must be one of " + ", ".join(map(repr, POOLINGS)) + ", got 'sideways'"):
        EmbeddingSpec(pooling="sideways")
    with pytest.raises(UserError, match=r"similarity must be one of 'cos', 'dot', got 'euclid'"):
        EmbeddingSpec(similarity="euclid")


@pytest.mark.parametrize("pooling", [*POOLINGS, "first_token"])  # every entry, and one a test adds as a fork would
def test_a_pooling_is_one_entry_that_reaches_the_vectors_the_export_and_the_card(pooling, tiny_embedder, monkeypatch,
                                                                                 tmp_path):
    import model
    from model import Pooling, Preprocessor
    from runs.export import save_hf_folder
    if pooling == "first_token":
        monkeypatch.setitem(model.POOLINGS, pooling, Pooling(lambda hidden, mask: hidden[:, 0], "cls",
                                                             "the state at the first token", "hidden[0]"))
    entry, pre = model.POOLINGS[pooling], tiny_embedder.preprocessor
    pooled = Embedder(tiny_embedder.model, Preprocessor(pre.tokenizer, pre.vision, pre.spec.replace(pooling=pooling)))
    texts = ["a red circle", "two blue squares"]
    vectors = pooled.encode([{"text": text, "image": None} for text in texts])
    if pooling == "first_token":  # the entry's function made them: the prompt's first token is the same for both
        torch.testing.assert_close(vectors[0], vectors[1])
    save_hf_folder(pooled.state_dict(), pooled.spec, str(tmp_path / "export"), {"step": 1})
    assert json.load(open(tmp_path / "export" / "1_Pooling" / "config.json"))["pooling_mode"] == entry.sentence_transformers
    card = open(tmp_path / "export" / "README.md").read()
    assert f"{entry.words} ({pooling.replace('_', '-')} pooling)" in card.replace("\n", " ")
    namespace = {}
    exec(card.split("```python\n")[2].split("```")[0], namespace)  # noqa: S102 - the card's code, as a reader runs it
    torch.testing.assert_close(torch.stack([namespace["embed"](text) for text in texts]), vectors, atol=1e-4, rtol=1e-4)


def test_the_checkpoint_layer_names_the_spec_file_as_model_does():
    from model import SPEC_FILE
    from runs import checkpoint
    assert checkpoint.SPEC_FILE == SPEC_FILE  # fingerprint() hashes it
