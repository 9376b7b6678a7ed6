"""paddle_resnet/core/trainer_status.py against a real HTTP server on 127.0.0.1: the payload
and the bearer token as Kubeflow Trainer's docs give them, at most one post every 5 s by an
injected clock, the token file read again for each post, and a server that is down or
answers an error: no exception, one line."""

import http.server
import json
import socket
import threading

import pytest

from paddle_resnet.core import trainer_status
from paddle_resnet.core.trainer_status import TrainerStatus

STATUS_PATH = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/ml/trainjobs/rn50/status"


class Clock:
    """A monotonic clock the test moves: no sleeping, no races."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


@pytest.fixture
def server():
    """A status endpoint: records (method, path, headers, JSON body) of each request and
    answers ``server.answer`` (200 by default)."""
    received = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append((self.command, self.path, dict(self.headers), json.loads(body)))
            self.send_response(httpd.answer)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    httpd.answer = 200
    httpd.received = received
    httpd.url = f"http://127.0.0.1:{httpd.server_address[1]}{STATUS_PATH}"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()
    thread.join()


@pytest.fixture
def token(tmp_path):
    path = tmp_path / "token"
    path.write_text("first-token\n")
    return path


def poster(url, token, clock, lines=None):
    environ = {
        trainer_status.SERVER_URL_VARIABLE: url,
        trainer_status.TOKEN_VARIABLE: str(token),
        trainer_status.CA_CERT_VARIABLE: "/var/run/secrets/kubeflow/trainer/ca.crt",
    }
    report = (lines if lines is not None else []).append
    return TrainerStatus.from_environment(environ, report=report, clock=clock)


def test_none_outside_a_trainjob():
    assert TrainerStatus.from_environment({}) is None
    assert TrainerStatus.from_environment({trainer_status.SERVER_URL_VARIABLE: ""}) is None


def test_the_payload_and_the_bearer_token_as_documented(server, token):
    clock = Clock()
    status = poster(server.url, token, clock)
    assert status.post(50, 200, epoch=1, metrics={"loss": 0.25, "top1": 61.5}) is True
    clock.now += 10
    assert status.post(100, 200, epoch=2, metrics={"loss": 0.2}) is True
    (method, path, headers, first), (_, _, _, second) = server.received
    assert (method, path) == ("POST", STATUS_PATH)
    assert headers["Authorization"] == "Bearer first-token"
    assert headers["Content-Type"] == "application/json"
    assert set(first) == {"trainerStatus"}
    assert first["trainerStatus"]["progressPercentage"] == 25
    assert first["trainerStatus"]["metrics"] == [
        {"name": "loss", "value": "0.25"},
        {"name": "top1", "value": "61.5"},
        {"name": "epoch", "value": "1"},
    ]
    assert first["trainerStatus"]["lastUpdatedTime"].endswith("Z")
    assert "estimatedRemainingSeconds" not in first["trainerStatus"]  # no pace yet
    # 50 steps in 10 s: 100 steps to go, 20 s
    assert second["trainerStatus"]["progressPercentage"] == 50
    assert second["trainerStatus"]["estimatedRemainingSeconds"] == 20


def test_at_most_one_post_every_5_seconds(server, token):
    clock = Clock()
    status = poster(server.url, token, clock)
    posted = []
    for step, seconds in enumerate([0, 1, 4.9, 5.0, 5.1, 9.9, 10.0, 30.0]):
        clock.now = 1000.0 + seconds
        posted.append(status.post(step, 100))
    assert posted == [True, False, False, True, False, False, True, True]
    assert [body["trainerStatus"]["progressPercentage"] for *_, body in server.received] == [
        0,
        3,
        6,
        7,
    ]


def test_a_rotated_token_is_picked_up(server, token):
    clock = Clock()
    status = poster(server.url, token, clock)
    status.post(1, 10)
    token.write_text("rotated-token\n")  # the kubelet renews the projected token
    clock.now += 5
    status.post(2, 10)
    assert [h["Authorization"] for _, _, h, _ in server.received] == [
        "Bearer first-token",
        "Bearer rotated-token",
    ]


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # closed when the block ends: nothing listens


def test_a_server_that_is_down_costs_one_line_and_no_exception(token):
    clock, lines = Clock(), []
    url = f"http://127.0.0.1:{free_port()}{STATUS_PATH}"
    status = poster(url, token, clock, lines)
    for _ in range(5):
        assert status.post(1, 10) is False
        clock.now += trainer_status.FAILURE_BACKOFF_SECONDS
    (line,) = lines
    assert line.startswith(f"Kubeflow Trainer status: could not post the progress to {url} (")
    assert "training continues" in line and "\n" not in line
    assert status.failure == line


def test_an_error_answer_or_no_token_is_one_line_until_a_post_succeeds(server, token):
    clock, lines = Clock(), []
    status = poster(server.url, token, clock, lines)
    server.answer = 403
    assert status.post(1, 10) is False
    clock.now += 5  # within the failure's backoff: not even attempted
    assert status.post(2, 10) is False and len(server.received) == 1
    clock.now += trainer_status.FAILURE_BACKOFF_SECONDS
    assert status.post(3, 10) is False
    assert len(lines) == 1 and "(HTTP 403 Forbidden)" in lines[0]
    server.answer = 200
    clock.now += trainer_status.FAILURE_BACKOFF_SECONDS
    assert status.post(4, 10) is True and status.failure is None
    token.unlink()  # a new failure after a success is reported again
    clock.now += 5
    assert status.post(5, 10) is False
    assert len(lines) == 2 and "FileNotFoundError" in lines[1]


def test_a_report_that_raises_does_not_fail_the_step(token):
    def broken(line):
        raise RuntimeError("the logger is gone")

    status = TrainerStatus(f"http://127.0.0.1:{free_port()}/", str(token), report=broken)
    assert status.post(1, 10) is False
