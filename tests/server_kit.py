"""Starting ``app.py`` for tests: a free localhost port, offline, and a wait until it serves.

Used by the ``server_url`` fixtures (``tests/conftest.py`` per module, the browser tests' per
package). The launching is ``tools.app_server``'s (the page-gap tool and tests that need
the server's process start theirs with it too); here its failures fail the test, with the
server's log.
"""

from __future__ import annotations

import pytest

from tools import app_server

REPO_ROOT = app_server.REPO_ROOT
SERVERS: dict = {}  # url -> the app.py process serving it, for tests that look at its processes


def start_app_server(request, tmp_path_factory, args: tuple[str, ...] = ()) -> str:
    """``app.py [args]`` on a free localhost port, offline; terminated by ``request``'s finalizer.

    Returns the page's URL once it answers 200.
    """
    log_path = tmp_path_factory.mktemp("server") / "app.log"
    try:
        proc, url = app_server.start_app(log_path, args)
    except RuntimeError as exc:
        pytest.fail(str(exc))
    request.addfinalizer(lambda: app_server.stop(proc))
    SERVERS[url] = proc
    return url
