"""A tab reloaded while its run goes: the run ends, the queue behind it moves on, nothing is kept.

A workshop room reloads its tabs. A reloaded tab is a new session, and nobody sees the run of the
old one any more, so that run must end as it does for a closed tab (within seconds), and it must
never be kept as a finished run that an identical later Run would be shown as a measurement.
"""

from __future__ import annotations

import re
import time

from browser_kit import (
    PYTESTMARK,
    RUN_TIMEOUT_MS,
    RUNNING_STATUS,
    SUCCESS_STATUS,
    Page,
    _status,
    expect,
    open_session,
    set_requests,
    set_slots,
)

pytestmark = PYTESTMARK

# The article's six requests at 2 slots (a setup no other test runs, so never replayed here):
# about a minute of engine work on a 2-core CPU, far longer than any bound below.
PRESET_LINK = "?preset=seed&slots=2"
WAITING = re.compile(r"Waiting for the model: place 2 of 2")
ENDED_S = 30  # the queued run is done this soon after the reload (uncancelled: minutes)


def test_reloading_the_tab_ends_its_run(page: Page, browser, server_url):
    """A run whose tab is reloaded mid-run ends: the run queued behind it is done within 30 s,
    and the same setup pressed again in the reloaded tab runs live (the abandoned run was not
    kept to be shown as a measurement)."""
    first = open_session(browser, server_url + PRESET_LINK)
    first.locator("#run_button").click()
    expect(_status(first)).to_contain_text(RUNNING_STATUS, timeout=60_000)
    _reload_while_queued_behind(page, first, [("Reloading ends", 3), ("the run before", 2)])


def _reload_while_queued_behind(page: Page, first: Page, rows: list[tuple[str, int]]) -> None:
    """``page`` queues ``rows`` behind ``first``'s run; ``first`` reloads; ``page``'s run is done
    within ``ENDED_S``; ``first``'s setup pressed again runs live; then it is stopped."""
    set_requests(page, rows)
    set_slots(page, 2)
    page.locator("#run_button").click()
    expect(page.locator("#run_note_markdown")).to_contain_text(WAITING, timeout=10_000)

    reloaded_s = time.monotonic()
    first.reload()
    expect(_status(page)).to_contain_text(SUCCESS_STATUS, timeout=RUN_TIMEOUT_MS)
    elapsed_s = time.monotonic() - reloaded_s
    print(f"queued run done {elapsed_s:.1f} s after the first tab was reloaded")
    assert elapsed_s < ENDED_S, f"the queued run ended {elapsed_s:.0f} s after the reload"

    first.locator('#requests_table [data-testid="cell-0-0"]').wait_for(timeout=30_000)
    first.locator("#run_button").click()
    expect(_status(first)).to_contain_text(re.compile(r"Running|Shown at once"), timeout=60_000)
    assert not _status(first).inner_text().startswith("Shown at once"), (
        "the reloaded tab's abandoned run was kept and shown as a measurement"
    )
    first.locator("#stop_button").click()
    expect(_status(first)).to_contain_text("Stopped before the end", timeout=10_000)
    first.context.close()
