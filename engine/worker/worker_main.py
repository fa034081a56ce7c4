"""The engine process's side of ``worker_process``: load the model, answer jobs on the main thread,
pinned to CPUs of its own; it ends when the page's process dies (the parent sentinel)."""

from __future__ import annotations

import faulthandler
import importlib
import multiprocessing
import os
import queue
import signal
import threading
from multiprocessing.reduction import ForkingPickler

import torch

from engine.serving.run_control import RunControl
from engine.worker import progress
from engine.worker.engine_thread import ENGINE_THREAD
from engine.worker.transport import answer


def worker_main(spec, conn, stop_event, cpus: tuple[int, ...] | None = None) -> None:
    """Keep to ``cpus`` (None: the page's), load ``spec``'s model, then answer jobs until end of
    file or None, with one torch thread per CPU."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the page's to handle: it ends us
    faulthandler.enable()  # a crash in native code says where, in the page's log
    _end_with_page()
    if cpus and pin_process(cpus):  # before any parallel work: its pool has them
        torch.set_num_threads(len(cpus))
    try:
        _serve(spec, conn, stop_event)
    except BaseException as exc:  # said in the page's log: a run only learns that it ended
        print(f"Engine process {os.getpid()} ends: {type(exc).__name__}: {exc}", flush=True)
        raise


def _end_with_page() -> None:
    """Exit at once when the process that started this one dies, even mid-load or mid-step,
    where the pipe would be noticed only at its next use."""
    page = multiprocessing.parent_process()
    if page is None:  # not started by multiprocessing
        return

    def wait() -> None:
        page.join()  # its sentinel: readable once the page's end of it closes, at any death
        print(f"Engine process {os.getpid()} ends: the page's process is gone", flush=True)
        os._exit(0)

    threading.Thread(target=wait, name="cbp-page-watch", daemon=True).start()


def _serve(spec, conn, stop_event) -> None:
    ENGINE_THREAD.adopt()  # loads of other precisions (in_dtype) stay on this thread too
    outbox = _Outbox(conn)
    try:
        model = spec.load(spec)
        for name in spec.preload:
            importlib.import_module(name)
    except BaseException as exc:  # told to the page, which raises it for the run that waits
        outbox.send(("failed", exc.with_traceback(None)))
        outbox.flush()
        return
    outbox.send(("ready", None))
    print(f"Engine process {os.getpid()} ready: {model.label}", flush=True)
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):  # the page is gone
            return
        if message is None:
            return
        job, time_limit_s, time_left_s = message
        control = RunControl(time_limit_s, time_left_s, stop=stop_event)  # the page's Stop too
        outbox.send(answer(model, job, outbox.send, control, progress.SNAPSHOT_INTERVAL_S))


class _Outbox:
    """The worker's messages to the page, pickled by the sender (an unpicklable one goes as a
    RuntimeError naming it) and written in order by their own thread."""

    def __init__(self, conn):
        self._conn = conn
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._idle = threading.Event()
        threading.Thread(target=self._write, name="cbp-outbox", daemon=True).start()

    def send(self, message: tuple) -> None:
        try:
            data = ForkingPickler.dumps(message)
        except Exception as exc:
            what = type(message[1]).__name__
            error = RuntimeError(f"the engine process could not send a {what}: {exc}")
            data = ForkingPickler.dumps(("error", error))
        self._idle.clear()
        self._queue.put(data)

    def flush(self) -> None:
        """Wait until every message sent is written."""
        self._queue.put(None)
        self._idle.wait()

    def _write(self) -> None:
        while True:
            data = self._queue.get()
            if data is None:
                self._idle.set()
                continue
            try:
                self._conn.send_bytes(data)
            except OSError:  # BrokenPipeError, ConnectionResetError: the page is gone
                print(f"Engine process {os.getpid()} ends: the page closed its pipe", flush=True)
                os._exit(0)


def pin_process(cpus: tuple[int, ...]) -> bool:
    """Pin every thread of this process to ``cpus`` (later threads inherit it); False where the
    system has no affinity or refuses it."""
    if not hasattr(os, "sched_setaffinity"):
        return False
    try:
        threads = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        threads = [0]  # the calling thread only
    try:
        for thread in threads:
            try:
                os.sched_setaffinity(thread, cpus)
            except ProcessLookupError:  # a thread that ended meanwhile
                continue
    except OSError:
        return False
    return True
