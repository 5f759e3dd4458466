"""
The forks of docs/forks.md, each held to its word. The page's edits (a weighted-mean pooling, a loss term with its
reference test, a third backbone family, a learnable temperature) are applied exactly as written to one copy of the
repository, where the tests of every module they touch pass (the step's shared callers, GradCache and the bench's
step included) and the temperature trains on two gloo ranks under FSDP2 as in one process; the page's own-rows
command checks a mixture of JSON Lines and Parquet rows there. On the repository itself: the second backbone family
(Qwen3-VL) trains both stages, evaluates and exports; the mean pooling gives the same vectors in encode(), the step
folder, the export and the card's code.

    python -m pytest -q tests/test_forks.py
"""
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest
import torch

import eval as evaluation
from model import POOLINGS, Embedder
from runs.export import load_embedder
from tests.toyrun import ROOT, rank_env, run_process, run_train, torchrun_command

slow = pytest.mark.slow
ITEMS = [{"text": "a red circle", "image": None}, {"text": "<|image_1|> what shape?", "image": None}]


def items_with_image(toy):
    image = sorted(os.listdir(os.path.join(toy["images"], "Shapes-T2I")))[0]
    return [ITEMS[0], dict(ITEMS[1], image=os.path.join(toy["images"], "Shapes-T2I", image))]


def card_vectors(export, texts):
    """The model card's plain-transformers code, run as a reader runs it, on texts -> (n, D)."""
    card = open(os.path.join(export, "README.md")).read()
    namespace = {}
    exec(card.split("```python\n")[2].split("```")[0], namespace)  # noqa: S102 - the card's own code
    return torch.stack([namespace["embed"](text) for text in texts])


@slow
def test_qwen3_vl_trains_both_stages_evaluates_and_exports(toy, tiny_checkpoints, tmp_path):
    stage1, stage2 = str(tmp_path / "stage1"), str(tmp_path / "stage2")
    run_train(toy, stage1, f"--init_from={tiny_checkpoints['qwen3_vl']}", "--max_iters=2", "--checkpoint_interval=2")
    records = run_train(toy, stage2, f"--init_from={stage1}/step_000002", "--max_iters=2", "--checkpoint_interval=2",
                        "--lora_rank=0", "--similarity='dot'", "--temperature=6.4", "--learning_rate=1e-3")
    assert len(records) == 2 and all(math.isfinite(r["loss"]) for r in records)
    exported, (stepped, info) = Embedder.from_pretrained(f"{stage2}/export"), load_embedder(f"{stage2}/step_000002")
    assert exported.family.name == stepped.family.name == "Qwen3-VL" and info["lora_rank"] == 0
    items = items_with_image(toy)
    torch.testing.assert_close(exported.encode(items), stepped.encode(items), atol=1e-5, rtol=0)
    assert "from transformers import Qwen3VLModel" in open(f"{stage2}/export/README.md").read()
    torch.testing.assert_close(card_vectors(f"{stage2}/export", [ITEMS[0]["text"]]), exported.encode(ITEMS[:1]),
                               atol=1e-4, rtol=1e-4)
    out = str(tmp_path / "eval.json")
    result = evaluation.main(["config/shapes_eval.py", f"--init_from={stage2}/export", f"--mmeb_dir={toy['eval']}",
                              f"--image_dir={toy['images']}", f"--out={out}", "--num_workers=0", "--max_pixels=4096",
                              "--geometry=False", "--v2_dir="])
    assert len(result["datasets"]) == 10 and all(0 <= r["precision_at_1"] <= 100 for r in result["datasets"].values())


@slow
def test_mean_pooling_is_the_same_vector_everywhere(toy, tmp_path):
    out = str(tmp_path / "mean")
    run_train(toy, out, "--max_iters=2", "--checkpoint_interval=2", "--pooling='mean'")
    stepped, _ = load_embedder(f"{out}/step_000002")
    exported = Embedder.from_pretrained(f"{out}/export")
    assert stepped.spec.pooling == exported.spec.pooling == "mean"
    items = items_with_image(toy)
    vectors = exported.encode(items)
    torch.testing.assert_close(stepped.encode(items), vectors, atol=1e-5, rtol=0)
    with torch.no_grad():  # by hand: the mean of the final hidden states over the whole prompt
        feature = exported.preprocessor(ITEMS[0]["text"])
        hidden = exported.model(input_ids=feature["input_ids"][None], position_ids=feature["position_ids"][:, None],
                                use_cache=False).last_hidden_state[0]
    torch.testing.assert_close(vectors[0], hidden.mean(dim=0), atol=1e-5, rtol=0)
    assert json.load(open(f"{out}/export/1_Pooling/config.json"))["pooling_mode"] == "mean"
    card = open(f"{out}/export/README.md").read()
    assert POOLINGS["mean"].words in card.replace("\n", " ") and "hidden.mean(dim=0)" in card
    torch.testing.assert_close(card_vectors(f"{out}/export", [ITEMS[0]["text"]]), vectors[:1], atol=1e-4, rtol=1e-4)


