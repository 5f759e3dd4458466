"""
lora.py: hand-rolled LoRA for the language model of an embedder: inject (Stage I trains rank-32 adapters, the vision
tower frozen), then merge (Stage II trains the merged language model; paper, Table 3). It edits a model in place:

    names = inject_lora(embedder.model, rank=32, alpha=64)   # Stage I: only lora_A / lora_B train
    merge_lora(embedder.model)                               # Stage II: back to plain nn.Linear

A LoRALinear computes W x + b + (alpha / r) B A x, A: (r, in), B: (out, r), B = 0 at init (an injected model starts
as the base model). It keeps the base Parameters under `weight` / `bias`, so the base state_dict keys stay and only
`lora_A` / `lora_B` are added. Merging is an explicit one-way call; both come before FSDP2's fully_shard.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

# Leaf names of the language model's linear layers in transformers' qwen3_5: full attention,
# Gated DeltaNet linear attention, and the MLP of every layer.
TARGET_NAMES = frozenset({
    'q_proj', 'k_proj', 'v_proj', 'o_proj',
    'in_proj_qkv', 'in_proj_z', 'in_proj_b', 'in_proj_a', 'out_proj',
    'gate_proj', 'up_proj', 'down_proj',
})


class LoRALinear(nn.Linear):
    """nn.Linear plus a trainable low-rank update; takes over the base layer's Parameters, no copy."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float = 0.0):
        nn.Module.__init__(self)  # not nn.Linear.__init__: it would allocate and init a weight we discard
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight, self.bias = base.weight, base.bias  # the same Parameter objects as the base layer
        self.weight.requires_grad_(False)
        if self.bias is not None:
            self.bias.requires_grad_(False)
        self.rank, self.alpha, self.scale, self.dropout = rank, alpha, alpha / rank, dropout
        # Adapters in the base weight's dtype and device: FSDP2 wants one dtype per shard unit.
        like = dict(dtype=self.weight.dtype, device=self.weight.device)
        self.lora_A = nn.Parameter(torch.empty(rank, self.in_features, **like))   # (r, in)
        self.lora_B = nn.Parameter(torch.empty(self.out_features, rank, **like))  # (out, r)
        self.reset_lora_parameters()

    def reset_lora_parameters(self):
        """A as nn.Linear inits its weight, B = 0: the update B A is zero and its gradient is not."""
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B)

    def forward(self, x):  # x: (..., in)
        base = F.linear(x, self.weight, self.bias)  # (..., out)
        x = F.dropout(x, self.dropout, self.training)
        # (..., in) -> (..., r) -> (..., out): two thin matmuls, never the (out, in) product B A.
        update = F.linear(F.linear(x, self.lora_A), self.lora_B)
        return base + self.scale * update

    def merged_weight(self):
        """W + (alpha / r) B A: (out, in), in W's dtype."""
        return merged_weight(self.weight.detach(), self.lora_A.detach(), self.lora_B.detach(), self.scale)

    def extra_repr(self):
        return f"{super().extra_repr()}, rank={self.rank}, alpha={self.alpha}, dropout={self.dropout}"


def merged_weight(weight, lora_A, lora_B, scale):
    """W + scale B A with W (out, in), A (r, in), B (out, r): summed in float32 and cast back to W's dtype, so a
    bf16 W loses nothing more than its own rounding. The one merge formula: merge_lora and merge_lora_state_dict."""
    return (weight.float() + scale * (lora_B.float() @ lora_A.float())).to(weight.dtype)


def is_target(name, module):
    """A linear layer of the language model, by qualified name; nothing under the vision tower."""
    parts = name.split('.')
    return (isinstance(module, nn.Linear) and parts[-1] in TARGET_NAMES
            and 'language_model' in parts and 'visual' not in parts)


def replace_module(model, name, new):
    parent_name, _, leaf = name.rpartition('.')
    setattr(model.get_submodule(parent_name), leaf, new)


def inject_lora(model: nn.Module, rank: int, alpha: float, dropout: float = 0.0) -> list[str]:
    """Wrap every target linear in a LoRALinear and freeze all else of model (then only the adapters train); ->
    the sorted wrapped names."""
    if not (isinstance(rank, int) and rank > 0):
        raise ValueError(f"LoRA rank must be a positive int, got {rank!r}")
    if any(isinstance(module, LoRALinear) for module in model.modules()):
        raise RuntimeError("model already has LoRA layers; merge_lora() it before injecting again")
    names = sorted(name for name, module in model.named_modules() if is_target(name, module))
    if not names:
        raise ValueError(f"no LoRA target found: no nn.Linear named one of {sorted(TARGET_NAMES)} "
                         f"under a submodule called 'language_model' in {type(model).__name__}")
    model.requires_grad_(False)  # before injecting, so the new adapters stay trainable
    for name in names:
        replace_module(model, name, LoRALinear(model.get_submodule(name), rank, alpha, dropout))
    return names


@torch.no_grad()
def merge_lora(model: nn.Module) -> int:
    """Fold each LoRALinear into a plain nn.Linear with W + (alpha / r) B A; -> how many. The merged model has the
    base model's state_dict keys, shapes and dtypes; the caller decides what trains next (Stage II)."""
    names = [name for name, module in model.named_modules() if isinstance(module, LoRALinear)]
    for name in names:
        lora = model.get_submodule(name)
        # Built on the meta device so no throwaway (out, in) weight is allocated and initialised.
        merged = nn.Linear(lora.in_features, lora.out_features, bias=lora.bias is not None, device='meta')
        merged.weight = nn.Parameter(lora.merged_weight())
        if lora.bias is not None:
            merged.bias = nn.Parameter(lora.bias.detach())  # shares storage with the old bias
        merged.train(lora.training)
        replace_module(model, name, merged)
    return len(names)


@torch.no_grad()
def merge_lora_state_dict(state_dict: dict, alpha: float) -> dict:
    """merge_lora on a consolidated state_dict (gathered from FSDP2 shards at export time): for every
    `x.lora_A` / `x.lora_B` pair, `x.weight` becomes W + (alpha / r) B A, r read from lora_A's shape (r, in); the
    adapters are dropped. alpha: the run's lora_alpha. -> a new dict with the base model's keys (the same dict's
    tensors when there are no adapters)."""
    merged = {k: v for k, v in state_dict.items() if not k.endswith((".lora_A", ".lora_B"))}
    for key, lora_A in state_dict.items():
        if key.endswith(".lora_A"):
            prefix = key[:-len("lora_A")]
            merged[prefix + "weight"] = merged_weight(state_dict[prefix + "weight"], lora_A,
                                                      state_dict[prefix + "lora_B"], alpha / lora_A.shape[0])
    return merged
