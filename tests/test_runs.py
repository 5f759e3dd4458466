"""
Runs that survive a cluster, function by function (runs/outdir.py, runs/checkpoint.py, runs/export.py, eval.py,
cluster/pace.sbatch): one run per out_dir (the lock), no run mixed with an earlier one, what a resume may change
and the config's history, the checkpoints kept and moved aside, the stop signals, broken and hostile step folders
refused wherever they are loaded, the export's dtype and its card's snippet, a checkpoint's fingerprint, an
evaluation that resumes, and the SLURM script. The whole runs are tests/test_train.py's.

    python -m pytest -q tests/test_runs.py
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch
from PIL import Image

from common import UserError
from runs import checkpoint, outdir
from tests.toyrun import ROOT, help_defaults, script_defaults


# -----------------------------------------------------------------------------
# the out_dir

def test_one_run_per_out_dir(tmp_path):
    out = str(tmp_path / "busy")
    lock = outdir.take_lock(out)
    holder = json.load(open(lock))
    assert (holder["pid"], holder["host"]) == (os.getpid(), socket.gethostname())
    with pytest.raises(UserError) as error:  # a second launch while this process runs: refused, naming it
        outdir.take_lock(out)
    assert f"{out} is in use" in str(error.value) and f"pid {os.getpid()}" in str(error.value)
    assert "--out_dir" in str(error.value)  # what to do about it
    outdir.release_lock(lock)
    assert not os.path.exists(lock)
    # a lock left by a process that died (a kill -9): taken over, with a note
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with open(lock, "w") as f:
        json.dump({"host": socket.gethostname(), "pid": dead.pid, "started": "2026-12-01 10:00:00",
                   "command": "train.py", "process_start": 1}, f)
    assert outdir.take_lock(out) == lock and json.load(open(lock))["pid"] == os.getpid()
    # a pid the system reused for another process (its start time differs) is not the lock's run either
    with open(lock, "w") as f:
        json.dump(dict(holder, process_start=holder["process_start"] + 1), f)
    assert outdir.take_lock(out) == lock
    # another host's lock: refused, with the way to clear it
    with open(lock, "w") as f:
        json.dump({"host": "elsewhere", "pid": 1, "started": "2026-12-01 10:00:00", "command": "train.py"}, f)
    with pytest.raises(UserError, match=rf"host elsewhere .*delete {re.escape(lock)}"):
        outdir.take_lock(out)
    assert socket.gethostname() != "elsewhere"


def fake_step(out, step, files=None):
    """A complete step folder as runs/checkpoint.py lays it out: pace.json beside recorded files."""
    folder = checkpoint.step_path(out, step)
    os.makedirs(folder)
    with open(os.path.join(folder, "__0_0.distcp"), "wb") as f:
        f.write(bytes([step]) * 100)
    info = {"step": step, "files": files or {"__0_0.distcp": checkpoint.file_record(os.path.join(folder, "__0_0.distcp"))}}
    json.dump(info, open(os.path.join(folder, checkpoint.INFO), "w"))
    return folder


def test_a_fresh_run_over_an_earlier_runs_checkpoints_is_refused(tmp_path, capsys):
    out = str(tmp_path / "earlier")
    for step in (2, 4):
        fake_step(out, step)
    os.makedirs(os.path.join(out, "export"))
    os.makedirs(os.path.join(out, "step_000009.tmp"))
    with pytest.raises(UserError) as error:
        outdir.refuse_mixing(out, fresh=True, overwrite=False)
    assert "step_000002, step_000004, export" in str(error.value)
    assert all(option in str(error.value) for option in ("--resume=True", "--out_dir=", "--overwrite=True"))
    assert outdir.refuse_mixing(out, fresh=False, overwrite=False) == []  # a resume mixes nothing
    earlier = outdir.refuse_mixing(out, fresh=True, overwrite=True)
    open(os.path.join(out, "log.jsonl"), "w").close()
    outdir.clear(out, earlier)
    assert os.listdir(out) == []  # the earlier run, its log, and the .tmp a crash left: all gone
    assert "step_000009.tmp" in capsys.readouterr().out


def test_a_resume_lists_what_changed_and_refuses_what_redefines_the_run(tmp_path):
    before = {"similarity": "cos", "focal_gamma": 2.0, "learning_rate": 3e-3, "max_iters": 4, "out_dir": "a",
              "adam_betas": [0.9, 0.999]}
    after = dict(before, similarity="dot", focal_gamma=0.0, learning_rate=1e-3, out_dir="b", adam_betas=(0.9, 0.999))
    with pytest.raises(UserError) as error:
        outdir.resume_changes(before, after, allow_config_change=False)
    assert "similarity 'cos' -> 'dot'" in str(error.value) and "focal_gamma 2.0 -> 0.0" in str(error.value)
    assert "learning_rate" not in str(error.value) and "--allow_config_change=True" in str(error.value)
    changed = outdir.resume_changes(before, after, allow_config_change=True)
    assert changed == {"similarity": ["cos", "dot"], "focal_gamma": [2.0, 0.0], "learning_rate": [3e-3, 1e-3]}
    assert outdir.resume_changes(before, dict(before, learning_rate=1e-3), False) == {"learning_rate": [3e-3, 1e-3]}
    with pytest.raises(UserError, match=r"hardness_alpha 1.0 -> 2.0"):  # a fork's new key defines the run unlisted
        outdir.resume_changes(dict(before, hardness_alpha=1.0), dict(before, hardness_alpha=2.0), False)
    keys = help_defaults("train.py")  # every key of train.py is one or the other, each named once
    assert set(checkpoint.STEERING) <= set(keys) and {"judge_temperature", "lora_dropout", "seed"} <= set(
        checkpoint.defining(keys))
    path = str(tmp_path / "config.json")  # which steps ran under which values
    outdir.write_config(path, before, 0, {})
    outdir.write_config(path, after, 2, changed)
    written = json.load(open(path))
    assert written["config"]["focal_gamma"] == 0.0 and written["history"] == [
        {"from_step": 0, "changed": {}}, {"from_step": 2, "changed": changed}]
    outdir.write_config(path, after, 1, {})  # a resume from before the change: the later history goes
    assert [h["from_step"] for h in json.load(open(path))["history"]] == [0, 1]


def test_kept_checkpoints_survive_pruning_and_broken_ones_are_passed_over(tmp_path, capsys):
    out = str(tmp_path / "run")
    for step in range(1, 7):
        fake_step(out, step)
    outdir.prune(out, keep_last=2, keep_steps=[2, 3])
    assert [os.path.basename(p) for p in checkpoint.complete(out)] == [f"step_{s:06d}" for s in (2, 3, 5, 6)]
    with open(os.path.join(out, "step_000006", "__0_0.distcp"), "r+b") as f:
        f.truncate(50)
    assert outdir.newest_intact(out) == checkpoint.step_path(out, 5)
    assert "step_000006: broken checkpoint, __0_0.distcp is 50 bytes, 100 written" in capsys.readouterr().out
    assert outdir.set_aside(out, 5) == [checkpoint.step_path(out, 5), checkpoint.step_path(out, 6)]
    assert os.path.isdir(checkpoint.step_path(out, 5) + ".suspect") and outdir.newest_intact(out).endswith("3")
    assert outdir.is_finished({"step": 4}, 4, {"step": 4}) and not outdir.is_finished({"step": 4}, 4, {"step": 2})
    assert not outdir.is_finished({"step": 3}, 4, {"step": 3})


def test_a_stop_signal_sets_received_and_a_second_ctrl_c_stops_at_once(capsys):
    previous = {name: signal.getsignal(getattr(signal, name)) for name in ("SIGUSR1", "SIGINT")}
    try:
        stop = outdir.StopSignals(["SIGUSR1", "SIGINT"])
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.05)
        assert stop.received == "SIGUSR1" and "SIGUSR1: finishing this step" in capsys.readouterr().out
        os.kill(os.getpid(), signal.SIGINT)  # after another signal: noted, nothing cut short
        time.sleep(0.05)
        assert stop.received == "SIGUSR1" and "SIGINT again" in capsys.readouterr().out
        stop.received = "SIGINT"
        with pytest.raises(KeyboardInterrupt):  # Ctrl-C twice: at once
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
        with pytest.raises(UserError, match="'SIGNOPE' is not a signal name"):
            outdir.StopSignals(["SIGNOPE"])
    finally:
        for name, handler in previous.items():
            signal.signal(getattr(signal, name), handler)


# -----------------------------------------------------------------------------
# step folders wherever they are loaded

class Exploit:
    """Unpickled, it creates a file: what a hostile checkpoint could do instead."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


