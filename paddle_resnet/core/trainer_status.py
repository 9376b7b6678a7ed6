"""Training progress posted to Kubeflow Trainer's status endpoint (Trainer 2.2 and later,
with the controller's ``TrainJobStatus`` feature gate), so that ``kubectl get trainjob NAME
-o jsonpath='{.status.trainerStatus}'`` shows the run's percentage, ETA and metrics.

As Trainer's docs ("TrainJob Progress and Training Metrics", the raw HTTP option) say,
the controller injects into every container of the TrainJob the endpoint
(``.../apis/trainer.kubeflow.org/v1alpha1/namespaces/<ns>/trainjobs/<name>/status``), its
TLS CA certificate and a projected service-account token that rotates (read again for
every request); a client POSTs ``{"trainerStatus": ...}`` with ``Authorization: Bearer
<token>`` at most once every 5 seconds (the controller rate-limits per service account).
One rank posts (rank 0): the statuses of several would overwrite each other.

Nothing here raises: a failed post returns False and is reported once in one line
through ``report``; the next attempt waits ``FAILURE_BACKOFF_SECONDS``, so that a server
that times out costs a step at most once a minute. Standard library only.
"""

import contextlib
import json
import os
import ssl
import time
import urllib.error
import urllib.request

SERVER_URL_VARIABLE = "KUBEFLOW_TRAINER_SERVER_URL"
CA_CERT_VARIABLE = "KUBEFLOW_TRAINER_SERVER_CA_CERT"
TOKEN_VARIABLE = "KUBEFLOW_TRAINER_SERVER_TOKEN"
# Trainer's docs and SDK: at most one update every 5 s
MIN_INTERVAL_SECONDS = 5.0
# a post happens between two training steps: a slow server must not stall the step long
TIMEOUT_SECONDS = 2.0
FAILURE_BACKOFF_SECONDS = 60.0


class TrainerStatus:
    """Posts ``post(step, total_steps, epoch, metrics)`` to ``url`` as Trainer reads it."""

    def __init__(self, url, token_path, ca_cert_path=None, report=print, clock=time.monotonic):
        self.url = url
        self.token_path = token_path
        self.ca_cert_path = ca_cert_path
        self.report = report  # called with one line on the first failure of a series
        self.clock = clock  # monotonic seconds: the rate limit and the ETA
        self.next_attempt = None  # the clock's time before which no post is attempted
        self.failure = None  # the last failure's line, while failing
        self.first_seen = None  # (clock, step) of the first post: the ETA's pace

    @classmethod
    def from_environment(cls, environ=None, **options):
        """The poster for Trainer's injected variables; None outside such a TrainJob."""
        environ = os.environ if environ is None else environ
        url = environ.get(SERVER_URL_VARIABLE)
        if not url:
            return None
        return cls(url, environ.get(TOKEN_VARIABLE), environ.get(CA_CERT_VARIABLE), **options)

    def post(self, step, total_steps, epoch=None, metrics=None):
        """Posts the progress of global ``step`` of ``total_steps`` unless the rate limit or a
        failure's backoff says wait; True if the server took it. Never raises."""
        try:
            now = self.clock()
            if self.next_attempt is not None and now < self.next_attempt:
                return False
            self.next_attempt = now + MIN_INTERVAL_SECONDS
            if self.first_seen is None:
                self.first_seen = (now, step)
            self._send(self._payload(now, step, total_steps, epoch, metrics))
        except Exception as err:  # a status update must never fail a step
            self._failed(err)
            return False
        self.failure = None
        return True

    def _payload(self, now, step, total_steps, epoch, metrics):
        status = {
            "progressPercentage": max(0, min(100, int(100 * step / max(total_steps, 1)))),
            "lastUpdatedTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        start_time, start_step = self.first_seen
        if step > start_step:  # the pace of this process, not of steps a resume skipped
            pace = (now - start_time) / (step - start_step)
            status["estimatedRemainingSeconds"] = max(0, round(pace * (total_steps - step)))
        values = dict(metrics or {})
        if epoch is not None:
            values.setdefault("epoch", epoch)
        if values:
            status["metrics"] = [{"name": str(k), "value": str(v)} for k, v in values.items()]
        return {"trainerStatus": status}

    def _send(self, payload):
        if not self.token_path:
            raise OSError(f"{TOKEN_VARIABLE} is not set")
        with open(self.token_path) as handle:  # rotated by the kubelet: read each time
            token = handle.read().strip()
        request = urllib.request.Request(
            self.url,
            data=json.dumps(payload).encode(),
            method="POST",
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        own_ca = self.url.startswith("https:") and self.ca_cert_path
        context = ssl.create_default_context(cafile=self.ca_cert_path) if own_ca else None
        with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS, context=context) as reply:
            reply.read()

    def _failed(self, err):
        if isinstance(err, urllib.error.HTTPError):
            reason = f"HTTP {err.code} {err.reason}"
        elif isinstance(err, urllib.error.URLError):
            reason = str(err.reason)
        else:
            reason = f"{type(err).__name__}: {err}"
        with contextlib.suppress(Exception):  # a broken report callback must not fail a step
            self.next_attempt = self.clock() + FAILURE_BACKOFF_SECONDS
            if self.failure is None:
                self.failure = (
                    f"Kubeflow Trainer status: could not post the progress to {self.url} "
                    f"({reason}); training continues, retrying every "
                    f"{FAILURE_BACKOFF_SECONDS:.0f} s"
                )
                self.report(self.failure)
