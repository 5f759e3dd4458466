"""
runs/cost.py: what a training step costs and which kernels run it, for the MFU of train.py's log and the bench: a
step's useful FLOPs, a GPU's dense bf16 peak, and the code that runs the Gated DeltaNet and its causal conv1d.

    mfu = step_flops(embedder, chunks, full_finetune=False) / seconds / peak_flops(device)
    print(kernel_report(device))   # 'kernels: Gated DeltaNet: forward fla 0.6.0, backward ...; causal conv1d ...'
"""
import importlib

import torch

import deltanet


# dense bf16 peak FLOP/s per GPU, matched against torch.cuda.get_device_name() in order (the first match wins)
PEAK_BF16_FLOPS = (("H100 PCIe", 756e12), ("H100 NVL", 835e12), ("H100", 989e12), ("H200", 989e12), ("H800", 989e12),
                   ("H20", 148e12), ("A100", 312e12), ("A800", 312e12), ("B200", 2250e12), ("L40S", 362e12))


def peak_flops(device):
    """The dense bf16 peak of this device, for MFU; None on a CPU or an unknown GPU."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((flops for gpu, flops in PEAK_BF16_FLOPS if gpu in name), None)


def step_flops(embedder, chunks, full_finetune):
    """Useful FLOPs of one training step over these collated chunks (real tokens only, no recomputation): the
    language model's matmuls at 2N a token forward and 4N (full) or 2N (LoRA: activation gradients only) backward,
    N without the token embedding (a lookup); the causal attention scores of the full-attention layers (2 T^2 d
    forward, twice that backward); the frozen vision tower's forward. Gated DeltaNet's state updates (a few % at
    these sizes) are not counted. For the MFU figure."""
    text, vision = embedder.model.config.text_config, embedder.model.config.vision_config
    language = sum(p.numel() for n, p in embedder.model.language_model.named_parameters()
                   if p.dim() >= 2 and "embed_tokens" not in n)
    tower = {n: p.numel() for n, p in embedder.model.visual.named_parameters() if p.dim() >= 2 and "pos_embed" not in n}
    per_patch = sum(v for n, v in tower.items() if "merger" not in n)
    per_patch += sum(v for n, v in tower.items() if "merger" in n) / vision.spatial_merge_size ** 2
    attention_width = text.num_attention_heads * text.head_dim
    full_layers = sum(kind == "full_attention" for kind in text.layer_types) if embedder.family.linear_attention \
        else text.num_hidden_layers
    flops = 0.0
    for chunk in chunks:
        lengths = chunk["attention_mask"].sum(dim=1).double()  # (B,)
        flops += (6 if full_finetune else 4) * language * lengths.sum().item()
        flops += 6 * full_layers * attention_width * (lengths ** 2).sum().item()
        if chunk["image_grid_thw"] is not None:
            patches = chunk["image_grid_thw"].prod(dim=1).double()  # (images,)
            flops += 2 * per_patch * patches.sum().item() + 4 * vision.depth * vision.hidden_size * (patches ** 2).sum().item()
    return flops


def kernel_report(device):
    """One line: which code runs Qwen3.5's Gated DeltaNet (deltanet.paths: fla's kernels where they are right, else
    deltanet.py's PyTorch rule) and its causal conv1d (transformers binds causal_conv1d where it imports, else
    F.conv1d, one cuDNN call a layer on a GPU)."""
    from transformers.models.qwen3_5 import modeling_qwen3_5  # noqa: F401 - binds causal_conv1d on import
    try:
        conv = all(getattr(importlib.import_module("causal_conv1d"), name, None) is not None
                   for name in ("causal_conv1d_fn", "causal_conv1d_update"))
    except Exception:  # noqa: BLE001 - transformers treats every import failure as "not installed"
        conv = False
    norm = "fla's fused kernel" if deltanet.fused_norm_on(device) else "transformers' ops"
    return (f"kernels: {deltanet.paths(device).line}; gated RMSNorm {norm}; causal conv1d "
            f"{'causal_conv1d' if conv else 'F.conv1d'}")
