"""The data check's decode pass (``--decode``): every image the survey found readable
decoded by DALI's CPU decoder, as training decodes; the failures become findings."""

import time

from paddle_resnet.core.bootstrap import available_cores
from paddle_resnet.data.dali import undecodable


def decode_pass(sources, survey, num_threads):
    """Decode every image the fast pass found readable; returns the pass's figures."""
    threads = num_threads or available_cores()
    decoded = [0]

    def samples():
        for split, source in sources.items():
            for position, image in source.encoded(set(survey.broken[split])):
                decoded[0] += 1
                yield (split, position), image

    start = time.perf_counter()
    for split, position in undecodable(samples(), threads):
        survey.findings["undecodable"].add(sources[split].name(position))
    seconds = time.perf_counter() - start
    return {
        "images": decoded[0],
        "threads": threads,
        "seconds": round(seconds, 3),
        "images_per_second": round(decoded[0] / max(seconds, 1e-9), 1),
    }