@pytest.mark.slow
def test_broken_step_folders_are_named_wherever_they_are_loaded(straight, tmp_path):
    from runs.export import load_embedder
    cases = {"truncated shard": ("__0_0.distcp", lambda f: f.truncate(100), "__0_0.distcp is 100 bytes"),
             "empty RNG file": ("rng_rank0.pt", lambda f: f.truncate(0), "rng_rank0.pt is 0 bytes"),
             "half a pace.json": ("pace.json", lambda f: f.truncate(40), "cannot read pace.json")}
    for name, (file, damage, message) in cases.items():
        folder = str(tmp_path / name.replace(" ", "_"))
        shutil.copytree(os.path.join(straight[0], "step_000004"), folder)
        with open(os.path.join(folder, file), "r+b") as f:
            damage(f)
        with pytest.raises(UserError, match=re.escape(folder) + ": broken checkpoint, " + message):
            load_embedder(folder)  # --init_from of Stage II, eval.py, the tools
    hostile = tmp_path / "rng_rank0.pt"
    torch.save({"cpu": torch.get_rng_state(), "cuda": Exploit(tmp_path / "pwned")}, hostile)  # runs code on load
    with pytest.raises(UserError, match="cannot read the RNG states"):
        checkpoint.load_rng(str(hostile))
    assert not (tmp_path / "pwned").exists()


