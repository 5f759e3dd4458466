"""
runs/checkpoint.py: what train.py's folders hold on disk, and how they are checked before anything trusts them.

    out_dir/step_NNNNNN/   a training step: the sharded model and optimizer (torch.distributed.checkpoint:
                           .metadata and __<rank>_<n>.distcp), rng_rank<r>.pt per rank, the embedding spec
                           (model.SPEC_FILE) and pace.json (step, data position, config, and every file's size
                           and CRC-32), written last
    out_dir/export/        the merged model as a Hugging Face folder (runs/export.py)

save_step and load_step write and read a step folder on every rank of a run (train.py); the rest checks one.

A step folder is written under a .tmp name and renamed when complete, so a crash leaves no half-written one
that looks finished. verify() reads back each file's size and checksum: a truncated, emptied or corrupted
file names the folder and the file. Loading a step folder is safe: its .metadata pickle is read by an
unpickler that builds only the few classes such a file holds (load_state), and the shards' non-tensor entries
and the RNG files as plain data only (weights_only). The export's safetensors never run code.
"""
import glob
import json
import os
import pickle
import re
import shutil
import warnings
import zlib

import torch

import common
from common import UserError

# what defines a run: changing one on resume makes the rest of the run another experiment than its first steps.
# Every config key of train.py does (every field of the embedding spec, model.EmbeddingSpec, by the config key of its
# name; backbone follows init_from; the data and its reading; the loss and its settings; LoRA; the seed and batch; a
# fork's new key too, with no list to add it to) but the ones below, which only steer the rest of the run or say where
# and how it runs. defining(config) is the rest.
STEERING = ("max_iters", "learning_rate", "warmup_ratio", "lr_decay", "weight_decay", "adam_betas", "grad_clip",
            "table_dir", "allow_any_image_path", "grad_cache_chunk", "micro_batch", "num_workers",
            "checkpoint_interval", "checkpoint_minutes", "stop_signals", "keep_checkpoints", "keep_last",
            "max_bad_steps", "log_interval", "device", "dtype", "activation_checkpointing", "threads",
            "timeout_minutes", "wandb_log", "wandb_project", "wandb_run_name")
NOT_COMPARED = ("out_dir", "resume", "overwrite", "export_only", "check_data", "allow_config_change")  # where and how, not what


def defining(config):
    """The keys of a config (train.py's) that define its run: all but STEERING and NOT_COMPARED, in its order."""
    return [key for key in config if key not in STEERING + NOT_COMPARED]


# torch.distributed.checkpoint says this at every save and load in one process, which is how it is meant here
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")

INFO = "pace.json"  # beside the weights: how the model was trained, and the files to verify
SPEC_FILE = "embedding_spec.json"  # model.SPEC_FILE (not imported: train.py's import chain stays three deep)
STEP_NAME = re.compile(r"step_\d{6}$")


def step_path(out_dir, step):
    return os.path.join(out_dir, f"step_{step:06d}")


def complete(out_dir):
    """The complete step folders of out_dir (renamed from .tmp, pace.json inside), oldest first."""
    paths = [p for p in glob.glob(os.path.join(glob.escape(out_dir), "step_*")) if STEP_NAME.search(p)]
    return sorted(p for p in paths if os.path.isfile(os.path.join(p, INFO)))


def remove(path):
    """Delete a file or a folder, if it is there."""
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.exists(path):
        os.remove(path)


def read_info(path):
    """The pace.json of an export/ or step folder; {} for a plain release. ValueError naming a broken one."""
    info_path = os.path.join(path, INFO)
    if not os.path.isfile(info_path):
        return {}
    try:
        with open(info_path) as f:
            return json.load(f)
    except (OSError, ValueError) as error:
        raise UserError(f"{path}: broken checkpoint, cannot read {INFO} ({error})") from None


