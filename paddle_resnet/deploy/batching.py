"""Requests that arrive together run as one batch (KServe's Python ModelServer has no
dynamic batching: its batcher is an InferenceService's sidecar, for the v1 protocol).

Under load, the first request of a batch waits at most ``max_wait`` for others while fewer
than ``max_batch`` images are queued: load is a request on its way to the queue (being
decoded: ``arriving``) or a last batch of several requests. A request alone runs at once:
with a model of a few milliseconds the wait was the largest part of a lone request's
latency (docs/measurements.md). Then the queued requests, whole and in order, run as one
batch on the engine: one thread, one batch at a time (a classifier is not thread-safe, and
it uses every core itself). While a batch runs, the next one gathers. A batch runs as a few
calls of fixed sizes (``batch_sizes``): OpenVINO then compiles a static-shape model for
those few sizes only, all during the warm-up."""

import asyncio
import collections
import concurrent.futures
import contextlib

import numpy as np


def batch_sizes(max_batch):
    """The sizes the engine is called with: the powers of two below ``max_batch``, and it."""
    return [1 << i for i in range(max_batch.bit_length()) if 1 << i < max_batch] + [max_batch]


def split(count, sizes):
    """``count`` images as calls of ``sizes``, largest first (``sizes`` holds 1)."""
    calls = []
    for size in sorted(sizes, reverse=True):
        while count >= size:
            calls.append(size)
            count -= size
    return calls


class Batcher:
    """``await batcher(images)``: (their probabilities, how many images their batch held)."""

    def __init__(self, classify, max_batch, max_wait_seconds):
        self.classify = classify
        self.max_batch = max_batch
        self.max_wait = max_wait_seconds
        self.sizes = batch_sizes(max_batch)
        self.engine = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="engine")
        self.queued = collections.deque()  # (images, future, arrival time)
        self.arrived = None  # an asyncio.Event of the serving loop, made with the worker
        self.worker = None
        self.batches = collections.Counter()  # images per batch run -> how often
        self.on_their_way = 0  # requests inside ``arriving``
        self.last_requests = 0  # how many requests the last batch held

    def run(self, images):
        """``images`` through the classifier in calls of ``sizes``; on the engine's thread."""
        bounds = np.cumsum(split(len(images), self.sizes))[:-1]
        return np.concatenate([self.classify(part) for part in np.split(images, bounds)])

    def warm_up(self, input_shape):
        """Run each size once (OpenVINO compiles its model then), before the server is ready."""
        for size in self.sizes:
            self.engine.submit(self.run, np.zeros([size, *input_shape], np.float32)).result()

    @contextlib.contextmanager
    def arriving(self):
        """Around a request's preparation (its decoding) before it is queued: the batch
        gathering meanwhile waits for it."""
        self.on_their_way += 1
        try:
            yield
        finally:
            self.on_their_way -= 1
            if self.arrived:
                self.arrived.set()

    async def __call__(self, images):
        loop = asyncio.get_running_loop()
        if self.worker is None:
            self.arrived = asyncio.Event()
            self.worker = loop.create_task(self._work())
        future = loop.create_future()
        self.queued.append((images, future, loop.time()))
        self.arrived.set()
        return await future

    def _loaded(self):
        return self.on_their_way or self.last_requests > 1

    async def _gather(self):
        """Wait for the first request, then under load up to ``max_wait`` after its arrival
        for others."""
        while not self.queued:
            self.arrived.clear()
            await self.arrived.wait()
        deadline = self.queued[0][2] + self.max_wait
        loop = asyncio.get_running_loop()
        while (
            self._loaded()
            and sum(len(q[0]) for q in self.queued) < self.max_batch
            and loop.time() < deadline
        ):
            self.arrived.clear()
            try:
                await asyncio.wait_for(self.arrived.wait(), deadline - loop.time())
            except TimeoutError:
                break

    def _take(self):
        """The queued requests, whole and in order, that fit in one batch."""
        taken, count = [], 0
        while self.queued and count + len(self.queued[0][0]) <= self.max_batch:
            taken.append(self.queued.popleft())
            count += len(taken[-1][0])
        return taken

    async def _work(self):
        loop = asyncio.get_running_loop()
        while True:
            await self._gather()
            taken = self._take()
            self.last_requests = len(taken)
            try:
                images = np.concatenate([images for images, _, _ in taken])
                self.batches[len(images)] += 1
                probabilities = await loop.run_in_executor(self.engine, self.run, images)
            except Exception as err:  # the requests of this batch fail; the server goes on
                for _, future, _ in taken:
                    if not future.done():
                        future.set_exception(err)
                continue
            bounds = np.cumsum([len(request_images) for request_images, _, _ in taken])[:-1]
            for answer, (_, future, _) in zip(np.split(probabilities, bounds), taken):
                if not future.done():  # a client that went away cancelled its future
                    future.set_result((answer, len(images)))
