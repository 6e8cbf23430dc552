"""The Ray backend: one Ray actor per device, placed by a RayResourcePool. As in the original verl:

    pool = RayResourcePool([n_gpus_per_node] * nnodes, use_gpu=True)
    critic_wg = RayWorkerGroup(resource_pool=pool,
                               ray_cls_with_init=RayClassWithInitArgs(ray.remote(CriticWorker), config))
    # or several roles sharing each device, one actor per device hosting all of them:
    colocated = create_colocated_worker_cls({"actor_rollout": RayClassWithInitArgs(...),
                                             "critic": RayClassWithInitArgs(...)})
    wgs = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=colocated).spawn({"actor_rollout", "critic"})

(``create_colocated_worker_groups(pool, roles)`` does the last two steps.) A RayResourcePool reserves
one placement group per node (STRICT_PACK, one bundle per worker) and hands out ranks in a stable
order: nodes sorted by IP, then bundle order. Up to ``max_colocate_count`` worker groups may share a
pool; each actor takes that fraction of a bundle. The original's import path
``verl.single_controller.ray.base`` is this module.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import ray
from ray.util.placement_group import PlacementGroup, placement_group, placement_group_table
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from verl.single_controller import watchdog, worker_group
from verl.single_controller.worker import DEVICE_ENV, NODE_IP_ENV, free_port, rendezvous_env
from verl.single_controller.worker_group import (
    ClassWithInitArgs, WorkerError, WorkerFuture, WorkerGroup, colocated_worker_class
)
from verl.utils.startup import COMPILE_CACHE_ENV

__all__ = ["init_ray", "RayResourcePool", "RayClassWithInitArgs", "RayWorkerGroup", "RayWorkerFuture",
           "ClassWithInitArgs", "create_colocated_worker_cls", "create_colocated_worker_groups"]

# The original's name: the class and its arguments, built inside the Ray actor.
RayClassWithInitArgs = ClassWithInitArgs

logger = logging.getLogger("verl.single_controller")
# Watchdogs of the local Ray instances this process started; kept referenced, since closing a watchdog's
# pipe (which garbage collection of its Popen would do) is what tells it the driver has ended.
_WATCHDOGS: list = []

# After one rank raises, how long the others get to finish before we assume they are stuck in a
# collective waiting for it and stop the group.
FAILURE_GRACE_S = 3.0


def _plain(value):
    """Mappings and sequences (e.g. OmegaConf containers) as plain dicts and lists."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return [_plain(v) for v in value]
    return value


@contextlib.contextmanager
def _loopback_node_address():
    """Recent Ray swaps a loopback node address for the host's reachable one (and its services then
    listen on every interface) unless it believes clusters are off. Say so while the local node
    starts: the env var for the Ray processes started now, the constant for this one."""
    from ray._private import ray_constants

    key, saved_flag = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", ray_constants.ENABLE_RAY_CLUSTER
    saved_env = os.environ.get(key)
    os.environ[key], ray_constants.ENABLE_RAY_CLUSTER = "0", False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved_flag
        if saved_env is None:
            del os.environ[key]
        else:
            os.environ[key] = saved_env


