"""Lambda benchmarks: cold start of each handler, and one batch of slow turns.

1. Cold start: a fresh interpreter imports a handler and serves its first invocation (a
   ``GET /health`` for the request handler, an empty SQS batch for the queue functions, the
   import alone for the connection handler), against ``python -c 'import boto3'`` in the same
   run. Target: at most 300 ms more than boto3 alone.
2. The agent runner function runs one batch of 10 turns of an agent that awaits 1 s, across 10
   sessions, against moto's SQS and DynamoDB (target: about 1 s).

Usage: python benchmarks/bench_lambda.py [--repeat 5]   (starts moto itself; needs moto[server])
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

COLD = {
    "boto3 alone": "import boto3",
    "request handler": (
        "from agentkernel.aws import Lambda\n"
        "Lambda.handler({'version': '2.0', 'rawPath': '/health',"
        " 'requestContext': {'http': {'method': 'GET'}}}, None)"
    ),
    "agent runner": (
        "from agentkernel.aws import ServerlessAgentRunner\n"
        "ServerlessAgentRunner.handle({'Records': []}, None)"
    ),
    "response handler": (
        "from agentkernel.aws import ResponseHandler\nResponseHandler.handle({'Records': []}, None)"
    ),
    "connection handler": "from agentkernel.aws import WebsocketConnectionHandler",
}


def cold_ms(code: str, env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd="/tmp")
    return (time.perf_counter() - started) * 1000


def cold_starts(repeat: int, env: dict[str, str]) -> None:
    times: dict[str, list[float]] = {name: [] for name in COLD}
    for _ in range(repeat):  # interleaved, so machine noise hits every entry alike
        for name, code in COLD.items():
            times[name].append(cold_ms(code, env))
    base = statistics.median(times["boto3 alone"])
    for name, samples in times.items():
        median = statistics.median(samples)
        print(f"{name:<20} {median:7.0f} ms   (+{median - base:5.0f} ms over boto3)")


def batch(env: dict[str, str]) -> None:
    os.environ.update(env)
    import asyncio

    import boto3
    from tests.aws.lambda_harness import sqs_event
    from tests.stores.test_response_stores import create_table
    from tests.transports.test_sqs import create_fifo

    from agentkernel import Agent, Module
    from agentkernel.aws import ServerlessAgentRunner

    async def second(turn):  # type: ignore[no-untyped-def]
        await asyncio.sleep(1.0)
        return "done"

    Module([Agent("second", second)])
    tag = uuid.uuid4().hex[:8]
    inp, out = create_fifo(f"bin-{tag}", visibility=30), create_fifo(f"bout-{tag}")
    create_table(f"bresp-{tag}", "request_id")
    os.environ |= {
        "AK_EXECUTION__QUEUES__INPUT__URL": inp,
        "AK_EXECUTION__QUEUES__OUTPUT__URL": out,
        "AK_EXECUTION__RESPONSE_STORE__DYNAMODB__TABLE_NAME": f"bresp-{tag}",
    }
    sqs = boto3.client("sqs")
    for i in range(10):
        body = {"session_id": f"s{i}", "prompt": "x", "agent": "second"}
        sqs.send_message(
            QueueUrl=inp,
            MessageBody=json.dumps(body),
            MessageGroupId=f"s{i}",
            MessageDeduplicationId=f"d{i}",
            MessageAttributes={"request_id": {"DataType": "String", "StringValue": f"r{i}"}},
        )
    event = sqs_event(inp)
    ServerlessAgentRunner.instance()  # built outside the timing, as in a warm container
    started = time.perf_counter()
    result = ServerlessAgentRunner.handle(event)
    elapsed = time.perf_counter() - started
    assert result == {"batchItemFailures": []}, result
    print(f"batch of {len(event['Records'])} one-second turns over 10 sessions: {elapsed:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    from tests import servers

    moto = servers.Moto()
    try:
        env = os.environ | servers.aws_env(moto.url) | {"PYTHONPATH": str(ROOT / "src")}
        env |= {
            "AK_EXECUTION__QUEUES__INPUT__URL": f"{moto.url}/123456789012/none.fifo",
            "AK_EXECUTION__QUEUES__OUTPUT__URL": f"{moto.url}/123456789012/none.fifo",
        }
        cold_starts(args.repeat, env)
        batch(servers.aws_env(moto.url))
    finally:
        moto.stop()


if __name__ == "__main__":
    main()