@pytest.mark.slow
def test_a_hostile_step_folder_is_refused_not_run(straight, tiny_embedder, tmp_path):
    import pickle
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    from runs.export import load_embedder
    folder = tmp_path / "hostile"
    shutil.copytree(os.path.join(straight[0], "step_000002"), folder)
    with open(folder / ".metadata", "wb") as f:  # a .metadata whose pickle calls os.system
        pickle.dump(Exploit(tmp_path / "pwned_metadata"), f)
    info = json.load(open(folder / "pace.json"))  # its sender can record the new file's checksum too
    info["files"][".metadata"] = checkpoint.file_record(str(folder / ".metadata"))
    json.dump(info, open(folder / "pace.json", "w"))
    with pytest.raises(UserError, match=r"hostile: refusing its \.metadata: it asks for posix\.system"):
        load_embedder(str(folder))
    assert not (tmp_path / "pwned_metadata").exists()
    # a genuine .metadata, but a non-tensor entry (where the optimizer keeps lr, betas, ...) that runs code
    entries = str(tmp_path / "entries")
    dcp.save({"model": get_model_state_dict(tiny_embedder), "lr": Exploit(tmp_path / "pwned_entry")}, checkpoint_id=entries)
    with pytest.raises(UserError, match="entries: refusing its entry lr"):
        checkpoint.load_state({"model": get_model_state_dict(tiny_embedder), "lr": 0.1}, entries)
    assert not (tmp_path / "pwned_entry").exists()
    checkpoint.load_state({"model": get_model_state_dict(tiny_embedder)}, entries)  # the tensors alone load


# -----------------------------------------------------------------------------
# the export