def fingerprint(path):
    """A short id of what defines a checkpoint's vectors: its weights and its embedding spec (model.SPEC_FILE), never
    how its run was launched (a resumed run, a re-export: the same weights keep the id). A step folder: the size and
    CRC-32 of every file its pace.json records. A release or an export: its config.json and the CRC-32 of every
    weight file (about a second a GB: two releases of one shape, a random and a trained one, differ only there). A
    copy elsewhere keeps the id."""
    import hashlib
    digest, files = hashlib.sha256(), read_info(path).get("files")
    for name in (SPEC_FILE, "config.json"):
        if os.path.isfile(os.path.join(path, name)):
            with open(os.path.join(path, name), "rb") as f:
                digest.update(name.encode() + f.read())
    if files:
        digest.update(json.dumps(files, sort_keys=True).encode())
    else:
        for name in sorted(os.listdir(path)):
            if name.endswith(".safetensors"):
                digest.update(f"{name}:{json.dumps(file_record(os.path.join(path, name)))}".encode())
    return digest.hexdigest()[:16]


def file_record(path):
    """{"bytes": size, "crc32": checksum}: what pace.json keeps of each file. CRC-32 reads at GB/s, little next to
    writing the shards; it catches a flipped byte, which the size alone would not."""
    crc = 0
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            crc = zlib.crc32(block, crc)
    return {"bytes": os.path.getsize(path), "crc32": crc}


def record_files(folder, rank, world_size):
    """Every rank records the files it wrote into folder (its shards __<rank>_*, its RNG state; rank 0 also
    .metadata); rank 0 gets them all, plus any file no rank claimed. -> {name: record} on rank 0, else {}."""
    names = os.listdir(folder)
    mine = [n for n in names if n.startswith(f"__{rank}_") or n == f"rng_rank{rank}.pt"
            or (rank == 0 and n == ".metadata")]
    records = {name: file_record(os.path.join(folder, name)) for name in mine}
    if world_size > 1:
        gathered = [None] * world_size
        torch.distributed.all_gather_object(gathered, records)
        records = {name: record for part in gathered for name, record in part.items()}
    if rank != 0:
        return {}
    for name in set(names) - set(records) - {INFO}:
        records[name] = file_record(os.path.join(folder, name))
    return dict(sorted(records.items()))


def verify(path):
    """A step folder -> its pace.json, once every file it lists has its recorded size and CRC-32 (sizes first:
    cheap, and a truncated or empty shard shows at once). ValueError naming the folder and the broken file."""
    info = read_info(path)
    if not info:
        raise UserError(f"{path}: not a step folder of this project (no {INFO})")
    files = info.get("files")
    if files is None:
        print(f"{path}: written before checkpoints recorded checksums; loading it unverified")
        return info
    for name, record in files.items():
        file = os.path.join(path, name)
        size = os.path.getsize(file) if os.path.isfile(file) else None
        if size != record["bytes"]:
            raise UserError(f"{path}: broken checkpoint, {name} is "
                             f"{'missing' if size is None else f'{size:,} bytes'}, {record['bytes']:,} written")
    for name, record in files.items():
        if file_record(os.path.join(path, name))["crc32"] != record["crc32"]:
            raise UserError(f"{path}: broken checkpoint, {name} has changed since it was written (CRC-32)")
    return info


def finish(tmp, path, info):
    """Complete a step folder written under tmp: pace.json last, then the rename that makes it a checkpoint."""
    with open(os.path.join(tmp, INFO), "w") as f:
        json.dump(info, f, indent=2)
    remove(path)
    os.replace(tmp, path)


def load_rng(path):
    """A rank's RNG states, read as tensors only: a shared checkpoint's pickle cannot run code here."""
    try:
        return torch.load(path, weights_only=True)
    except Exception as error:  # noqa: BLE001 - truncated, corrupt or hostile: the same answer
        raise UserError(f"{path}: broken checkpoint, cannot read the RNG states ({error})") from None


# -----------------------------------------------------------------------------
# loading a step folder safely: torch.distributed.checkpoint reads .metadata with pickle.load, and the shards'
# non-tensor entries (the optimizer's lr, betas, ...) with torch.load(weights_only=False), so a step folder from
# elsewhere could run code. These read both as data only.

METADATA_CLASSES = {("pathlib", "PosixPath"), ("pathlib._local", "PosixPath"), ("torch", "Size"),
                    ("torch.serialization", "_get_layout"), ("torch.distributed.checkpoint.filesystem", "_StorageInfo")}
METADATA_CLASSES |= {("torch.distributed.checkpoint.metadata", name) for name in (
    "Metadata", "MetadataIndex", "StorageMeta", "TensorStorageMetadata", "BytesStorageMetadata",
    "ChunkStorageMetadata", "TensorProperties", "_MEM_FORMAT_ENCODING")}  # all that dcp.save writes there


