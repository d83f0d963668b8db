"""Agent for bench_cancel.py: ``hold`` notes when it starts and when it is cancelled (wall clock,
one line each in $CANCEL_LOG), and otherwise works for a minute."""

import asyncio
import os
import time

from agentkernel import Agent, Module


def note(kind: str, request_id: str) -> None:
    with open(os.environ["CANCEL_LOG"], "a") as log:
        log.write(f"{kind} {request_id} {time.time():.6f}\n")


async def hold(turn):
    note("start", turn.request_id)
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        note("cancelled", turn.request_id)
        raise
    return "held"


Module([Agent("hold", hold)])
