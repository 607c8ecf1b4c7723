"""Shared reference-side LoRA helpers for the dump_lora_* scripts.

The reference's trainer (`optiq.vlm.diffusion_gemma.lora.train_diffusion_lora`, mlx-optiq 0.7.7)
cannot take a gradient as shipped: in training mode the MoE `Experts` stop gradients at their
routing indices, but `Router.__call__` gathers its scores and `per_expert_scale` with the same
top-k indices without stopping them, so `mx.value_and_grad` raises "[gather] Cannot calculate VJP
with respect to indices". `patch_router_stop_gradient()` replaces `Router.__call__` with the same
computation whose top-k indices are `mx.stop_gradient`-ed: routing is not differentiated, the
routing weights (softmax over the gathered scores, times per_expert_scale) are. This is the
semantics dg implements; every LoRA gradient golden comes from the patched reference.
"""

from __future__ import annotations

import mlx.core as mx
from optiq.vlm._mlxvlm.models.diffusion_gemma import language


def _router_call_with_stopped_indices(self, x):
    x = mx.fast.rms_norm(x, None, self.eps)
    x = x * self.scale * self._root_size
    scores = self.proj(x)
    top_k = self.config.top_k_experts
    indices = mx.argpartition(scores, kth=-top_k, axis=-1)[..., -top_k:]
    indices = mx.stop_gradient(indices)  # the one change
    weights = mx.take_along_axis(scores, indices, axis=-1)
    weights = mx.softmax(weights, axis=-1, precise=True)
    weights = weights * self.per_expert_scale[indices]
    return indices, weights


def patch_router_stop_gradient() -> None:
    """Make the reference's router differentiable (see the module docstring)."""
    language.Router.__call__ = _router_call_with_stopped_indices


def setup_reference() -> None:
    """The pinned reference (mlx 0.32.4, mlx-lm 0.32.2, mlx-optiq 0.7.7) on the CPU, router
    patched: what every LoRA gradient and training golden is computed with."""
    from importlib.metadata import version

    assert mx.__version__ == "0.32.4", mx.__version__
    assert version("mlx-lm") == "0.32.2", version("mlx-lm")
    assert version("mlx-optiq") == "0.7.7", version("mlx-optiq")
    mx.set_default_device(mx.cpu)
    patch_router_stop_gradient()
