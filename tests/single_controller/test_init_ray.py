"""Ray starts by itself when a worker group needs it (in a fresh process, since a process holds one
Ray connection and the other tests share theirs)."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("ray")

SCRIPT = r"""
import logging, os
import ray
from verl.single_controller import ClassWithInitArgs, Dispatch, Worker, register
from verl.single_controller.ray import RayResourcePool, RayWorkerGroup, init_ray

logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")

class EnvWorker(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def environment(self):
        keys = ["RANK", "TOKENIZERS_PARALLELISM", "NCCL_DEBUG", "GLOO_SOCKET_IFNAME", "VERL_DEVICE"]
        return {k: os.environ.get(k) for k in keys}

assert not ray.is_initialized()
group = RayWorkerGroup(RayResourcePool([1], use_gpu=False), ClassWithInitArgs(EnvWorker))
print("ENV", group.environment()[0])
print("NODE", [n["NodeManagerAddress"] for n in ray.nodes()])
print("DASHBOARD", bool(ray._private.worker.global_worker.node.address_info.get("webui_url")))
init_ray(None, "cpu")
"""


def test_worker_group_starts_a_local_loopback_ray():
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=180,
                          env=env, cwd=os.path.dirname(__file__))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert ("ENV {'RANK': '0', 'TOKENIZERS_PARALLELISM': 'true', 'NCCL_DEBUG': 'WARN', "
            "'GLOO_SOCKET_IFNAME': 'lo', 'VERL_DEVICE': 'cpu'}") in out
    assert "NODE ['127.0.0.1']" in out  # Ray's own services use loopback too
    assert "DASHBOARD False" in out
    assert "verl.single_controller: Ray: started a local instance on 127.0.0.1" in out
    assert "verl.single_controller: Ray: reusing" in out
