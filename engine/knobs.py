"""The knobs of a run, each declared once: its name, kind, range, default, help and outside names.
``KNOBS`` is the /run API's order; widgets, /run inputs, presets, links and bench flags are built
from it. Kinds: ``"flag"``, ``"choice"``, ``"whole"`` (``low`` to ``high``), ``"number"`` (>= 0;
with ``zero``, 0 reads as None)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

KV_MODES = ("slots", "paged", "concat")
POLICIES = ("decode_first", "prefill_first", "vllm")  # a new one goes last (/run takes them)
MAX_BLOCK_SIZE = 256  # tokens per KV block; vLLM uses 16 to 128, and huge blocks waste memory
MAX_SLOTS = 16  # the most slots a page run (or a link) may ask for: the slot slider's maximum
X_AXES = ("time", "step")
KINDS = ("flag", "choice", "whole", "number")
WIDGETS = ("checkbox", "number", "slider", "dropdown", "radio")
KIND_WIDGETS = {"flag": "checkbox", "choice": "dropdown", "whole": "number", "number": "number"}
# Where the page shows a knob: above the preset (the model), beside it (the slots and checks), in
# the engine settings, in their precision row, or over the timelines (the x axis).
PLACES = ("model", "setup", "engine", "precision", "results")


@dataclass(frozen=True)
class Knob:
    """One knob. An empty ``url``, ``bench_flag`` or ``config`` means no such outside name;
    ``title`` names it in messages where the label would not."""

    name: str  # the ``RunSettings`` field, and the page's name for its component
    kind: str  # one of KINDS
    default: Any
    label: str = ""
    title: str = ""  # empty: the label
    info: str = ""
    choices: tuple[str, ...] = ()
    labels: tuple[tuple[str, str], ...] = ()
    hovers: tuple[str, ...] = ()
    low: int = 0
    high: int | None = None
    zero: str = ""  # what 0 means ("no limit"); empty: 0 is an ordinary value
    url: str = ""  # the link's query parameter
    bench_flag: str = ""  # the bench's command-line flag
    bench_help: str = ""  # its --help text
    config: str = ""  # the ``EngineConfig`` field it sets
    # The page: its widget (one of WIDGETS; empty: its kind's, ``KIND_WIDGETS``), the name its
    # component's element id starts with (empty: the knob's), where it sits (one of PLACES), the
    # row it shares with its neighbours there (empty: its own), and its place among the settings a
    # preset sets (1 first; the /apply_preset API's order, so a new one takes the next; 0: a preset
    # leaves it as the user set it)
    widget: str = ""
    stem: str = ""
    place: str = "engine"
    row: str = ""
    preset: int = 0

    @property
    def page_widget(self) -> str:
        return self.widget or KIND_WIDGETS[self.kind]

    @property
    def elem_id(self) -> str:
        """Its component's element id, a contract with browser scripts (``token_budget_number``)."""
        return f"{self.stem or self.name}_{self.page_widget}"

    @property
    def named(self) -> str:
        return self.title or self.label

    @property
    def unset(self) -> Any:
        """What a run reads when blank (or bad): None for a ``zero`` number, else the default."""
        return None if self.zero else self.default


PREFIX_CACHING_INFO = (
    "A prompt's full blocks that an earlier request computed are shared, not prefilled again "
    "(vLLM's automatic prefix caching); the block map shows shared blocks and the mask the keys "
    "taken from the cache. Paged KV mode only. The static engine cannot share: its waves "
    "prefill every prompt in full."
)
KV_MODE_INFO = (
    "Paged: blocks from a memory budget, with preemption, as vLLM. In place: each slot's own "
    "rows. Concatenation: the article's, O(n²)."
)
# Each policy's hover text (assets/page.js sets it as the choice's title), in ``labels`` order.
POLICY_HOVERS = (
    "Running sequences' decodes take the token budget first; a prompt's prefill (chunked if need "
    "be) gets what is left.",
    "Prompts' prefills take the token budget first; decodes get what is left.",
    "vLLM V1's own scheduling, step for step: running requests in admission order, then waiting "
    "ones while budget is left; when blocks run out the newest running request is preempted "
    "(engine/serving/scheduler.py).",
)

