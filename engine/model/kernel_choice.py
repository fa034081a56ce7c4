"""The model runner's kernels: the engines' matmul, the fused decoder layers, batch-invariant mode.

``RunnerKernels`` is the half of ``engine.model.model_runner.ModelRunner`` that picks what the
model's arithmetic runs through: the engines' matmul plan (``kernel_choice``), the fused decoder
layers on that plan, and batch-invariant mode's kernels, each made on first
use, since packed and stacked copies of the weights cost memory. Calling the model stays the
runner's.

The plan follows the host's ``CBP_ENGINE_KERNEL``: ``auto`` reads the choice kept for this host
(``engine.model.kernel_store``) or times the candidates (``engine.kernels.kernel_timing``) and
keeps them; ``measure`` times them again; a kernel's name forces that kernel. A model with no
``source`` (built in memory, as the tests' tiny model) is not timed, so such tests stay quick and
deterministic.

A base class, not an object the runner holds, so that every name stays on the runner as the
engines, the bench and the tests use it. The subclass sets ``model``, ``device`` and ``dtype``,
then calls ``init_kernels``.
"""

from __future__ import annotations

import contextlib
import functools
import logging

from engine import settings
from engine.kernels import fused_layers, invariant_ops, kernel_plan, kernel_timing, linear_kernel
from engine.kernels.host_setting import read_choice
from engine.model import copy_budget, kernel_store, memory_account
from engine.model.kernel_store import KernelChoice

log = logging.getLogger(__name__)


