"""Pure pieces of the rollout fleet: the router's worker choice and worker list, the server's weights lock and
its behaviour log-prob recorder."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from verl_grpo.errors import ConfigError
from verl_grpo.services.rollout_router import Worker, choose_worker, parse_workers
from verl_grpo.services.rollout_server import BehaviourLogprobs, PolicyLock


def test_the_healthy_worker_with_fewest_in_flight_wins():
    workers = [Worker("http://a", healthy=True, in_flight=2), Worker("http://b", healthy=True, in_flight=1),
               Worker("http://c", healthy=False, in_flight=0)]
    assert choose_worker(workers).url == "http://b"


def test_ties_go_to_the_worker_that_served_fewest():
    workers = [Worker("http://a", healthy=True, requests=5), Worker("http://b", healthy=True, requests=3)]
    assert choose_worker(workers).url == "http://b"


def test_a_retry_skips_the_worker_that_failed_and_none_is_left_when_all_are_out():
    workers = [Worker("http://a", healthy=True), Worker("http://b", healthy=True, in_flight=4)]
    assert choose_worker(workers, frozenset({"http://a"})).url == "http://b"
    assert choose_worker(workers, frozenset({"http://a", "http://b"})) is None
    assert choose_worker([Worker("http://a", healthy=False)]) is None


def test_worker_list_is_checked():
    assert parse_workers("http://127.0.0.1:1/, http://127.0.0.1:2") == ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    with pytest.raises(ConfigError, match="127.0.0.1:3 is not one"):
        parse_workers("http://127.0.0.1:1,127.0.0.1:3")
    with pytest.raises(ConfigError, match="twice"):
        parse_workers("http://a:1,http://a:1")
    with pytest.raises(ConfigError, match="--workers"):
        parse_workers(" , ")


def _wait_until(check, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_waiting_weight_update_goes_before_generations_that_arrive_after_it():
    lock, order = PolicyLock(), []
    release_first = threading.Event()

    def generation(name, hold=None):
        with lock.read():
            order.append(f"{name} starts")
            if hold is not None:
                hold.wait(5)

    def update():
        with lock.write():
            order.append("update")

    first = threading.Thread(target=generation, args=("first", release_first))
    first.start()
    _wait_until(lambda: order == ["first starts"])
    writer = threading.Thread(target=update)
    writer.start()
    _wait_until(lambda: lock._writers_waiting == 1)
    queued = threading.Thread(target=generation, args=("queued",))
    queued.start()
    time.sleep(0.1)
    assert order == ["first starts"]  # the update waits for the running generation, the queued one for the update
    release_first.set()
    for t in (first, writer, queued):
        t.join(5)
    assert order == ["first starts", "update", "queued starts"]


def test_one_generation_at_a_time():
    lock, inside, most = PolicyLock(), [0], [0]

    def generation():
        with lock.read():
            inside[0] += 1
            most[0] = max(most[0], inside[0])
            time.sleep(0.02)
            inside[0] -= 1

    threads = [threading.Thread(target=generation) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert most[0] == 1


def test_recorded_logprobs_are_of_the_unwarped_tempered_distribution_and_warping_keeps_top_k():
    recorder = BehaviourLogprobs(temperature=0.5, top_k=2, top_p=1.0)
    scores = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    warped = recorder(torch.tensor([[7]]), scores.clone())
    assert torch.isinf(warped[0, [0, 3]]).all() and torch.allclose(warped[0, [1, 2]], torch.tensor([6.0, 4.0]))
    later = torch.tensor([[0.0, 1.0, 0.5, 5.0]])
    second = recorder(torch.tensor([[7, 2]]), later.clone())
    assert torch.isinf(second[0, [0, 2]]).all() and not torch.isinf(second[0, [1, 3]]).any()
    logprobs = recorder.finish(torch.tensor([[7, 2, 3]]))
    expected = [torch.log_softmax(scores[0] / 0.5, -1)[2], torch.log_softmax(later[0] / 0.5, -1)[3]]
    torch.testing.assert_close(logprobs[0], torch.stack(expected))