def test_the_export_says_its_dtype_and_its_cards_snippet_agrees_with_encode(tiny_checkpoint, tmp_path):
    from safetensors.torch import load_file, save_file
    import lora
    from model import Embedder
    from runs.export import load_embedder, save_hf_folder
    backbone = tmp_path / "bf16_release"  # a release as shipped: bf16 weights, config.json saying so
    shutil.copytree(tiny_checkpoint, backbone)
    weights = load_file(backbone / "model.safetensors")
    save_file({k: v.to(torch.bfloat16) for k, v in weights.items()}, backbone / "model.safetensors", {"format": "pt"})
    config = json.loads((backbone / "config.json").read_text())
    (backbone / "config.json").write_text(json.dumps(dict(config, dtype="bfloat16")))
    embedder = Embedder.from_pretrained(str(backbone), max_pixels=4096)  # float32 master weights, as train.py
    lora.inject_lora(embedder.model, 4, 8)
    for module in embedder.modules():
        if isinstance(module, lora.LoRALinear):
            torch.nn.init.normal_(module.lora_B, std=0.2)
    export = str(tmp_path / "run" / "export")
    state = lora.merge_lora_state_dict(embedder.state_dict(), 8)
    save_hf_folder(state, embedder.spec, export, {"step": 1, "trained_lora_rank": 4, "config": {"seed": 1}})
    assert json.loads(open(os.path.join(export, "config.json")).read())["dtype"] == "float32"  # what it holds
    assert {v.dtype for v in load_file(os.path.join(export, "model.safetensors")).values()} == {torch.float32}
    assert json.load(open(os.path.join(export, "preprocessor_config.json")))["size"]["longest_edge"] == 4096
    card = open(os.path.join(export, "README.md")).read()
    namespace = {}
    exec(card.split("```python\n")[2].split("```")[0], namespace)  # noqa: S102 - as a reader runs it
    reloaded, _ = load_embedder(export)
    assert reloaded.spec == embedder.spec  # the spec travels with the export
    query = {"text": "Find the caption that best describes this picture: a red circle", "image": None}
    expected = reloaded.encode([query])[0]
    assert float((namespace["query"] - expected).norm() / expected.norm()) < 1e-4
    torch.testing.assert_close(expected, embedder.encode([query])[0], atol=1e-5, rtol=0)  # the trained weights


def test_an_export_trained_with_matryoshka_dims_says_so_where_vllm_looks(tiny_embedder, tmp_path):
    from runs.export import load_embedder, save_hf_folder
    plain, mrl = str(tmp_path / "plain"), str(tmp_path / "mrl")
    save_hf_folder(tiny_embedder.state_dict(), tiny_embedder.spec, plain, {"step": 1, "config": {}})
    save_hf_folder(tiny_embedder.state_dict(), tiny_embedder.spec.replace(matryoshka_dims=(16, 32)), mrl,
                   {"step": 1, "config": {}})
    config = json.load(open(os.path.join(mrl, "config.json")))
    assert config["is_matryoshka"] is True and config["matryoshka_dimensions"] == [16, 32, 64]  # the whole vector too
    assert "is_matryoshka" not in json.load(open(os.path.join(plain, "config.json")))
    assert load_embedder(mrl, dim=16)[0].dim == 16  # transformers still loads the config