class RunnerKernels:
    """The kernel half of ``engine.model.model_runner.ModelRunner``; see the module docstring."""

    def init_kernels(self) -> None:
        """Find the model's linears and read the host's kernel settings (nothing is made yet).

        Raises:
            ValueError: ``CBP_ENGINE_KERNEL`` or ``CBP_FUSED_LAYERS`` is not one of its choices.
        """
        # The engines' matmul kernel pays off on CPU only; CUDA and MPS keep their own matmuls.
        cpu = self.device.type == "cpu"
        self._linears = linear_kernel.linear_modules(self.model) if cpu else []
        self._kernel_setting = read_choice("CBP_ENGINE_KERNEL", kernel_plan.KERNEL_CHOICES)
        self.copies_max = read_copies_max()
        fused_setting = read_choice("CBP_FUSED_LAYERS", fused_layers.CHOICES)
        self.use_fused_layers = fused_setting == "auto"  # forward_packed's fused layers
        self.decoder_layer_steps = {"fused": 0, "transformers": 0}  # forward_packed calls by path
        retired = settings.value("CBP_COMPILED_STEP").strip().lower()
        if retired not in ("", "off"):  # a host's old setting: said, not refused
            log.warning("CBP_COMPILED_STEP=%s is ignored: the compiled step is gone", retired)

    def engine_kernels(self, batch_invariant: bool = False, head_only: bool = False):
        """Context: the engines' matmul kernel for the model's linears (both engines run inside
        it; the reference runs plain ``model.generate``). ``head_only``: for the output
        embedding alone, on a step whose layers run outside the model's modules (the fused
        layers). ``batch_invariant``: batch-invariant mode's kernels and attention instead
        (``engine.kernels.invariant_ops``), on every device.

        Raises:
            ValueError: batch-invariant mode for a model it does not support.
        """
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
        """The batch-invariant mode's kernels for this model (made on first use).

        Raises:
            ValueError: the model is not a Llama-style decoder (``engine.kernels.invariant_ops``).
        """
        # every call has tile rows
        at_tile = self.engine_kernel.plan.name_at(invariant_ops.TILE_ROWS)
        tile = invariant_ops.tile_rows_for(self.device.type, self.dtype, at_tile)
        return invariant_ops.InvariantKernels(self.model, self.engine_kernel.forward, tile)

    def require_batch_invariant(self) -> None:
        """Refuse now a model batch-invariant mode does not support; its kernels are made on
        first use (``invariant_kernels``), so a check before a run packs no weight copies.

        Raises:
            ValueError: the model is not a Llama-style decoder (``invariant_ops.check_supported``).
        """
        invariant_ops.check_supported(self.model)

    @property
    def engine_kernel_name(self) -> str:
        """The engines' matmul kernels here, in row order: ``"onednn"``, ``"linear+onednn"``,
        ..., or ``"none"`` (GPU)."""
        return self.engine_kernel.name

    @functools.cached_property
    def engine_kernel(self) -> kernel_plan.Kernel:
        """The engines' matmul kernel for ``kernel_choice``'s plan, made on first use (oneDNN's
        packed copies double the weights' memory)."""
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
        """The linears whose copies the budget keeps or drops together (``copy_groups``)."""
        return copy_groups(self.model, self._linears)

    @functools.cached_property
    def copy_budget(self) -> copy_budget.CopyBudget | None:
        """The packed copies a measured plan keeps within ``CBP_WEIGHT_COPIES_MAX`` times the
        weights' bytes (``engine.model.copy_budget``), per group of ``_groups``, the LM head's
        priced by its own timing at its own row counts; None for a plan without timings
        (nothing to rank copies by: every copy is kept)."""
        choice, groups = self.kernel_choice, self._groups
        if choice.timings is None:
            return None
        decoder = copy_budget.Pricing.of(choice.plan, choice.timings)
        pricing = {
            g: self._head_pricing(decoder) if self._head in ms else decoder
            for g, ms in groups.items()
        }
        bound = int(self.copies_max * memory_account.weights_bytes(self.model))
        weights = {g: sum(_nbytes(m.weight) for m in ms) for g, ms in groups.items()}
        copies = {
            g: {k: _copy_bytes(ms, k) for k in pricing[g].plan.kernels} for g, ms in groups.items()
        }
        return copy_budget.keep_copies(weights, copies, pricing, bound)

    def _head_pricing(self, decoder: copy_budget.Pricing) -> copy_budget.Pricing:
        """The LM head's pricing: its own timing (``head_choice``); plain ``F.linear``, no
        copies, where that timed nothing."""
        head = self.head_choice
        if head is None or head is self.kernel_choice:
            return decoder
        if head.origin == "fallback":
            return copy_budget.Pricing(head.plan, (), {}, 1)
        return copy_budget.Pricing.of(head.plan, head.timings)

    @property
    def engine_kernel_bytes(self) -> int:
        """Memory the engines' kernels add (oneDNN's packed weight copies, and the fused
        decoder's stacked copies once the continuous engine has made them), in bytes, each copy
        once (``memory_account``)."""
        self.engine_kernel  # noqa: B018  (made here, as before the account)
        return memory_account.memory_account(self)["packed_total_bytes"]

    def release_copies(self) -> int:
        """Drop the kernels made so far (their packed and stacked weight copies, the
        batch-invariant kernels), to be made again on next use from the kept choice; the
        caller frees them (``memory_account.release_freed``). Returns the copies' bytes."""
        nbytes = memory_account.memory_account(self)["packed_total_bytes"]
        for name in ("engine_kernel", "fused_decoder", "invariant_kernels", "copy_budget"):
            self.__dict__.pop(name, None)
        return nbytes

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
        use; None where they do not apply, ``layers_path`` saying why."""
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
        """Which decoder layers the continuous engines run, for the bench JSON and the page:
        ``"fused"``, or ``"transformers: <why>"`` (the host's switch, the device, or what
        ``engine.kernels.layer_spec`` cannot read in this model); read from the settings and
        the model, or from the fused layers once made (nothing is built here)."""
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
        """Where the fused layers ran a decode step's layers: ``"C++"`` (one call) or
        ``"Python: <why>"`` (``FusedDecoder.layers_step``); None where they were not made
        (nothing is built here)."""
        fused = self.__dict__.get("fused_decoder")
        return None if fused is None else fused.layers_step

    def step_summary(self) -> str:
        """One line for people: the continuous engines' step runs eager, through which decoder
        layers, and why (``layers_path``)."""
        path = self.layers_path
        why = path.removeprefix("transformers: ")
        layers = "the fused layers" if path == "fused" else f"the model's own layers ({why})"
        return f"step: eager, {layers}"

    @functools.cached_property
    def kernel_choice(self) -> KernelChoice:
        """The engines' matmul plan for the decoder's linears and how it was chosen (see the
        module docstring), made on first use: the first start on a host times the kernels (at
        most 5 s). The LM head's is ``head_choice``."""
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
        """The LM head's own plan, timed alone at the row counts it meets
        (``kernel_timing.HEAD_ROWS``: one row per sequence) and kept as the decoder's is; the
        decoder's choice where that is not measured (forced, built in memory) or fell back to
        ``F.linear`` (every linear, the head too, then runs it: timing the head would add seconds
        to the start for nothing); None where the head is not among the engines' linears. Plain
        ``F.linear`` (origin ``"fallback"``) where its own budget timed nothing."""
        head, choice = self._head, self.kernel_choice
        if head not in self._linears:
            return None
        untimed = getattr(self.loaded, "source", None) is None
        if untimed or choice.origin in ("none", "forced", "default", "fallback"):
            return choice
        budget = {"budget_s": kernel_timing.HEAD_BUDGET_S, "whole_round": True}
        return self._stored_or_measured([head], [head], "lm_head", kernel_timing.HEAD_ROWS, budget)

    def _stored_or_measured(self, linears, sample, part, rows, budget=None) -> KernelChoice:
        """``part``'s choice kept for this host, else timed on ``sample`` at ``rows``
        (``budget``: ``time_candidates``'s ``budget_s`` and ``whole_round``, where given)."""
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
        """One line for people (the page's model line shows it on hover): which matmul kernel
        runs at which row counts, how it was chosen, the LM head's, and the memory the copies
        add."""
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
        """The kernels the LM head runs at the row counts it meets, e.g. ``"gemv 1-16 rows"``,
        and how they were chosen where the head was timed apart; None where the head is not
        among the engines' linears."""
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
    """Time ``candidates`` on ``sample`` at ``rows`` (``budget``: ``time_candidates``'s
    ``budget_s`` and ``whole_round``, where given); the fastest per row range, or ``F.linear``
    everywhere (origin ``"fallback"``) where the budget ran out before any pass."""
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
    return settings.number("CBP_WEIGHT_COPIES_MAX")


def copy_groups(model, linears) -> dict[str, list]:
    """``linears`` grouped by parent module and input width, named by the first one's path:
    the fused layers stack q, k, v (and gate, up) into one matmul, which must share one plan."""
    names = {m: n for n, m in model.named_modules()}
    groups: dict[tuple, list] = {}
    for m in linears:
        parent = names[m].rpartition(".")[0]
        groups.setdefault((parent, m.in_features), []).append(m)
    return {names[ms[0]] + (f"+{len(ms) - 1}" if len(ms) > 1 else ""): ms for ms in groups.values()}


def _nbytes(tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _copy_bytes(linears, kernel: str) -> int:
    """The bytes ``kernel``'s copies of ``linears`` take (0: a kernel without copies): the
    weights' own size, in float32 for ``onednn_f32``, the gemv layout's N rounded up to 16."""
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