# In the /run API's order (``engine.page.run.run_options.RUN_INPUTS`` puts Run's other inputs
# between them), which is also the order a link writes them and the bench lists its flags. The
# API's order is a contract: a new knob goes at the end.
KNOBS = (
    Knob(
        "num_slots",
        "whole",
        3,
        label="Slots (B)",
        title="Slots",
        low=1,
        high=MAX_SLOTS,
        url="slots",
        bench_flag="--slots",
        bench_help="B: concurrent sequences (default 3)",
        config="num_slots",
        widget="slider",
        stem="slots",
        place="setup",
    ),
    Knob(
        "chat_template",
        "flag",
        False,
        label="Use chat template",
        url="chat",
        bench_flag="--chat-template",
        bench_help="wrap prompts in the chat template",
        stem="chat",
        place="setup",
    ),
    Knob(
        "check_reference",
        "flag",
        True,
        label="Check outputs against model.generate",
        url="check",
        bench_flag="--no-reference",  # the bench's flag turns the check off
        bench_help="skip the model.generate check",
        stem="reference",
        place="setup",
    ),
    Knob(
        "kv_mode",
        "choice",
        "paged",
        label="Continuous engine's KV cache",
        title="KV mode",
        info=KV_MODE_INFO,
        choices=KV_MODES,
        # short enough to show whole in the settings column (about 24 characters at 1,000 px):
        # each one's meaning is in the info under the dropdown, which wraps
        labels=(
            ("paged (vLLM's blocks)", "paged"),
            ("in place, per slot", "slots"),
            ("concatenation (slow)", "concat"),
        ),
        url="kv",
        config="kv_mode",
        preset=1,
    ),
    Knob(
        "token_budget",
        "whole",
        0,
        label="Token budget per step (0 = no limit)",
        title="Token budget",
        zero="no limit",
        url="budget",
        bench_flag="--token-budget",
        bench_help="continuous engines: max tokens per step (default: none)",
        config="max_num_batched_tokens",
        preset=5,
    ),
    Knob(
        "policy",
        "choice",
        "decode_first",
        label="Who gets the budget first",
        title="Policy",
        choices=POLICIES,
        labels=(
            ("decode first", "decode_first"),
            ("prefill first", "prefill_first"),
            ("vLLM's order", "vllm"),  # last: the /run API's values for the others stay
        ),
        hovers=POLICY_HOVERS,
        url="policy",
        bench_flag="--policy",
        bench_help="continuous engines: decode_first, "
        "prefill_first or vllm (vLLM's own scheduling) (default decode_first)",
        config="scheduling_policy",
        widget="radio",
        preset=6,
    ),
    Knob(
        "compare_hf",
        "flag",
        False,
        label="Also run transformers' built-in continuous batching",
        title="Also run transformers' continuous batching",
        url="hf",
    ),
    Knob(
        "arrival_rate",
        "number",
        0,
        title="Arrival rate (requests/s)",
        label="Arrivals: Poisson rate, requests/s (0 = the table's arrival_s)",
        zero="the table's arrival_s",
        url="rate",
        preset=7,
    ),
    # which clock the page's timelines are drawn against: no engine reads it, but a link carries it
    Knob(
        "x_axis",
        "choice",
        "time",
        label="Timeline x axis",
        title="The x axis",
        choices=X_AXES,
        labels=(("seconds", "time"), ("step index", "step")),
        url="x",
        widget="radio",
        place="results",
    ),
    Knob(
        "kv_budget_mib",
        "number",
        0,
        label="Paged: KV budget, MiB (0 = room for every slot)",
        title="KV budget (MiB)",
        zero="room for every slot",
        url="kv_mib",
        bench_flag="--kv-budget-mib",
        bench_help="continuous_paged: KV memory in MiB (default: room for every slot)",
        config="kv_budget_mib",
        stem="kv_budget",
        row="paged",
        preset=2,
    ),
    Knob(
        "block_size",
        "whole",
        16,
        label=f"Paged: tokens per block (1 to {MAX_BLOCK_SIZE})",
        title="Block size",
        low=1,
        high=MAX_BLOCK_SIZE,
        url="block",
        bench_flag="--block-size",
        bench_help="continuous_paged: tokens per block (default 16)",
        config="block_size",
        row="paged",
        preset=3,
    ),
    Knob(
        "prefix_caching",
        "flag",
        False,
        label="Paged: prefix caching",
        title="Prefix caching",
        info=PREFIX_CACHING_INFO,
        url="prefix_caching",
        bench_flag="--prefix-caching",
        bench_help="continuous_paged: share cached prompt-prefix blocks; hf_continuous: "
        "transformers' block sharing (default off for both)",
        config="prefix_caching",
        preset=4,
    ),
    # None: the loaded model's own precision (the page shows the host's dtype)
    Knob(
        "dtype",
        "choice",
        None,
        label="Precision (dtype)",
        title="Precision",
        url="dtype",
        bench_flag="--dtype",
        bench_help="auto, float32, float16 or bfloat16 (default auto)",
        place="precision",
    ),
    Knob(
        "batch_invariant",
        "flag",
        False,
        label="Batch-invariant mode",
        url="invariant",
        bench_flag="--batch-invariant",
        bench_help="static and continuous engines in batch-invariant "
        "mode, compared bitwise with each request run alone; also times the normal mode for the "
        "cost",
        config="batch_invariant",
        place="precision",
    ),
    # None: the model app.py started with; else one of CBP_MODEL_ALLOWLIST (the bench: --model)
    Knob(
        "model",
        "choice",
        None,
        label="Model",
        info="The host's allowlist: the engine process loads the one chosen, in place of the "
        "one chosen before.",
        url="model",
        place="model",
    ),
)
KNOB = {knob.name: knob for knob in KNOBS}
