"""The model runner's kernels: the engines' matmul, the fused decoder layers, batch-invariant mode.

A base class of ``ModelRunner`` (so every name stays on the runner); the subclass sets ``model``,
``device`` and ``dtype``, then calls ``init_kernels``. How the plan is chosen:
docs/engines.md#kernels.
"""

from __future__ import annotations

import contextlib
import functools
import logging

from engine import settings
from engine.kernels import fused_layers, invariant_ops, kernel_plan, kernel_timing, linear_kernel
from engine.model import copy_budget, kernel_store, memory_account
from engine.model.kernel_store import KernelChoice

log = logging.getLogger(__name__)


class RunnerKernels:
    def init_kernels(self) -> None:
        """Read the host's kernel settings (nothing is made yet); ValueError: a bad setting."""
        # The engines' matmul kernel pays off on CPU only; CUDA and MPS keep their own matmuls.
        cpu = self.device.type == "cpu"
        self._linears = linear_kernel.linear_modules(self.model) if cpu else []
        self._kernel_setting = settings.choice("CBP_ENGINE_KERNEL", kernel_plan.KERNEL_CHOICES)
        self.copies_max = read_copies_max()
        fused_setting = settings.choice("CBP_FUSED_LAYERS", fused_layers.CHOICES)
        self.use_fused_layers = fused_setting == "auto"  # forward_packed's fused layers
        self.decoder_layer_steps = {"fused": 0, "transformers": 0}  # forward_packed calls by path
        retired = settings.value("CBP_COMPILED_STEP").strip().lower()
        if retired not in ("", "off"):  # a host's old setting: said, not refused
            log.warning("CBP_COMPILED_STEP=%s is ignored: the compiled step is gone", retired)

    def engine_kernels(self, batch_invariant: bool = False, head_only: bool = False):
        """Context: the engines' matmul for the model's linears (``head_only``: the output
        embedding alone, under the fused layers), or batch-invariant mode's (ValueError)."""
        if batch_invariant:
            return self._invariant_context()
        head = self.model.get_output_embeddings()
        linears = [head] if head_only and head in self._linears else self._linears
        return self.engine_kernel.installed(linears)

    @contextlib.contextmanager
    def _invariant_context(self):
        with (
            self.invariant_kernels.installed(),
            self._attention(invariant_ops.INVARIANT_ATTENTION),
        ):
            yield

    @functools.cached_property
    def invariant_kernels(self) -> invariant_ops.InvariantKernels:
        """Raises ValueError: the model is not a Llama-style decoder."""
        # every call has tile rows
        at_tile = self.engine_kernel.plan.name_at(invariant_ops.TILE_ROWS)
        tile = invariant_ops.tile_rows_for(self.device.type, self.dtype, at_tile)
        return invariant_ops.InvariantKernels(self.model, self.engine_kernel.forward, tile)

    def require_batch_invariant(self) -> None:
        """ValueError now, without packing copies, for a model batch-invariant mode refuses."""
        invariant_ops.check_supported(self.model)

    @property
    def engine_kernel_name(self) -> str:
        return self.engine_kernel.name

    @functools.cached_property
    def engine_kernel(self) -> kernel_plan.Kernel:
        """The kernel for ``kernel_choice``'s plan, made on first use (its copies cost memory)."""
        choice = self.kernel_choice
        if choice.origin == "none":
            return kernel_plan.NO_KERNEL
        if choice.origin == "fallback":
            return kernel_plan.PLAIN_KERNEL
        if choice.origin in ("forced", "default"):
            kernel = kernel_plan.best_kernel(self._linears, choice.plan.names[0])
        else:
            try:
                budget, groups = self.copy_budget, self._groups
                plans = (
                    {}
                    if budget is None
                    else {m: budget.plans[g] for g in groups for m in groups[g]}
                )
                kernel = kernel_plan.kernel_for(self._linears, choice.plan, plans)
            except RuntimeError:  # the timed weights passed, another one did not
                kernel = kernel_plan.best_kernel(self._linears, "linear")
        if kernel.plan != choice.plan:
            log.warning("oneDNN refused the weights: the engines' matmul is %s", kernel.name)
        return kernel

    @functools.cached_property
    def _groups(self) -> dict[str, list]:
        return copy_groups(self.model, self._linears)

    @functools.cached_property
    def copy_budget(self) -> copy_budget.CopyBudget | None:
        """The copies kept within ``CBP_WEIGHT_COPIES_MAX`` times the weights' bytes; None for
        a plan without timings (every copy kept)."""
        choice, groups = self.kernel_choice, self._groups
        if choice.timings is None:
            return None
        decoder = copy_budget.Pricing.of(choice.plan, choice.timings)
        pricing = {
            g: self._head_pricing(decoder) if self._head in ms else decoder
            for g, ms in groups.items()
        }
        bound = int(self.copies_max * memory_account.weights_bytes(self.model))
        weights = {g: sum(m.weight.nbytes for m in ms) for g, ms in groups.items()}
        copies = {
            g: {k: _copy_bytes(ms, k) for k in pricing[g].plan.kernels} for g, ms in groups.items()
        }
        return copy_budget.keep_copies(weights, copies, pricing, bound)

    def _head_pricing(self, decoder: copy_budget.Pricing) -> copy_budget.Pricing:
        """The LM head's own timing (``head_choice``); no copies where that timed nothing."""
        head = self.head_choice
        if head is None or head is self.kernel_choice:
            return decoder
        if head.origin == "fallback":
            return copy_budget.Pricing(head.plan, (), {}, 1)
        return copy_budget.Pricing.of(head.plan, head.timings)

    @property
    def engine_kernel_bytes(self) -> int:
        """Bytes of the packed and stacked weight copies made so far, each once."""
        self.engine_kernel  # noqa: B018  (made here, as before the account)
        return memory_account.memory_account(self)["packed_total_bytes"]

    def release_copies(self) -> int:
        """Drop the kernels made so far, to be made again on next use; returns their copies'
        bytes (the caller frees them: ``memory_account.release_freed``)."""
        nbytes = memory_account.memory_account(self)["packed_total_bytes"]
        for name in ("engine_kernel", "fused_decoder", "invariant_kernels", "copy_budget"):
            self.__dict__.pop(name, None)
        return nbytes

    @property
    def decoder_layers(self) -> str | None:
        """What ``decoder_layer_steps`` ran: ``"fused"``, ``"transformers"``, ``"mixed"``, None."""
        ran = [name for name, steps in self.decoder_layer_steps.items() if steps]
        return None if not ran else ran[0] if len(ran) == 1 else "mixed"

    @functools.cached_property
    def fused_decoder(self) -> fused_layers.FusedDecoder | None:
        """Made on first use; None where they do not apply (``fused_refusal`` says why)."""
        self.fused_refusal = "the engines' matmul runs on CPU only" if not self._linears else None
        if self.fused_refusal is None:
            try:
                kernel = self.engine_kernel
                shared = kernel.modules.planned if kernel.modules is not None else None
                return fused_layers.FusedDecoder(self.model, kernel.plan, shared)
            except ValueError as why:  # layer_spec.Unsupported: what the layers do not compute
                self.fused_refusal = str(why)
            except RuntimeError as why:  # oneDNN refused a stacked weight
                self.fused_refusal = f"oneDNN refused a stacked weight ({why})"
        log.info("The continuous step runs transformers' layers: %s", self.fused_refusal)
        return None

    @property
    def layers_path(self) -> str:
        """``"fused"`` or ``"transformers: <why>"``, for the bench JSON and the page (builds
        nothing)."""
        if not self.use_fused_layers:
            return "transformers: CBP_FUSED_LAYERS=off"
        if not self._linears:
            return "transformers: the fused layers run on CPU only"
        if "fused_decoder" in self.__dict__ and self.fused_decoder is None:
            return f"transformers: {self.fused_refusal}"
        reason = fused_layers.unsupported_reason(self.model)
        return "fused" if reason is None else f"transformers: {reason}"

    @property
    def layers_step(self) -> str | None:
        """``FusedDecoder.layers_step``; None where the fused layers were not made."""
        fused = self.__dict__.get("fused_decoder")
        return None if fused is None else fused.layers_step

    def step_summary(self) -> str:
        path = self.layers_path
        why = path.removeprefix("transformers: ")
        layers = "the fused layers" if path == "fused" else f"the model's own layers ({why})"
        return f"step: eager, {layers}"

    @functools.cached_property
    def kernel_choice(self) -> KernelChoice:
        """The decoder's matmul plan, made on first use (a host's first start times it, <= 5 s)."""
        if not self._linears:
            return KernelChoice(kernel_plan.RowPlan.single("none"), "none")
        if self._kernel_setting not in ("auto", "measure"):
            return KernelChoice(kernel_plan.RowPlan.single(self._kernel_setting), "forced")
        source = getattr(self.loaded, "source", None)
        if source is None:  # built in memory: nothing to key a file by, too small to time
            return KernelChoice(
                kernel_plan.RowPlan.single(kernel_timing.untimed_kernel()), "default"
            )
        decoder = [m for m in self._linears if m is not self._head] or self._linears
        sample = kernel_timing.sample_linears(decoder)
        return self._stored_or_measured(decoder, sample, "decoder", kernel_timing.ROW_COUNTS)

    @functools.cached_property
    def head_choice(self) -> KernelChoice | None:
        """The LM head's own plan (docs/engines.md#kernels); None where the head is not among
        the engines' linears."""
        head, choice = self._head, self.kernel_choice
        if head not in self._linears:
            return None
        untimed = getattr(self.loaded, "source", None) is None
        if untimed or choice.origin in ("none", "forced", "default", "fallback"):
            return choice
        budget = {"budget_s": kernel_timing.HEAD_BUDGET_S, "whole_round": True}
        return self._stored_or_measured([head], [head], "lm_head", kernel_timing.HEAD_ROWS, budget)

    def _stored_or_measured(self, linears, sample, part, rows, budget=None) -> KernelChoice:
        candidates = kernel_timing.candidates_for(self.dtype)
        source = self.loaded.source
        key = kernel_store.host_key(
            self.loaded.name, source, self.dtype, linears, candidates, part, rows
        )
        measure = functools.partial(_measure, sample, candidates, len(linears), rows, budget or {})
        return kernel_store.stored_or_measured(key, measure, self._kernel_setting == "measure")

    @property
    def _head(self):
        return self.model.get_output_embeddings()

    def kernel_summary(self) -> str:
        """One line for the page's model line (on hover)."""
        choice, kernel = self.kernel_choice, self.engine_kernel
        if choice.origin == "none":
            return f"matmul: {kernel_store.ORIGINS['none']}"
        text = f"matmul: {choice.summary()}"
        if kernel.plan != choice.plan:
            text += f"; oneDNN refused the weights, so {kernel.plan.describe()}"
        head = self.head_kernel
        if head is not None:
            text += f"; lm_head: {head}"
        text += f"; +{self.engine_kernel_bytes / 1e6:.0f} MB of weight copies"
        budget = self.__dict__.get("copy_budget")
        return text if budget is None or not budget.dropped else f"{text}; {budget.summary()}"

    @property
    def head_kernel(self) -> str | None:
        """E.g. ``"gemv 1-16 rows (timed apart, ...)"``; None where the head is not routed."""
        kernel, head = self.engine_kernel, self._head
        if head not in self._linears:
            return None
        planned = None if kernel.modules is None else kernel.modules.planned.get(head)
        plan = kernel.plan if planned is None else planned.plan
        text = plan.describe(up_to=kernel_timing.HEAD_ROWS[-1])
        choice = self.head_choice
        if choice is not None and choice is self.kernel_choice and choice.origin == "fallback":
            return f"{text} (not timed apart: the decoder's timing fell back to F.linear)"
        if choice is None or choice is self.kernel_choice:
            return text
        how = kernel_store.ORIGINS[choice.origin]
        timed = "" if choice.timings is None else f", in {choice.timings.measured_s:.1f} s"
        return f"{text} (timed apart, {how}{timed})"

    @contextlib.contextmanager
    def _attention(self, name: str):
        config = self.model.config
        previous = config._attn_implementation
        config._attn_implementation = name
        try:
            yield
        finally:
            config._attn_implementation = previous


