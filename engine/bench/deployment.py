"""The bench beside a recorded deployment: our continuous engine on the deployment's own settings.

The first ``--endpoint-record`` endpoint's ``start`` line rebuilds the engine its schedule is
compared with; an unreadable record leaves ours on the flags' settings (docs/bench.md).
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass

from engine.bench.args import endpoints
from engine.bench.servers import matched_engine
from engine.peers.schedule_comparison import DeploymentSettings, followed_config
from engine.peers.vllm_record import RecordError, RecordFeed
from engine.worker.engines import make_engine


@dataclass(frozen=True)
class Followed:
    engine: str  # our engine's name, e.g. "continuous_paged"
    endpoint: str  # the endpoint whose record's start line gave the settings
    settings: DeploymentSettings
    unmatched: list[str]  # one line per setting ours could not follow

    def to_dict(self) -> dict:
        return {"from": self.endpoint, **dataclasses.asdict(self.settings)}


def follow_deployment(args, ours: dict) -> Followed | None:
    """Rebuild ``matched_engine(ours)`` in place on the first recorded endpoint's settings; None
    when there is none or its start line cannot be read (stderr says why)."""
    recorded = [e for e in endpoints(args) if e.record_url]
    name = matched_engine(ours)
    if not recorded or name is None:
        return None
    endpoint = recorded[0]
    try:
        feed = RecordFeed(endpoint.record_url)
        feed.mark()
        settings = DeploymentSettings.from_start(feed.start or {})
    except (RecordError, ValueError) as exc:
        kept = f"{name} keeps the flags' settings"
        print(f"warning: {endpoint.name}: {exc} ({kept})", file=sys.stderr)
        return None
    engine = ours[name]
    config, unmatched = followed_config(settings, engine.config, engine.runner.kv_bytes_per_token())
    dtype = str(engine.runner.dtype).removeprefix("torch.")
    if settings.dtype and settings.dtype != dtype:
        unmatched.append(
            f"dtype: the deployment runs in {settings.dtype}, ours in {dtype} (--dtype): its "
            f"outputs are checked against the {dtype} reference, so differences are expected"
        )
    ours[name] = make_engine("continuous", engine.runner, config)  # the config's own KV mode
    ours[name].name = name
    print(
        f"  {name}: {endpoint.name}'s settings, from its record's start line: "
        f"{settings.describe()}",
        file=sys.stderr,
    )
    for line in unmatched:
        print(f"warning: {name}'s settings differ from {endpoint.name}'s: {line}", file=sys.stderr)
    return Followed(name, endpoint.name, settings, unmatched)
