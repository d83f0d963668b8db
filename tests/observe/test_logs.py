"""The log output: JSON lines with the turn's ids, escaping, and who configures handlers."""

from __future__ import annotations

import contextvars
import io
import json
import logging
import sys
from collections.abc import Iterator

import pytest

from agentkernel.core import logs
from agentkernel.core.config.logs import LoggingConfig


@pytest.fixture
def root() -> Iterator[logging.Logger]:
    """The root logger, given back as it was (handlers, level) after the test."""
    logger = logging.getLogger()
    handlers, level = list(logger.handlers), logger.level
    ak_level = logging.getLogger("agentkernel").level
    yield logger
    logger.handlers[:] = handlers
    logger.setLevel(level)
    logging.getLogger("agentkernel").setLevel(ak_level)


def record(message: str, *args: object, **extra: object) -> logging.LogRecord:
    made = logging.LogRecord("agentkernel.test", logging.INFO, __file__, 1, message, args, None)
    made.__dict__.update(extra)
    return made


def test_a_json_line_has_the_fields_and_the_turns_ids() -> None:
    line = logs.JsonFormatter().format(
        record("turn %s done", "r1", request_id="r1", session_id="s1", trace_id="ab" * 16)
    )
    doc = json.loads(line)
    assert doc["message"] == "turn r1 done"
    assert (doc["level"], doc["logger"]) == ("INFO", "agentkernel.test")
    assert doc["time"].endswith("Z") and "T" in doc["time"]
    assert (doc["request_id"], doc["session_id"], doc["trace_id"]) == ("r1", "s1", "ab" * 16)


def test_unknown_ids_are_left_out_rather_than_empty() -> None:
    doc = json.loads(logs.JsonFormatter().format(record("started")))
    assert not {"request_id", "session_id", "trace_id"} & doc.keys()


def test_client_text_cannot_split_a_json_line() -> None:
    hostile = 's\n{"level": "ERROR"}\u2028\x1b[31m\ud800'
    line = logs.JsonFormatter().format(record("session %s", hostile, session_id=hostile))
    assert "\n" not in line and "\u2028" not in line and "\x1b" not in line
    assert line.isascii()
    doc = json.loads(line)
    assert doc["session_id"] == 's\\n{"level": "ERROR"}\\u2028\\x1b[31m\\ud800'


def test_an_exception_is_one_field_of_the_line() -> None:
    try:
        raise ValueError("bad")
    except ValueError:
        made = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", None, sys.exc_info())
    line = logs.JsonFormatter().format(made)
    assert line.count("\n") == 0
    assert "ValueError: bad" in json.loads(line)["exception"]


def test_bound_fields_reach_records_of_this_context_only(root: logging.Logger) -> None:
    stream = io.StringIO()
    logs.configure(LoggingConfig(format="json"))
    handler = root.handlers[-1]
    handler.setStream(stream)  # type: ignore[attr-defined]
    log = logging.getLogger("agentkernel.test")
    with logs.bind(request_id="r1", session_id="s1", trace_id=None):
        log.info("inside")
        assert logs.current() == {"request_id": "r1", "session_id": "s1"}
    log.info("outside")
    inside, outside = (json.loads(line) for line in stream.getvalue().splitlines())
    assert (inside["request_id"], inside["session_id"]) == ("r1", "s1")
    assert "trace_id" not in inside and "request_id" not in outside


def test_the_text_format_escapes_client_text(root: logging.Logger) -> None:
    stream = io.StringIO()
    logs.configure(LoggingConfig())
    root.handlers[-1].setStream(stream)  # type: ignore[attr-defined]
    logging.getLogger("agentkernel.test").warning("session %s", "a\nERROR forged")
    assert stream.getvalue().count("\n") == 1
    assert " WARNING " in stream.getvalue() and "a\\nERROR forged" in stream.getvalue()


def test_configuring_again_replaces_only_its_own_handler(root: logging.Logger) -> None:
    mine = logging.NullHandler()
    root.addHandler(mine)
    logs.configure()
    logs.configure(LoggingConfig(format="json"), level="debug")
    ours = [h for h in root.handlers if isinstance(h.formatter, logs.JsonFormatter)]
    assert len(ours) == 1 and mine in root.handlers
    assert logging.getLogger("agentkernel").level == logging.DEBUG


def test_an_application_that_set_up_logging_keeps_its_handlers(root: logging.Logger) -> None:
    root.handlers[:] = [logging.NullHandler()]
    assert logs.configure_unless_configured(LoggingConfig(format="json")) is False
    assert len(root.handlers) == 1
    root.handlers[:] = []
    assert logs.configure_unless_configured(LoggingConfig(format="json")) is True
    assert isinstance(root.handlers[0].formatter, logs.JsonFormatter)


def test_an_unknown_level_is_refused(root: logging.Logger) -> None:
    with pytest.raises(ValueError, match="unknown log level"):
        logs.configure(level="LOUD")


@pytest.mark.parametrize(
    ("header", "trace_id"),
    [
        (
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "4bf92f3577b34da6a3ce929d0e0e4736",
        ),
        ("", None),
        (None, None),
        ("garbage", None),
        ("00-short-00f067aa0ba902b7-01", None),
    ],
)
def test_the_trace_id_is_read_from_a_traceparent(header: str | None, trace_id: str | None) -> None:
    assert logs.trace_id_of(header) == trace_id


def test_a_turn_coroutine_closed_in_another_context_does_not_raise() -> None:
    """A handling coroutine collected after its loop stopped is closed wherever the collector
    runs; its bound fields must not turn that into an exception."""

    class Pending:
        def __await__(self):  # type: ignore[no-untyped-def]
            yield  # suspends the coroutine until it is closed

    async def handling() -> None:
        with logs.bind(request_id="r1"):
            await Pending()

    coroutine = handling()
    contextvars.copy_context().run(coroutine.send, None)  # started in a task's context
    coroutine.close()  # closed in this one
    assert logs.current() == {}
