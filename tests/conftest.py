import pytest


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory):
    """A ChatML byte-level BPE tokenizer saved to disk (load it with AutoTokenizer)."""
    from verl.utils.tiny_model import build_tiny_tokenizer

    return build_tiny_tokenizer(str(tmp_path_factory.mktemp("tiny_tokenizer")))


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_tokenizer_dir)


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory, tiny_tokenizer_dir):
    """A random-weight Qwen2 causal LM (tied embeddings) with the tiny tokenizer, saved to disk."""
    from verl.utils.tiny_model import build_tiny_causal_lm

    return build_tiny_causal_lm(str(tmp_path_factory.mktemp("tiny_qwen2")), tiny_tokenizer_dir, arch="qwen2")


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory, tiny_tokenizer_dir):
    """A random-weight Llama causal LM (untied embeddings) with the tiny tokenizer, saved to disk."""
    from verl.utils.tiny_model import build_tiny_causal_lm

    return build_tiny_causal_lm(str(tmp_path_factory.mktemp("tiny_llama")), tiny_tokenizer_dir, arch="llama")


@pytest.fixture
def single_rank(tmp_path, monkeypatch):
    """A one-rank gloo process group (what FSDPEngine needs) for the duration of one test."""
    import torch.distributed as dist

    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture(scope="session")
def ray_session():
    """One Ray cluster for the whole test session: two Ray nodes on this machine
    (``ray.cluster_utils.Cluster``, 4 logical CPUs each; workers take fractions of a CPU, so this fits
    a 2-core machine), loopback only (all of Ray's own services too), no dashboard. Single-node pools
    land on either node; ``trainer.nnodes=2`` spans both. Ray is imported here, so tests that do not
    use it do not pay for it."""
    import ray
    from ray.cluster_utils import Cluster

    from verl.single_controller.ray import _loopback_node_address, init_ray

    node = {"num_cpus": 4, "node_ip_address": "127.0.0.1", "object_store_memory": 256 * 1024**2}
    with _loopback_node_address():  # Ray would otherwise advertise (and listen on) the host's address
        cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
        cluster.add_node(**node)
        cluster.wait_for_nodes()
        init_ray({"ray_init": {"address": cluster.address}}, device="cpu")
    yield ray
    ray.shutdown()
    cluster.shutdown()