PLACE = re.compile(r"# (\S+), (at the end|a new file|before the line with|after the line with|in place of the line "
                   r"with)(?:: (.*))?$")
# the tests that check each file an edit may touch: its own, and its callers' (GradCache and the bench call the step)
TESTS_OF = {"model.py": ["test_model.py", "test_spec.py", "test_lora.py"], "loss.py": ["test_loss.py"],
            "train.py": ["test_train.py", "test_configurator.py"], "train_step.py": ["test_train.py", "test_bench.py"],
            "shapes/tiny_model.py": ["test_model.py"]}


def page_edits():
    """docs/forks.md's edits -> {fork title: [(file, where, anchor, lines)]}, read as the page says they are written."""
    forks = {}
    for section in open(os.path.join(ROOT, "docs", "forks.md")).read().split("\n## ")[1:]:
        title, blocks = section.splitlines()[0], re.findall(r"```python\n(.*?)```", section, re.S)
        edits = []
        for block in blocks:
            first, _, lines = block.partition("\n")
            place = PLACE.match(first)
            assert place, f"docs/forks.md, {title}: a code block that does not say where it goes: {first!r}"
            edits.append((place.group(1), place.group(2), place.group(3), lines))
        if edits:
            forks[title] = edits
    return forks


def apply_edit(folder, file, where, anchor, lines):
    path = os.path.join(folder, file)
    if where == "a new file":
        assert not os.path.exists(path), file
        open(path, "w").write(lines)
        return
    source = open(path).read()
    if where == "at the end":
        open(path, "w").write(source + lines)
        return
    holding = [k for k, line in enumerate(source.splitlines(keepends=True)) if anchor in line]
    assert len(holding) == 1, f"docs/forks.md: {anchor!r} is on {len(holding)} lines of {file}, not one"
    text = source.splitlines(keepends=True)
    k = holding[0]
    text[k:k + 1] = {"before the line with": [lines, text[k]], "after the line with": [text[k], lines],
                     "in place of the line with": [lines]}[where]
    open(path, "w").write("".join(text))


@pytest.fixture(scope="module")
def forked(tmp_path_factory):
    """A copy of the repository with every edit of docs/forks.md applied. -> (its folder, the files they touched)"""
    folder = str(tmp_path_factory.mktemp("forked") / "pace")
    shutil.copytree(ROOT, folder, ignore=shutil.ignore_patterns(".git", "data", "out", "__pycache__", ".venv", "models"))
    touched = set()
    for title, edits in page_edits().items():
        for file, where, anchor, lines in edits:
            apply_edit(folder, file, where, anchor, lines)
            touched.add(file)
    return folder, touched


@slow
def test_every_fork_of_the_page_passes_the_tests_of_what_it_touches(forked):
    folder, touched = forked
    assert set(page_edits()) == {"A pooling choice", "A term of the loss", "A backbone family",
                                 "A learnable temperature"}
    assert touched - set(TESTS_OF) == {"tests/test_hardness.py"}, touched  # every file an edit touches has its tests
    tests = sorted({f"tests/{name}" for file in touched for name in TESTS_OF.get(file, [])}
                   | {file for file in touched if file.startswith("tests/test_")} | {"tests/test_layout.py"})
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-m", "not slow", "-p", "no:cacheprovider",
                          *tests], cwd=folder, capture_output=True, text=True, timeout=600,
                         env={**rank_env(), "PYTHONPATH": folder})
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    assert re.search(r"\d+ passed", run.stdout) and " failed" not in run.stdout
    import model
    source = open(os.path.join(folder, "model.py")).read()  # each fork's entry is where the rest of the code reads it
    assert '"weighted_mean": Pooling(' in source and '"qwen3_vl_moe": Family(' in source and "weighted_mean" not in \
        model.POOLINGS
    assert "test_hardness_weights_multiply_each_negative_in_the_softmax" in open(
        os.path.join(folder, "tests", "test_hardness.py")).read()
    # the new loss key defines the run: a resume that changes it is refused, as the page says
    check = ("from runs import outdir; from common import UserError\n"
             "try:\n    outdir.resume_changes({'hardness_alpha': 0.0}, {'hardness_alpha': 1.0}, False)\n"
             "except UserError as error:\n    print(error)")
    said = subprocess.run([sys.executable, "-c", check], cwd=folder, capture_output=True, text=True, timeout=120)
    assert "would change what defines the run: hardness_alpha 0.0 -> 1.0" in said.stdout, said.stderr[-2000:]


