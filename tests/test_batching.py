"""The server's batching queue (deploy/batching.py) on a real event loop and engine thread:
a request alone is not held for the wait, a request waits for the ones being decoded, and
under load the wait fills batches. Each moment is made by the test (a request held inside
``arriving``), and the waits are a minute long, so nothing here depends on the machine's
speed: the old queue held a lone request for the whole minute."""

import asyncio

import numpy as np

from conftest import once
from paddle_resnet.deploy.batching import Batcher

MINUTE = 60.0
# far below the wait, far above a batch of this classifier on any machine
PROMPTLY = MINUTE / 2


def classify(images):
    """Each image's probabilities: its own first pixel, spread over two classes."""
    first = images.reshape(len(images), -1)[:, :1]
    return np.concatenate([first, 1 - first], axis=1)


def image(value):
    return np.full([1, 3, 2, 2], value, np.float32)


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, PROMPTLY))


@once
def test_a_request_alone_runs_at_once():
    batcher = Batcher(classify, max_batch=8, max_wait_seconds=MINUTE)

    async def alone_twice():
        return [await batcher(image(0.25)), await batcher(image(0.5))]

    (first, one), (second, again) = run(alone_twice())
    np.testing.assert_array_equal(first, [[0.25, 0.75]])
    np.testing.assert_array_equal(second, [[0.5, 0.5]])
    assert one == again == 1


@once
def test_a_request_waits_for_the_one_being_decoded_then_both_run_together():
    batcher = Batcher(classify, max_batch=8, max_wait_seconds=MINUTE)

    async def one_queued_one_arriving():
        with batcher.arriving():  # a second request, still being decoded
            first = asyncio.ensure_future(batcher(image(0.25)))
            await asyncio.sleep(0.5)
            assert not first.done() and sum(batcher.batches.values()) == 0
        second = await batcher(image(0.5))
        return await first, second

    (first, size), (second, same) = run(one_queued_one_arriving())
    assert size == same == 2 and batcher.batches == {2: 1}
    np.testing.assert_array_equal(np.concatenate([first, second]), [[0.25, 0.75], [0.5, 0.5]])


@once
def test_after_a_batch_of_several_the_next_request_waits_for_company():
    """Load: the last batch held several requests, so the next first request waits (here
    until a batch is full, long before its minute)."""
    batcher = Batcher(classify, max_batch=2, max_wait_seconds=MINUTE)

    async def under_load():
        await asyncio.gather(batcher(image(0.1)), batcher(image(0.2)))  # queued together
        waiting = asyncio.ensure_future(batcher(image(0.3)))
        await asyncio.sleep(0.5)
        assert not waiting.done()
        company = await batcher(image(0.4))
        return await waiting, company

    (_, size), (_, same) = run(under_load())
    assert size == same == 2 and batcher.batches == {2: 2}