def init_ray(ray_kwargs: Mapping | None = None, device: str = "cuda") -> None:
    """Make sure this process is connected to Ray: reuse a running connection, else join the
    cluster named by ``ray_kwargs.ray_init.address`` or ``RAY_ADDRESS``, else (or with
    ``address="local"``) start a local, loopback-only instance with the dashboard off.

    ``ray_kwargs`` is verl's ``ray_kwargs`` config: its ``ray_init`` entries go to ``ray.init``
    (``None`` values are dropped; ``num_cpus`` defaults to ``os.cpu_count()``). Every Ray worker
    gets ``TOKENIZERS_PARALLELISM=true`` and ``NCCL_DEBUG=WARN``, plus ``GLOO_SOCKET_IFNAME=lo``
    for a local CPU run, and this process's ``TORCHINDUCTOR_CACHE_DIR``/``TRITON_CACHE_DIR`` when set
    (workers of a cluster joined here do not inherit this environment; unset, each worker picks the
    default of :func:`verl.utils.startup.use_compile_cache`); ``ray_init.runtime_env.env_vars``
    overrides them."""
    if ray.is_initialized():
        logger.info("Ray: reusing the Ray instance this process is already connected to")
        return
    ray_init = {k: v for k, v in _plain((ray_kwargs or {}).get("ray_init") or {}).items() if v is not None}
    address = ray_init.pop("address", None) or os.environ.get("RAY_ADDRESS")
    join = bool(address) and address != "local"
    env_vars = {"TOKENIZERS_PARALLELISM": "true", "NCCL_DEBUG": "WARN",
                **{key: os.environ[key] for key in COMPILE_CACHE_ENV if key in os.environ}}
    if not join and device == "cpu":
        env_vars["GLOO_SOCKET_IFNAME"] = "lo"
    runtime_env = dict(ray_init.pop("runtime_env", None) or {})
    runtime_env["env_vars"] = {**env_vars, **(runtime_env.get("env_vars") or {})}
    if join:
        ignored = [k for k in ("num_cpus", "num_gpus") if ray_init.pop(k, None) is not None]
        if ignored:
            logger.warning("Ray: ray_kwargs.ray_init.%s ignored when joining an existing cluster",
                           "/".join(ignored))
        # A cluster on this machine's loopback (as started here): Ray would otherwise swap 127.0.0.1 for the host's
        # address and never reach it.
        host = address.split("://")[-1].rsplit(":", 1)[0]
        on_loopback = host == "localhost" or host.startswith("127.")
        with _loopback_node_address() if on_loopback else contextlib.nullcontext():
            ray.init(address=address, runtime_env=runtime_env, **ray_init)
        logger.info("Ray: joined the cluster at %s", address)
        return
    ray_init = {"num_cpus": os.cpu_count(), "include_dashboard": False, "_node_ip_address": "127.0.0.1", **ray_init}
    loopback = ray_init["_node_ip_address"] in ("127.0.0.1", "localhost")
    with _loopback_node_address() if loopback else contextlib.nullcontext():
        ray.init(address="local", runtime_env=runtime_env, **ray_init)
    # Ray's processes are this driver's children: stop them even if it is killed (kill -9, OOM).
    _WATCHDOGS.append(watchdog.guard())
    logger.info("Ray: started a local instance on %s with %s CPUs (set RAY_ADDRESS or "
                "ray_kwargs.ray_init.address to join a cluster)", ray_init["_node_ip_address"],
                ray_init["num_cpus"])


# ============================================================================ resource pools
@dataclass(frozen=True)
class _Bundle:
    pg: PlacementGroup
    index: int  # bundle index in its placement group == local rank
    node_id: str
    node_ip: str
    local_world_size: int


