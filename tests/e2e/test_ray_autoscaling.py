"""`ortinf serve --ray --min-replicas 1 --max-replicas 2`: Ray adds a replica under load and removes it
after, draining it, with no failed request (local Ray cluster, 127.0.0.1 only)."""

from __future__ import annotations

import os
import time

import pytest
from support.server_helpers import running_server
from test_ray_serve import replica_pids, stream_all

pytestmark = pytest.mark.slow


def test_autoscaling_up_under_load_and_back_without_a_failed_request(chat_package, tmp_path):
    pytest.importorskip("ray.serve")
    args = [str(chat_package), "--ray", "--min-replicas", "1", "--max-replicas", "2", "--target-ongoing-requests", "2",
            "--cpus-per-replica", "0.5", "--intra-op-threads", "1", "--kv-cache-memory", "64MiB", "--shutdown-timeout", "30"]
    env = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_ADDRESS": "local"}
    results: list = []
    with running_server(args, tmp_path, env={**os.environ, **env}, timeout=300) as server:
        assert len(replica_pids()) == 1
        deadline = time.monotonic() + 120
        while len(replica_pids()) < 2:  # waves of 8 long streams until Ray scales up
            assert time.monotonic() < deadline, "no scale-up under load"
            threads = stream_all(server.url, 8, results)
            time.sleep(5)
            for thread in threads:
                thread.join(120)
        threads = stream_all(server.url, 8, results)  # load while both replicas run
        for thread in threads:
            thread.join(120)
        deadline = time.monotonic() + 120
        while len(replica_pids()) > 1:  # idle: back to one
            assert time.monotonic() < deadline, "no scale-down after the load"
            time.sleep(1)
    assert results and all(done and error is None for _, done, error in results), [r for r in results if not r[1] or r[2]]