class MetadataUnpickler(pickle.Unpickler):
    """An unpickler that builds only METADATA_CLASSES and torch dtypes: what a .metadata written by
    torch.distributed.checkpoint holds. Anything else (os.system, say) is refused, not called."""

    def find_class(self, module, name):
        if (module, name) in METADATA_CLASSES or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"it asks for {module}.{name}, which torch.distributed.checkpoint never writes")


def read_metadata(path):
    """A step folder's .metadata, read safely; ValueError naming the folder for anything that is not DCP metadata."""
    from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
    try:
        with open(os.path.join(path, ".metadata"), "rb") as f:
            metadata = MetadataUnpickler(f).load()
    except Exception as error:  # noqa: BLE001 - hostile, truncated or corrupt: refused alike
        raise UserError(f"{path}: refusing its .metadata: {error}") from None
    if not isinstance(metadata, Metadata):
        raise UserError(f"{path}: refusing its .metadata: it holds a {type(metadata).__name__}, not DCP metadata")
    metadata.storage_meta = getattr(metadata, "storage_meta", None) or StorageMeta()
    return metadata


def load_state(state, path):
    """torch.distributed.checkpoint.load of a step folder into `state` (in place, on every rank alike), reading
    its .metadata with MetadataUnpickler and its non-tensor entries as plain data (weights_only)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    class Reader(dcp.FileSystemReader):
        def read_metadata(self, *args, **kwargs):
            metadata = read_metadata(self.path)
            metadata.storage_meta.load_id = self.load_id  # as the stock reader sets it
            return metadata

    class Planner(DefaultLoadPlanner):
        def load_bytes(self, read_item, value):
            try:
                torch.load(value, weights_only=True)  # plain data (numbers, strings, tuples) passes; code does not
            except Exception as error:  # noqa: BLE001
                raise UserError(f"{path}: refusing its entry {read_item.dest_index.fqn}: {error}") from None
            value.seek(0)
            super().load_bytes(read_item, value)

    read_metadata(path)  # first: dcp.load would swallow the refusal and fall back to another file
    try:
        dcp.load(state, storage_reader=Reader(path), planner=Planner())
    except dcp.api.CheckpointException as error:  # a BaseException: one line naming the folder instead
        causes = [cause[0] if isinstance(cause, tuple) else cause for cause in error.failures.values()]
        ours = [cause for cause in causes if isinstance(cause, ValueError) and str(cause).startswith(str(path))]
        raise UserError(str(ours[0]) if ours else f"{path}: cannot load it: {causes[0] if causes else error}") from None


# -----------------------------------------------------------------------------
# a step folder written and read back by every rank of a run

def save_step(path, model, optimizer, rank, world_size, info):
    """Each rank writes its shards (torch.distributed.checkpoint) and RNG state into path.tmp; rank 0 the embedding
    spec and pace.json (info, and every file's size and checksum), then renames the folder, so a complete-looking
    checkpoint is a complete one."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    tmp = path + ".tmp"
    print(f"saving {path} ...", flush=True)  # minutes for a full model and its optimizer: not silence
    if rank == 0:
        remove(tmp)
        os.makedirs(tmp)
        model.spec.save(tmp)
    common.barrier()
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=tmp)
    cuda = model.device.type == "cuda"
    torch.save({"cpu": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state() if cuda else None},
               os.path.join(tmp, f"rng_rank{rank}.pt"))
    common.barrier()
    files = record_files(tmp, rank, world_size)
    if rank == 0:
        finish(tmp, path, dict(info, files=files))
    common.barrier()
    print(f"saved {path}")


def load_step(path, model, optimizer, rank, world_size):
    """Restore model, optimizer and this rank's RNG (when the folder was written by as many ranks) from a verified
    step folder. -> its pace.json"""
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    info = read_info(path)
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state}
    load_state(state, path)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    rng_path = os.path.join(path, f"rng_rank{rank}.pt")
    if os.path.isfile(rng_path) and info.get("world_size") == world_size:
        rng = load_rng(rng_path)
        torch.set_rng_state(rng["cpu"])
        if rng["cuda"] is not None and model.device.type == "cuda":
            torch.cuda.set_rng_state(rng["cuda"])
    return info