class RayResourcePool(worker_group.ResourcePool):
    """Devices for worker groups on Ray: ``process_on_nodes[i]`` workers on the i-th node.

    Each worker gets a bundle of ``num_cpus_per_worker`` CPUs (default 1 with GPUs, 0.25 without,
    so a 2-core machine holds several CPU workers and the driver) plus one GPU when ``use_gpu``.
    Placement groups are created on first use, after checking that the cluster can hold them.
    ``name_prefix`` (the original's keyword) names the pool in errors.
    """

    def __init__(self, process_on_nodes: Sequence[int], use_gpu: bool = True, name_prefix: str | None = None,
                 max_colocate_count: int = 3, *, num_cpus_per_worker: float | None = None,
                 ready_timeout_s: float = 120.0):
        super().__init__(process_on_nodes, max_colocate_count)
        self.use_gpu = use_gpu
        self.num_cpus_per_worker = num_cpus_per_worker if num_cpus_per_worker is not None else (
            1.0 if use_gpu else 0.25)
        self.name = name_prefix or "global_pool"
        self.ready_timeout_s = ready_timeout_s
        self._bundles: list[_Bundle] | None = None
        self._groups = 0

    def actor_options(self) -> dict:
        """Resources of one actor: its share of a bundle (Ray accepts 4 decimals; round down)."""
        share = lambda x: int(x * 10_000 / self.max_colocate_count) / 10_000  # noqa: E731
        return {"num_cpus": share(self.num_cpus_per_worker), "num_gpus": share(1.0) if self.use_gpu else 0}

    def bundles(self) -> list[_Bundle]:
        """One bundle per rank, in rank order (placement groups are made on the first call)."""
        if self._bundles is None:
            self._bundles = self._place()
        return self._bundles

    def remove(self) -> None:
        """Give the reserved resources back to Ray (stop the pool's worker groups first)."""
        for pg in {id(b.pg): b.pg for b in self._bundles or []}.values():
            ray.util.remove_placement_group(pg)
        self._bundles, self._groups = None, 0

    def _check_cluster_fits(self) -> None:
        n = self.process_on_nodes
        layout = (f"trainer.n_gpus_per_node={n[0]} x trainer.nnodes={len(n)}" if len(set(n)) == 1
                  else f"resource pool '{self.name}' with {n} workers per node")
        nodes = [node["Resources"] for node in ray.nodes() if node["Alive"]]
        gpus = [r.get("GPU", 0) for r in nodes]
        if self.use_gpu and (sum(gpus) < self.world_size or max(gpus, default=0) < max(n)):
            raise RuntimeError(
                f"{layout} needs {self.world_size} GPUs ({max(n)} per node) but the Ray cluster has "
                f"{sum(gpus):g} ({max(gpus, default=0):g} on its largest node); lower "
                "trainer.n_gpus_per_node or trainer.nnodes, or set trainer.device=cpu")
        cpus = [r.get("CPU", 0) for r in nodes]
        if sum(cpus) < self.num_cpus_per_worker * self.world_size or \
                max(cpus, default=0) < self.num_cpus_per_worker * max(n):
            raise RuntimeError(
                f"{layout} needs {self.num_cpus_per_worker * self.world_size:g} CPUs "
                f"({self.num_cpus_per_worker:g} per worker, {self.num_cpus_per_worker * max(n):g} on one node) but "
                f"the Ray cluster has {sum(cpus):g} ({max(cpus, default=0):g} on its largest node); lower "
                "trainer.n_gpus_per_node or trainer.nnodes, or give Ray more (ray_kwargs.ray_init.num_cpus)")

    def _place(self) -> list[_Bundle]:
        init_ray(None, "cuda" if self.use_gpu else "cpu")
        self._check_cluster_fits()
        bundle = {"CPU": self.num_cpus_per_worker, **({"GPU": 1} if self.use_gpu else {})}
        pgs = [placement_group([dict(bundle) for _ in range(n)], strategy="STRICT_PACK",
                               **({"bundle_label_selector": [{"ray.io/node-id": node}] * n} if node else {}))
               for n, node in zip(self.process_on_nodes, self._target_nodes(bundle))]
        try:
            ray.get([pg.ready() for pg in pgs], timeout=self.ready_timeout_s)
        except ray.exceptions.GetTimeoutError:
            for pg in pgs:
                ray.util.remove_placement_group(pg)
            raise RuntimeError(
                f"resource pool '{self.name}': Ray could not place {len(pgs)} group(s) of {self.process_on_nodes} "
                f"bundles of {bundle} within {self.ready_timeout_s:g} s. Free now: "
                f"{ray.available_resources()}. Other pools or actors may hold the resources, or no "
                "single node has enough of them") from None
        node_ip = {node["NodeID"]: node["NodeManagerAddress"] for node in ray.nodes()}
        placed = []
        for order, pg in enumerate(pgs):
            node_id = placement_group_table(pg)["bundles_to_node_id"][0]
            placed.append((node_ip[node_id], order, pg, node_id))
        if len({p[3] for p in placed}) != len(placed):  # a Ray that ignores the node selector
            for pg in pgs:
                ray.util.remove_placement_group(pg)
            raise RuntimeError(f"resource pool '{self.name}': Ray put two of its {len(pgs)} per-node groups on one "
                               f"node; this needs ray>=2.50 (installed: {ray.__version__})")
        placed.sort(key=lambda p: (p[0], p[1]))  # stable ranks across restarts: sharded checkpoints
        return [_Bundle(pg, i, node_id, ip, pg.bundle_count)
                for ip, _, pg, node_id in placed for i in range(pg.bundle_count)]

    def _target_nodes(self, bundle: dict) -> list[str | None]:
        """A different Ray node for each entry of ``process_on_nodes``, each with room for its workers
        now (STRICT_PACK alone may put two "nodes" on one machine when it has room for both: then
        nnodes=2 would not span two nodes). ``[None]`` for one node: Ray picks it."""
        if len(self.process_on_nodes) == 1:
            return [None]
        from ray._private.state import available_resources_per_node

        free = available_resources_per_node()
        nodes = sorted((n["NodeManagerAddress"], n["NodeID"]) for n in ray.nodes() if n["Alive"])
        chosen: dict[int, str] = {}
        for entry in sorted(range(len(self.process_on_nodes)), key=lambda i: -self.process_on_nodes[i]):
            need = {key: value * self.process_on_nodes[entry] for key, value in bundle.items()}  # largest first
            node = next((nid for _, nid in nodes if nid not in chosen.values()
                         and all(free.get(nid, {}).get(k, 0.0) >= v - 1e-6 for k, v in need.items())), None)
            if node is None:
                have = {f"{ip}/{nid[:8]}": {k: round(v, 2) for k, v in free.get(nid, {}).items() if k in bundle}
                        for ip, nid in nodes}
                raise RuntimeError(
                    f"resource pool '{self.name}' spreads {self.process_on_nodes} workers over "
                    f"{len(self.process_on_nodes)} nodes, one of them needing {need} free, but only {len(chosen)} of "
                    f"the cluster's {len(nodes)} nodes have room (free now: {have}). Lower trainer.nnodes, or add "
                    "nodes to the Ray cluster (ray start --address=<head>:6379 on each)")
            chosen[entry] = node
        return [chosen[i] for i in range(len(self.process_on_nodes))]

    def _claim(self, who: str) -> list[_Bundle]:
        if self._groups >= self.max_colocate_count:
            raise RuntimeError(
                f"resource pool '{self.name}' already hosts {self._groups} worker groups "
                f"(max_colocate_count={self.max_colocate_count}), so '{who}' does not fit: colocate roles "
                "with create_colocated_worker_groups, give it its own ResourcePool, or raise "
                "max_colocate_count")
        bundles = self.bundles()
        self._groups += 1
        return bundles


