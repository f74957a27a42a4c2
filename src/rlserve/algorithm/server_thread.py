"""A :class:`PolicyServer` on its own asyncio event loop in a background thread.

``rlserve serve`` runs its server on the main thread (:func:`rlserve.server.app.serve_forever`,
which owns the signals); an Algorithm in a user's script cannot, since the script's thread
calls ``train()``. This runs the same server, start to close, on a daemon thread, and lets the
script's thread call coroutines on its loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from rlserve.server.app import PolicyServer

logger = logging.getLogger("rlserve.server")

START_TIMEOUT = 60.0
"""Seconds :meth:`ServerThread.start` waits for the server to listen."""


class ServerThread:
    """Runs ``server`` (started, endpoints published, closed on :meth:`stop`) in a thread."""

    def __init__(self, server: PolicyServer, name: str = "rlserve-server"):
        self.server = server
        self.name = name
        self.final_checkpoint: Path | None = None
        """The first policy's final checkpoint (``server.close()``'s result), once stopped."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closed = threading.Event()
        self._stop_lock = threading.Lock()

    def start(self) -> None:
        """Listen, serving from a background thread; return once listening.

        Raises:
            Exception: Whatever stopped the server from listening (a port in use, a TLS file).
            RuntimeError: It was started before.
        """
        if self._thread is not None:
            raise RuntimeError("this server thread was started before; build a new one")
        listening: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(
            target=self._run, args=(listening,), name=self.name, daemon=True
        )
        self._thread.start()
        try:
            listening.result(timeout=START_TIMEOUT)
        except BaseException:
            self.stop()
            raise

    def _run(self, listening: concurrent.futures.Future[None]) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve(listening))
        except BaseException as exc:
            if not listening.done():
                listening.set_exception(exc)
            else:
                logger.exception("rlserve: the server thread failed")
        finally:
            with contextlib.suppress(Exception):
                loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
            self._closed.set()

    async def _serve(self, listening: concurrent.futures.Future[None]) -> None:
        server = self.server
        try:
            await server.start()
        except BaseException:
            with contextlib.suppress(Exception):
                await server.close()
            raise
        server.publish_endpoints()
        listening.set_result(None)
        await server.wait_stopped()
        self.final_checkpoint = await server.close()

    @property
    def running(self) -> bool:
        """Whether the server is started and not yet closed."""
        return self._thread is not None and not self._closed.is_set()

    def stop(self) -> None:
        """Close both carriers, save the state and end the thread (idempotent)."""
        with self._stop_lock:
            thread = self._thread
            if thread is None or not thread.is_alive():
                return
            loop = self._loop
            if loop is not None:
                with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                    loop.call_soon_threadsafe(self.server.request_stop)
            thread.join()

    def call(self, make: Callable[[], Coroutine[Any, Any, Any]], timeout: float) -> Any:
        """Run the coroutine ``make()`` on the server's loop and return its result.

        Raises:
            RuntimeError: The server is not running.
            TimeoutError: It took longer than ``timeout`` seconds.
        """
        loop = self._loop
        if loop is None or self._closed.is_set() or self._thread is None:
            raise RuntimeError("the server is not running; call start() first")
        return asyncio.run_coroutine_threadsafe(make(), loop).result(timeout)

    def call_soon(self, callback: Callable[[], Any]) -> None:
        """Schedule a plain ``callback`` on the server's loop (not waiting for it).

        Raises:
            RuntimeError: The server is not running.
        """
        loop = self._loop
        if loop is None or self._closed.is_set():
            raise RuntimeError("the server is not running; call start() first")
        loop.call_soon_threadsafe(callback)