def _measure(sample, candidates, total_linears, rows, budget) -> KernelChoice:
    """The fastest per row range, or ``F.linear`` (``"fallback"``) where no pass ran."""
    timings = kernel_timing.time_candidates(
        sample, candidates, tuple(rows), total_linears=total_linears, **budget
    )
    memory_account.release_freed()  # the candidates' copies of the sample, freed
    try:
        plan = kernel_timing.choose_plan(timings.rows, timings.times_ms)
    except ValueError:  # no kernel timed at any row count: a busy host
        return KernelChoice(kernel_plan.RowPlan.single("linear"), "fallback", timings)
    log.info("Matmul measured in %.1f s: %s", timings.measured_s, plan.describe())
    return KernelChoice(plan, "measured", timings)


def read_copies_max() -> float:
    """``CBP_WEIGHT_COPIES_MAX``: the packed copies' bound, a multiple of the weights' bytes.

    Raises:
        ValueError: not a number >= 0, naming the variable.
    """
    return settings.number("CBP_WEIGHT_COPIES_MAX", finite=False)  # inf: every copy kept


def copy_groups(model, linears) -> dict[str, list]:
    """``linears`` grouped by parent module and input width, named by the first one's path."""
    names = {m: n for n, m in model.named_modules()}
    groups: dict[tuple, list] = {}
    for m in linears:
        parent = names[m].rpartition(".")[0]
        groups.setdefault((parent, m.in_features), []).append(m)
    return {names[ms[0]] + (f"+{len(ms) - 1}" if len(ms) > 1 else ""): ms for ms in groups.values()}


def _copy_bytes(linears, kernel: str) -> int:
    if kernel in copy_budget.FREE_KERNELS:
        return 0
    total = 0
    for m in linears:
        n, k = m.weight.shape
        size = 4 if kernel == "onednn_f32" else m.weight.element_size()
        if kernel == "gemv":
            n = -(-n // linear_kernel.GEMV_BLOCK) * linear_kernel.GEMV_BLOCK
        total += n * k * size
    return total