# ============================================================================ actors
_free_port = ray.remote(num_cpus=0)(free_port)  # run on the node whose address it is


def _master_address(bundles: list[_Bundle]) -> tuple[str, int]:
    """Where the group meets (rank 0 serves the store there): loopback when every rank is on one node
    (decided by Ray node, not address: nodes started on one machine share one), else rank 0's node
    address; and a port free there now."""
    host = "127.0.0.1" if len({b.node_id for b in bundles}) == 1 else bundles[0].node_ip
    if bundles[0].node_ip == ray.util.get_node_ip_address():  # rank 0 is on this machine
        return host, free_port(host)
    where = NodeAffinitySchedulingStrategy(bundles[0].node_id, soft=False)
    return host, ray.get(_free_port.options(scheduling_strategy=where).remote(host))


class _Actors:
    """The actors of one spawn, shared by the role views of colocated groups."""

    def __init__(self, pool: worker_group.ResourcePool, actor_cls, args: tuple, kwargs: dict, name: str,
                 device: str | None):
        device = device or ("cuda" if pool.use_gpu else "cpu")
        if device == "cuda" and not pool.use_gpu:
            raise ValueError(f"worker group '{name}' wants device='cuda' but its pool has use_gpu=False")
        self.pool, self.stopped, self.handles = pool, None, []
        bundles = pool._claim(name)
        try:
            meet = rendezvous_env(*_master_address(bundles))
            for rank, b in enumerate(bundles):
                env = {"RANK": str(rank), "WORLD_SIZE": str(len(bundles)), "LOCAL_RANK": str(b.index),
                       "LOCAL_WORLD_SIZE": str(b.local_world_size), DEVICE_ENV: device, NODE_IP_ENV: b.node_ip,
                       **meet}
                strategy = PlacementGroupSchedulingStrategy(b.pg, placement_group_bundle_index=b.index)
                options = dict(pool.actor_options(), scheduling_strategy=strategy, runtime_env={"env_vars": env})
                self.handles.append(actor_cls.options(**options).remote(*args, **kwargs))
            # Wait for every constructor, so that a failing __init__ is reported here, by rank.
            ranks = list(range(len(self.handles)))
            self.wait(name, "__init__", ranks, [h.__ray_ready__.remote() for h in self.handles])
        except BaseException:
            self.stop("a worker failed to start")
            raise

    def stop(self, reason: str) -> None:
        if self.stopped is None:
            self.stopped = reason
            self.pool._groups -= 1
            for handle in self.handles:
                ray.kill(handle, no_restart=True)

    def wait(self, role: str, method: str, ranks: list[int], refs: list) -> list:
        """Results of ``refs`` in order. Fails on the first failure instead of waiting for all:
        when one rank dies, the others may wait in a collective forever."""
        rank_of = dict(zip(refs, ranks, strict=True))
        results, pending = {}, list(refs)
        while pending:
            (ref,), pending = ray.wait(pending, num_returns=1)
            try:
                results[ref] = ray.get(ref)
            except Exception as e:  # noqa: BLE001 -- every failure is reported as a WorkerError
                raise self._failure(role, method, rank_of[ref], e, pending, rank_of) from None
        return [results[r] for r in refs]

    def _failure(self, role: str, method: str, rank: int, error: Exception, pending: list,
                 rank_of: dict) -> WorkerError:
        text = re.sub(r"\x1b\[[0-9;]*m", "", str(error))  # Ray colours some lines
        if _died(error):
            self.stop(f"rank {rank} died while running {method}()")
            return WorkerError(role, rank, method, died=True, detail=(
                "its process exited or was killed; the group's other workers were stopped so that "
                f"none hangs waiting for it. Ray says: {text}"))
        if pending:
            ready, still_running = ray.wait(pending, num_returns=len(pending), timeout=FAILURE_GRACE_S)
            for ref in ready:  # a peer that died is the cause (this rank's collective lost its partner)
                try:
                    ray.get(ref)
                except Exception as other:  # noqa: BLE001
                    if _died(other):
                        return self._failure(role, method, rank_of[ref], other, [], rank_of)
            if still_running:
                self.stop(f"rank {rank} raised in {method}() while other ranks were still running")
        hint = ""
        if _STORE_TIMEOUT.search(text):
            hint = (f"rank {rank} could not reach the rendezvous store on rank 0's node: check that the nodes can "
                    "reach each other on that address and port (firewall, network interface).\n")
        elif _COLLECTIVE_TIMEOUT.search(text):
            hint = (f"rank {rank} waited longer than the collective timeout (actor_rollout_ref.nccl_timeout) for "
                    "the other ranks of a collective: one of them never joined it (it took a different code "
                    "path, e.g. ran fewer micro-batches, or is stuck). Its own traceback, if any, is below.\n")
        return WorkerError(role, rank, method, detail=f"{hint}Traceback in the worker:\n{text}")