def test_a_checkpoints_fingerprint_follows_its_weights_not_its_place(tiny_checkpoint, tmp_path):
    from safetensors.torch import load_file, save_file
    copy, trained = tmp_path / "copy", tmp_path / "trained"
    shutil.copytree(tiny_checkpoint, copy)
    shutil.copytree(tiny_checkpoint, trained)
    weights = load_file(trained / "model.safetensors")  # the same shape, one tensor trained: the same size on disk
    name = sorted(weights)[len(weights) // 2]
    save_file(dict(weights, **{name: weights[name] + 0.01}), trained / "model.safetensors", {"format": "pt"})
    assert (trained / "model.safetensors").stat().st_size == (copy / "model.safetensors").stat().st_size
    assert checkpoint.fingerprint(tiny_checkpoint) == checkpoint.fingerprint(str(copy))
    assert checkpoint.fingerprint(str(trained)) != checkpoint.fingerprint(str(copy))


# -----------------------------------------------------------------------------
# an evaluation that resumes

def test_a_stopped_evaluation_resumes_and_ends_with_the_uninterrupted_json(toy, tmp_path, capsys):
    import eval as evaluation
    args = ["config/shapes_eval.py", f"--init_from={toy['checkpoint']}", f"--mmeb_dir={toy['eval']}",
            f"--image_dir={toy['images']}", "--num_workers=0", "--geometry_samples=40", "--v2_dir="]
    three = "--datasets=['Shapes-CLS', 'Shapes-VQA', 'Shapes-T2I']"
    straight = evaluation.main(args + [three, f"--out={tmp_path / 'straight.json'}"])
    out = f"--out={tmp_path / 'stopped.json'}"
    os.makedirs(tmp_path / "stopped_datasets")  # what a run killed during its second dataset leaves: the first alone
    for suffix in (".json", ".geometry.safetensors"):
        shutil.copy(tmp_path / "straight_datasets" / f"Shapes-CLS{suffix}", tmp_path / "stopped_datasets")
    capsys.readouterr()
    resumed = evaluation.main(args + [three, out])
    said = capsys.readouterr().out
    assert re.search(r"^Shapes-CLS: P@1 [\d.]+, kept from an earlier run with the same checkpoint", said, re.M)
    assert not re.search(r"^Shapes-CLS: \d+/\d+ items", said, re.M)  # not encoded again
    assert re.search(r"^Shapes-VQA: \d+/\d+ items", said, re.M)  # the rest were
    timing = ("seconds", "items_per_second")
    strip = lambda d: {k: {kk: vv for kk, vv in v.items() if kk not in timing} for k, v in d.items()}  # noqa: E731
    assert strip(resumed["datasets"]) == strip(straight["datasets"])
    for key in ("overall", "IND", "OOD", "meta_tasks"):
        assert resumed[key] == straight[key]
    from tools.geometry import from_results  # the samples kept are the same too: each dataset seeds its own
    assert from_results(str(tmp_path / "stopped.json"))[0]["random_pair_mean_cos"] == \
        from_results(str(tmp_path / "straight.json"))[0]["random_pair_mean_cos"]
    changed = evaluation.main(args + [three, out, "--max_length=300"])  # a spec field changed: computed again
    assert "kept from an earlier run" not in capsys.readouterr().out and changed["spec"]["max_length"] == 300


# -----------------------------------------------------------------------------
# SLURM

@pytest.mark.slow
def test_the_slurm_script_asks_for_the_signal_train_py_handles_and_requeues(tmp_path):
    script = os.path.join(ROOT, "cluster", "pace.sbatch")
    assert subprocess.run(["bash", "-n", script]).returncode == 0
    text = open(script).read()
    warned = re.search(r"^#SBATCH --signal=B:(\w+)@(\d+)$", text, re.M)
    stop_signals = script_defaults("train.py")["stop_signals"]  # as train.py --help says them
    assert f"SIG{warned.group(1)}" in stop_signals and "SIGTERM" in stop_signals  # the warning and preemption
    env = {**os.environ, "PACE_DRY_RUN": "1", "PACE_HEAD_NODE": "node01", "SLURM_JOB_NUM_NODES": "2",
           "SLURM_JOB_ID": "77"}
    dry = subprocess.run(["bash", script, "config/stage1.py", "--init_from=/models/Qwen3.5-0.8B-Base"], cwd=ROOT,
                         env=env, capture_output=True, text=True)
    assert dry.returncode == 0
    assert ("srun --ntasks-per-node=1 torchrun --nnodes=2 --nproc_per_node=8 --rdzv_id=77 --rdzv_backend=c10d "
            "--rdzv_endpoint=node01:29500 train.py config/stage1.py --init_from=/models/Qwen3.5-0.8B-Base "
            "--resume=True") in dry.stdout
    handled = re.search(r"PET_SIGNALS_TO_HANDLE=(\S+) PET_SHUTDOWN_TIMEOUT=(\d+)", dry.stdout)
    assert f"SIG{warned.group(1)}" in handled.group(1).split(",")  # torchrun passes the warning on to train.py
    assert int(handled.group(2)) < int(warned.group(2))  # train.py's save gets its time before the limit
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "scontrol").write_text(f"#!/bin/bash\necho \"$@\" > {tmp_path / 'scontrol.args'}\n")
    (fake / "scontrol").chmod(0o755)
    job = subprocess.Popen(["bash", script, "config/stage1.py"], cwd=ROOT, text=True, stdout=subprocess.PIPE,
                           env={**env, "PACE_FAKE_STATUS": "1", "PATH": f"{fake}:{os.environ['PATH']}"})
    time.sleep(1)
    job.send_signal(signal.SIGUSR1)  # the time-limit warning, as SLURM sends it to the batch script
    stdout, _ = job.communicate(timeout=30)
    assert "SIGUSR1: the time limit is near" in stdout and "requeueing job 77" in stdout
    assert (tmp_path / "scontrol.args").read_text().split() == ["requeue", "77"]


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o002, 0o664)])
def test_written_files_get_the_mode_the_umask_gives(tiny_embedder, tmp_path, umask, mode):
    # a model or a result on a shared cluster: the group reads what the user's umask lets it read. safetensors'
    # save_file alone leaves 0600
    from safetensors.torch import save_file
    import common
    from runs.export import save_hf_folder
    previous = os.umask(umask)
    try:
        export = str(tmp_path / "export")
        save_hf_folder(tiny_embedder.state_dict(), tiny_embedder.spec, export, {"step": 1, "config": {}})
        with common.replaced_atomically(str(tmp_path / "vectors.safetensors")) as tmp:  # search's and eval's kept files
            save_file({"vectors": torch.zeros(2, 3)}, tmp)
        common.write_json(str(tmp_path / "eval.json"), {"overall": 1.0})
    finally:
        os.umask(previous)
    written = [os.path.join(top, name) for top, _, names in os.walk(export) for name in names]
    written += [str(tmp_path / "vectors.safetensors"), str(tmp_path / "eval.json")]
    assert os.path.join(export, "model.safetensors") in written
    assert os.path.join(export, "1_Pooling", "config.json") in written
    assert oct(os.stat(os.path.join(export, "1_Pooling")).st_mode & 0o777) == oct(0o777 & ~umask)  # a folder: rwx
    assert {path: oct(os.stat(path).st_mode & 0o777) for path in written} == {path: oct(mode) for path in written}


