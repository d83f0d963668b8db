"""A schema of its own per test on the real PostgreSQL server, dropped afterwards."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import pytest

from agentkernel.core.config.stores import PostgresStoreConfig


class Schemas:
    """Unique schemas for one test; :meth:`drop_all` removes them."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.names: list[str] = []

    def config(self, name: str | None = None, **more: object) -> PostgresStoreConfig:
        """A store block on a new schema (or ``name``), provisioned unless said otherwise."""
        if name is None:
            name = f"t_{uuid.uuid4().hex[:12]}"
            self.names.append(name)
        settings: dict[str, object] = {"dsn": self.dsn, "db_schema": name, "auto_provision": True}
        return PostgresStoreConfig.model_validate(settings | more)

    def execute(self, statement: str) -> None:
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(statement)  # type: ignore[call-overload]

    def drop_all(self) -> None:
        for name in self.names:
            self.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


@pytest.fixture
def schemas(postgres_dsn: str) -> Iterator[Schemas]:
    made = Schemas(postgres_dsn)
    yield made
    made.drop_all()


class Proxy:
    """A TCP proxy to the PostgreSQL server of ``dsn`` (a URL) that a test can cut and restore,
    on a fixed port: an outage of the server as its clients see it, without touching the shared
    server."""

    def __init__(self, dsn: str) -> None:
        from urllib.parse import urlsplit

        from tests.servers import free_port

        target = urlsplit(dsn)
        self.target = (target.hostname or "127.0.0.1", target.port or 5432)
        self.port = free_port()
        credentials = target.netloc.rpartition("@")[0]
        address = f"127.0.0.1:{self.port}"
        netloc = f"{credentials}@{address}" if credentials else address
        self.dsn = target._replace(netloc=netloc).geturl()
        self._sockets: list[object] = []
        self._listener: object = None
        self._acceptor: object = None

    def start(self) -> None:
        import socket
        import threading

        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        self._acceptor = threading.Thread(target=self._accept, args=(listener,), daemon=True)
        self._acceptor.start()

    def _accept(self, listener: object) -> None:
        import socket
        import threading

        assert isinstance(listener, socket.socket)
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # stopped
            self._sockets.append(client)
            upstream = socket.create_connection(self.target)
            self._sockets.append(upstream)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source: object, sink: object) -> None:
        import socket

        assert isinstance(source, socket.socket) and isinstance(sink, socket.socket)
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def stop(self) -> None:
        """Refuse new connections and cut every open one."""
        import socket
        import threading

        if isinstance(self._listener, socket.socket):
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept
            self._listener.close()
        if isinstance(self._acceptor, threading.Thread):
            self._acceptor.join(5)
        for sock in self._sockets:
            assert isinstance(sock, socket.socket)
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        self._sockets.clear()