def _died(error: Exception) -> bool:
    return isinstance(error, ray.exceptions.RayActorError) and not error.actor_init_failed


# How gloo and NCCL say that a collective gave up waiting.
_COLLECTIVE_TIMEOUT = re.compile(r"Timed out waiting \d+ ?ms for (recv|send)"
                                 r"|Watchdog caught collective operation timeout")
_STORE_TIMEOUT = re.compile(r"client socket has timed out.*trying to connect", re.IGNORECASE | re.DOTALL)


class RayWorkerFuture(list, WorkerFuture):
    """The future of a non-blocking call whose result is the list of rank results: ``get()`` as every
    :class:`WorkerFuture`, and also the list of the calls' Ray object references, so that
    ``ray.get(future)`` works as it does on the original's non-blocking calls."""

    def __init__(self, group: WorkerGroup, method: str, ranks: list[int], handles: list, finish):
        list.__init__(self, handles)
        WorkerFuture.__init__(self, group, method, ranks, handles, finish)


class RayWorkerGroup(WorkerGroup):
    """One worker of ``ray_cls_with_init.cls`` per bundle of ``resource_pool``, each in its own Ray
    actor. ``name_prefix`` names the role in errors (default: the class name); ``device`` is
    ``"cuda"`` or ``"cpu"`` (default: ``"cuda"`` if the pool has GPUs)."""

    _list_future = RayWorkerFuture

    def __init__(self, resource_pool: RayResourcePool, ray_cls_with_init: ClassWithInitArgs,
                 name_prefix: str | None = None, device: str | None = None):
        name = name_prefix or ray_cls_with_init.cls.__name__
        super().__init__(ray_cls_with_init.cls, name)
        self._actors = _Actors(resource_pool, ray.remote(ray_cls_with_init.cls), ray_cls_with_init.args,
                               ray_cls_with_init.kwargs, name, device)

    @property
    def world_size(self) -> int:
        return len(self._actors.handles)

    @property
    def workers(self) -> list:
        """The Ray actor handles, by rank (calls on them bypass dispatch and error reports)."""
        return list(self._actors.handles)

    def spawn(self, prefix_set) -> dict[str, "RayWorkerGroup"]:
        """For a group of colocated roles (built from :func:`create_colocated_worker_cls`): a group per role
        named in ``prefix_set``, whose methods are the role's own (``critic.compute_values`` calls
        ``critic_compute_values`` on the shared actors)."""
        roles = getattr(self.worker_cls, "role_classes", None)
        if roles is None:
            raise TypeError(f"spawn() splits a group of colocated roles (made by create_colocated_worker_cls); "
                            f"'{self.name}' hosts {self.worker_cls.__name__} alone")
        unknown = sorted(set(prefix_set) - roles.keys())
        if unknown:
            raise ValueError(f"spawn({sorted(prefix_set)}): '{self.name}' hosts the roles {list(roles)}, not {unknown}")
        return {role: _ColocatedRole(self._actors, roles[role], role) for role in prefix_set}

    def _check_running(self, method: str) -> None:
        if self._actors.stopped is not None:
            raise WorkerError(self.name, -1, method, "the worker group was stopped earlier: "
                              f"{self._actors.stopped}; create a new one", died=True)

    def _submit(self, method: str, calls: list[tuple[int, tuple, dict]]) -> list:
        self._check_running(method)
        remote_name = self._method_prefix + method
        handles = []
        for rank, args, kwargs in calls:
            actor_method = getattr(self._actors.handles[rank], remote_name, None)
            if actor_method is None:
                raise AttributeError(f"{self.worker_cls.__name__} has no method {method!r} that the "
                                     "driver can call (colocated roles expose their @register-ed methods)")
            handles.append(actor_method.remote(*args, **kwargs))
        return handles

    def _wait(self, method: str, ranks: list[int], handles: list) -> list:
        self._check_running(method)
        return self._actors.wait(self.name, method, ranks, handles)

    def shutdown(self) -> None:
        self._actors.stop("shutdown() was called")


