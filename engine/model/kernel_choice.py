"""The model runner's kernels: the engines' matmul, the fused decoder layers, batch-invariant mode.

``engine.model.model_runner.ModelRunner`` inherits ``RunnerKernels``, the half of the runner that
picks what the model's arithmetic runs through: the engines' matmul kernel for its linears
(``engine.kernels.linear_kernel``: oneDNN on packed weights, or the skinny kernel), the continuous
engine's fused decoder layers (``engine.kernels.fused_layers``) and batch-invariant mode's kernels
(``engine.kernels.invariant_ops``), each made on first use, since packed and stacked copies of the
weights cost memory. It builds kernels from the weights and swaps the attention implementation;
calling the model stays the runner's (``forward_packed``, ``generate``).

A base class, not an object the runner holds, so that every name stays on the runner as the
engines, the bench and the tests use it (``runner.engine_kernels()``, ``runner.fused_decoder``,
``runner.engine_kernel_bytes``). The subclass sets ``model``, ``device`` and ``dtype``, then calls
``init_kernels``.
"""

from __future__ import annotations

import contextlib
import functools

import torch
import torch.nn.functional as F

from engine.kernels import fused_layers, invariant_ops, linear_kernel


class RunnerKernels:
    """The kernel half of ``engine.model.model_runner.ModelRunner``; see the module docstring."""

    def init_kernels(self) -> None:
        """Find the model's linears and read the host's kernel settings (nothing is made yet).

        Raises:
            ValueError: ``CBP_ENGINE_KERNEL`` is set to something other than ``auto`` or
                ``skinny``, or ``CBP_FUSED_LAYERS`` to something other than ``auto`` or ``off``.
        """
        # The engines' matmul kernel pays off on CPU only; CUDA and MPS keep their own matmuls.
        cpu = self.device.type == "cpu"
        self._linears = linear_kernel.linear_modules(self.model) if cpu else []
        self._kernel_choice = linear_kernel.requested_kernel()  # ValueError: a bad host setting
        # forward_packed through engine.kernels.fused_layers where they apply; ValueError: a bad
        # setting
        self.use_fused_layers = fused_layers.requested()
        self.decoder_layer_steps = {"fused": 0, "transformers": 0}  # forward_packed calls by path

    def engine_kernels(self, batch_invariant: bool = False):
        """Context: the engines' matmul kernel (``engine.kernels.linear_kernel``) for the model's
        linears.

        Both engines run inside it; the reference and the floor run plain ``model.generate``.
        ``batch_invariant``: the batch-invariant mode's kernels instead
        (``engine.kernels.invariant_ops``: every linear, norm and MLP in fixed row tiles, rotary
        tables, and for ``model.generate`` the invariant attention), on every device.

        Raises:
            ValueError: batch-invariant mode for a model it does not support.
        """
        if batch_invariant:
            return self._invariant_context()
        return linear_kernel.installed(self._linears, self._kernel.forward)

    @contextlib.contextmanager
    def _invariant_context(self):
        with (
            self.invariant_kernels.installed(),
            self._attention(invariant_ops.INVARIANT_ATTENTION),
        ):
            yield

    @functools.cached_property
    def invariant_kernels(self) -> invariant_ops.InvariantKernels:
        """The batch-invariant mode's kernels for this model (made on first use).

        Raises:
            ValueError: the model is not a Llama-style decoder (``engine.kernels.invariant_ops``).
        """
        forward = self._kernel.forward if self._linears else _plain_linear
        tile = invariant_ops.tile_rows_for(self.device.type, self.dtype, self.engine_kernel_name)
        return invariant_ops.InvariantKernels(self.model, forward, tile)

    def require_batch_invariant(self) -> None:
        """Make the batch-invariant kernels now. Raises ValueError: a model it does not support."""
        _ = self.invariant_kernels

    @property
    def engine_kernel_name(self) -> str:
        """The engines' matmul kernel here: ``"onednn"``, ``"skinny"``, or ``"none"`` (GPU)."""
        return self._kernel.name

    @property
    def engine_kernel_bytes(self) -> int:
        """Memory the engines' kernels add (oneDNN's packed weight copies, and the fused
        decoder's stacked copies once the continuous engine has made them), in bytes."""
        fused = self.__dict__.get("fused_decoder")
        return self._kernel.extra_bytes + (fused.extra_bytes if fused is not None else 0)

    @property
    def decoder_layers(self) -> str | None:
        """Which layers ``forward_packed`` ran since ``decoder_layer_steps`` was last reset:
        ``"fused"``, ``"transformers"``, ``"mixed"`` (batch-invariant steps among fused ones),
        or None (no step)."""
        ran = [name for name, steps in self.decoder_layer_steps.items() if steps]
        return None if not ran else ran[0] if len(ran) == 1 else "mixed"

    @functools.cached_property
    def fused_decoder(self) -> fused_layers.FusedDecoder | None:
        """The continuous engine's fused layers (``engine.kernels.fused_layers``), made on first
        use; None where they do not apply (not a CPU, not a Llama-style model, no linear kernel)."""
        if not self._linears or fused_layers.unsupported_reason(self.model) is not None:
            return None
        try:
            return fused_layers.FusedDecoder(self.model, self._kernel.name)
        except RuntimeError:  # oneDNN refused a stacked weight: the model's own layers
            return None

    @functools.cached_property
    def _kernel(self) -> linear_kernel.Kernel:
        # Made on first use: oneDNN's packed copies double the weights' memory.
        return linear_kernel.best_kernel(self._linears, self._kernel_choice)

    @contextlib.contextmanager
    def _attention(self, name: str):
        config = self.model.config
        previous = config._attn_implementation
        config._attn_implementation = name
        try:
            yield
        finally:
            config._attn_implementation = previous


def _plain_linear(module, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, module.weight, module.bias)