def learned_temperature(step_folder):
    """log tau as a step folder holds it, read with torch.distributed.checkpoint in one process."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    dcp_to_torch_save(step_folder, step_folder + ".pt")
    return torch.load(step_folder + ".pt", weights_only=False)["model"]["temperature.log_tau"].item()


def toy_args(toy, out):
    """What tests/toyrun.launch passes train.py, for a run of the forked copy."""
    return [os.path.join(ROOT, "config", "shapes_stage1.py"), f"--init_from={toy['checkpoint']}",
            f"--train_data={[toy['train']]!r}", f"--image_dir={toy['images']}", f"--out_dir={out}",
            f"--table_dir={os.path.join(toy['root'], 'tables')}", "--batch_size=8", "--num_hard_negatives=2",
            "--log_interval=1", "--num_workers=0", "--max_pixels=4096", "--skip_bad_rows=True"]


@slow
def test_the_learnable_temperature_fork_trains_on_two_ranks_under_fsdp2_as_on_one(forked, toy, tmp_path):
    folder, _ = forked
    assert "embedder.temperature = Temperature(temperature)" in open(os.path.join(folder, "train.py")).read()
    args = ["--max_iters=2", "--checkpoint_interval=2", "--lora_rank=0", "--similarity='dot'", "--temperature=6.4",
            "--learning_rate=1e-2", "--grad_cache_chunk=4"]
    learned = {}
    for nproc in (1, 2):
        out = str(tmp_path / f"ranks{nproc}")
        command = ([sys.executable] if nproc == 1 else torchrun_command(nproc)) + [os.path.join(folder, "train.py")]
        returncode, output = run_process(command + toy_args(toy, out) + args, env=rank_env(), cwd=folder)
        assert returncode == 0, output[-4000:]
        learned[nproc] = learned_temperature(os.path.join(out, "step_000002"))
    assert learned[1] != pytest.approx(math.log(6.4), abs=1e-4)  # tau trained, under lora_rank=0 too
    assert learned[2] == pytest.approx(learned[1], rel=1e-4, abs=1e-6)  # FSDP2 on two ranks: the same step


@slow
def test_the_pages_own_rows_command_checks_a_mixture_of_jsonl_and_parquet(forked, tiny_checkpoint, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    folder, _ = forked
    page = open(os.path.join(ROOT, "docs", "forks.md")).read().split("## Your own rows")[1]
    command = shlex.split(re.search(r"```bash\n(.*?)```", page, re.S).group(1).replace("\\\n", " "))
    assert command[:2] == ["python", "train.py"]
    os.makedirs(os.path.join(folder, "data", "mine"), exist_ok=True)
    rows = [{"query": f"a caption of picture {k}", "positive": f"picture {k}", "negatives": [f"picture {k + 1}"]}
            for k in range(300)]
    with open(os.path.join(folder, "data", "mine", "captions.jsonl"), "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    pq.write_table(pa.Table.from_pylist(rows[:280]), os.path.join(folder, "data", "mine", "qa.parquet"))
    run = subprocess.run([sys.executable, *command[1:], f"--init_from={tiny_checkpoint}", f"--image_dir={tmp_path}",
                          f"--table_dir={tmp_path / 'tables'}", f"--out_dir={tmp_path / 'out'}", "--num_hard_negatives=1"],
                         cwd=folder, capture_output=True, text=True, timeout=300, env=rank_env())
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    assert "the run would start" in run.stdout and "data/mine/captions.jsonl" in run.stdout
    assert re.search(r"qa\.parquet.*280", run.stdout), run.stdout[-3000:]