class _ColocatedRole(RayWorkerGroup):
    """One role's view of colocated actors: its calls go to the ``{role}_{method}`` methods."""

    def __init__(self, actors: _Actors, worker_cls: type, role: str):
        WorkerGroup.__init__(self, worker_cls, role, method_prefix=f"{role}_")
        self._actors = actors


def create_colocated_worker_cls(class_dict: dict[str, ClassWithInitArgs]) -> ClassWithInitArgs:
    """The original's way to colocate roles: one class (a ``WorkerDict``) that builds every role of
    ``class_dict`` in its process and exposes each role's registered methods as ``{role}_{method}``.
    A :class:`RayWorkerGroup` of it has those prefixed methods; its :meth:`RayWorkerGroup.spawn` gives
    a group per role. The roles share each device (time-slicing it) and one torch.distributed
    process group per process."""
    roles = dict(class_dict)
    return ClassWithInitArgs(colocated_worker_class(roles), roles)


def create_colocated_worker_groups(resource_pool: RayResourcePool, roles: dict[str, ClassWithInitArgs],
                                   device: str | None = None) -> dict[str, RayWorkerGroup]:
    """Build every role inside ONE Ray actor per bundle (:func:`create_colocated_worker_cls`) and
    return a WorkerGroup per role. Stopping any role's group stops the shared actors."""
    host = RayWorkerGroup(resource_pool, create_colocated_worker_cls(roles), name_prefix="+".join(roles), device=device)
    return host.spawn(roles)