def test_an_exports_identity_follows_its_weights_and_spec_and_a_reexport_keeps_its_evaluation(tiny_embedder, tmp_path):
    # `--resume=True --export_only=True` writes the same weights with other launch settings in pace.json: the same
    # id (search.py and eval.py then accept what they made from it), and the card keeps eval.py's table
    from runs.checkpoint import fingerprint
    from runs.export import add_evaluation, save_hf_folder
    export, state = str(tmp_path / "export"), tiny_embedder.state_dict()
    save_hf_folder(state, tiny_embedder.spec, export, {"step": 4, "config": {"resume": False, "export_only": False}})
    first = fingerprint(export)
    add_evaluation(export, "| dataset | P@1 |\n| all | 47.8 |")
    save_hf_folder(state, tiny_embedder.spec, export, {"step": 4, "config": {"resume": True, "export_only": True}})
    assert fingerprint(export) == first
    assert "| all | 47.8 |" in open(os.path.join(export, "README.md")).read()
    changed = dict(state)
    name = next(k for k in changed if k.endswith("norm.weight"))
    changed[name] = changed[name] + 1e-3  # other weights: another id, and no evaluation carried over
    save_hf_folder(changed, tiny_embedder.spec, export, {"step": 4, "config": {}})
    assert fingerprint(export) != first
    card = open(os.path.join(export, "README.md")).read()
    assert "47.8" not in card and "Not evaluated yet" in card
    save_hf_folder(state, tiny_embedder.spec.replace(similarity="dot"), export, {"step": 4, "config": {}})
    assert fingerprint(export) != first  # the same weights under another spec are other vectors


def test_the_exports_chat_template_and_cards_code_give_encodes_ids_and_vectors(tiny_embedder, tmp_path):
    # the chat template renders a user message as the embedding prompt: its ids are the Preprocessor's for text, an
    # image, both; and the card's plain-transformers code (no torchvision needed) gives encode()'s vectors for each
    from PIL import Image
    from runs.export import save_hf_folder
    from model import Embedder
    export = str(tmp_path / "export")
    save_hf_folder(tiny_embedder.state_dict(), tiny_embedder.spec, export, {"step": 1, "config": {}})
    exported = Embedder.from_pretrained(export)
    prep = exported.preprocessor
    photo = str(tmp_path / "photo.png")
    Image.effect_noise((90, 60), 50).convert("RGB").save(photo)
    items = [("a red circle at the top", None), ("", photo), ("What shape is it?", photo)]
    for text, image in items:
        content = ([{"type": "image"}] if image else []) + ([{"type": "text", "text": text}] if text else [])
        rendered = prep.tokenizer.apply_chat_template([{"role": "user", "content": content}], tokenize=False)
        if image:  # the processor's step: one placeholder becomes the image's tokens
            count = prep.num_tokens(text, image) - prep.num_tokens(text) - 2
            rendered = rendered.replace("<|image_pad|>", "<|image_pad|>" * count)
        ids = prep.tokenizer(rendered, add_special_tokens=False)["input_ids"]
        assert ids == prep(text, image)["input_ids"].tolist(), (text, image)
    card = open(os.path.join(export, "README.md")).read()
    namespace = {}
    exec(card.split("```python\n")[2].split("```")[0], namespace)  # noqa: S102 - as a reader runs it
    expected = exported.encode([{"text": text, "image": image} for text, image in items])
    got = torch.stack([namespace["embed"](text, image) for text, image in items])
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_the_readmes_code_runs_as_a_script_in_another_folder(tiny_embedder, tmp_path):
    # "Using a trained model", saved as a script outside the repository and run as the README says: with the
    # repository on PYTHONPATH, its paths the working directory's
    from runs.export import save_hf_folder
    readme = open(os.path.join(ROOT, "README.md")).read().split("## Using a trained model")[1]
    code = readme.split("```python\n")[1].split("```")[0]
    assert 'load_embedder("out/stage2/export")' in code and "PYTHONPATH=/path/to/pace python my_script.py" in readme
    save_hf_folder(tiny_embedder.state_dict(), tiny_embedder.spec.replace(similarity="dot"),
                   str(tmp_path / "out" / "stage2" / "export"), {"step": 1})
    Image.new("RGB", (64, 48), (200, 30, 30)).save(tmp_path / "photo.jpg")
    os.makedirs(tmp_path / "clips" / "dog")
    for frame in range(3):  # the README's video: a folder of frames
        Image.new("RGB", (64, 48), (30, 30 + 60 * frame, 200)).save(tmp_path / "clips" / "dog" / f"{frame:03d}.jpg")
    (tmp_path / "my_script.py").write_text(code + "\nprint(tuple(vectors.shape), float(scores))\n")
    run = subprocess.run([sys.executable, "my_script.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=ROOT))
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1].startswith(f"(3, {tiny_embedder.dim}) ")
    alone = subprocess.run([sys.executable, "my_script.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                           env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert "No module named 'runs'" in alone.stderr  # without it, what the README's line fixes
