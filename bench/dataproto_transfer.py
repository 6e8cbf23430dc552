"""DataProto between processes: what a PPO step's batch costs to send to a Ray actor and back, against
the same tensors and numpy columns sent as a plain dict (what Ray does with no DataProto in the way).

The batch is shaped like one PPO step: 256 rows, prompt + response 1024 tokens, response 512
(input_ids, attention_mask, position_ids int64 (256, 1024); responses, response_mask int64 (256, 512);
old_log_probs, ref_log_prob, advantages, returns, values float32 (256, 512)) plus the non-tensor
columns uid, data_source and reward_model (a dict per row).

    python3 bench/dataproto_transfer.py                 # 2 warm-up + 21 measured repeats of each case

Cases, each the median of the measured repeats (baseline and DataProto alternate):
- round trip: driver -> an actor whose method returns its argument -> driver, for the plain dict
  (baseline) and the DataProto;
- chunk cycle: split in two, each half to its own actor and back, joined again: the dict's halves
  cloned (a view would ship its parent's storage) and concatenated with torch.cat / np.concatenate,
  against ``DataProto.chunk(2)`` and ``DataProto.concat``;
- in process: ``pickle.dumps`` + ``pickle.loads`` (protocol 5) and the pickled size, for reference.

Ray runs locally on loopback only, dashboard off, 2 CPUs.
"""

from __future__ import annotations

import argparse
import os
import pickle
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np
import ray
import torch

from verl.protocol import DataProto
from verl.single_controller.ray import init_ray

ROWS, SEQ, RESPONSE = 256, 1024, 512


def make_columns(rows: int = ROWS, seq: int = SEQ, response: int = RESPONSE, n: int = 8):
    """The tensors and numpy columns of one PPO step (``n`` responses per prompt share a uid)."""
    g = torch.Generator().manual_seed(0)
    tensors = {
        "input_ids": torch.randint(0, 151_936, (rows, seq), generator=g),
        "attention_mask": torch.ones(rows, seq, dtype=torch.int64),
        "position_ids": torch.arange(seq).expand(rows, seq).contiguous(),
        "responses": torch.randint(0, 151_936, (rows, response), generator=g),
        "response_mask": torch.ones(rows, response, dtype=torch.int64),
    }
    for key in ("old_log_probs", "ref_log_prob", "advantages", "returns", "values"):
        tensors[key] = torch.randn(rows, response, generator=g)
    uid = np.array([f"prompt-{i // n:05d}" for i in range(rows)], dtype=object)
    data_source = np.array(["openai/gsm8k"] * rows, dtype=object)
    reward_model = np.empty(rows, dtype=object)
    for i in range(rows):
        reward_model[i] = {"style": "rule", "ground_truth": str(1000 + i // n)}
    return tensors, {"uid": uid, "data_source": data_source, "reward_model": reward_model}


@ray.remote
class Echo:
    def echo(self, x):
        return x


def medians_s(base_fn, ours_fn, warmup: int, repeats: int) -> tuple[float, float]:
    """Median seconds of each function; the two alternate (ABBA...) so drift on a shared machine
    falls on both alike."""
    for _ in range(warmup):
        base_fn(), ours_fn()
    times: dict = {base_fn: [], ours_fn: []}
    for i in range(repeats):
        for fn in (base_fn, ours_fn) if i % 2 == 0 else (ours_fn, base_fn):
            start = time.perf_counter()
            fn()
            times[fn].append(time.perf_counter() - start)
    return statistics.median(times[base_fn]), statistics.median(times[ours_fn])


def check_same(tensors: dict, non_tensors: dict, back_tensors, back_non_tensors) -> None:
    for key, value in tensors.items():
        assert torch.equal(back_tensors[key], value), f"{key} changed on the way"
    for key, value in non_tensors.items():
        assert back_non_tensors[key].tolist() == value.tolist(), f"{key} changed on the way"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=21)
    args = parser.parse_args()

    tensors, non_tensors = make_columns()
    plain = {**tensors, **non_tensors}
    data = DataProto.from_dict(dict(tensors), dict(non_tensors))
    tensor_mb = sum(t.numel() * t.element_size() for t in tensors.values()) / 2**20
    print(f"batch: {ROWS} rows, {len(tensors)} tensors ({tensor_mb:.1f} MiB), {len(non_tensors)} numpy columns; "
          f"batch type {type(data.batch).__module__}.{type(data.batch).__name__}; torch {torch.__version__}, "
          f"ray {ray.__version__}, {os.cpu_count()} CPUs")

    init_ray({"ray_init": {"num_cpus": 2}}, device="cpu")
    actors = [Echo.remote(), Echo.remote()]
    ray.get([a.echo.remote(None) for a in actors])  # both started

    back = ray.get(actors[0].echo.remote(plain))
    check_same(tensors, non_tensors, back, back)
    back = ray.get(actors[0].echo.remote(data))
    check_same(tensors, non_tensors, back.batch, back.non_tensor_batch)

    def plain_cycle():
        halves = [{k: (v[s].clone() if isinstance(v, torch.Tensor) else v[s]) for k, v in plain.items()}
                  for s in (slice(0, ROWS // 2), slice(ROWS // 2, ROWS))]
        parts = ray.get([a.echo.remote(h) for a, h in zip(actors, halves)])
        return {k: torch.cat([p[k] for p in parts]) if isinstance(v, torch.Tensor)
                else np.concatenate([p[k] for p in parts]) for k, v in plain.items()}

    def proto_cycle():
        parts = ray.get([a.echo.remote(c) for a, c in zip(actors, data.chunk(2))])
        return DataProto.concat(parts)

    joined = proto_cycle()
    check_same(tensors, non_tensors, joined.batch, joined.non_tensor_batch)
    joined = plain_cycle()
    check_same(tensors, non_tensors, joined, joined)

    cases = [
        ("round trip driver -> actor -> driver",
         lambda: ray.get(actors[0].echo.remote(plain)), lambda: ray.get(actors[0].echo.remote(data))),
        ("chunk(2) -> two actors -> concat", plain_cycle, proto_cycle),
        ("in process pickle.dumps + loads",
         lambda: pickle.loads(pickle.dumps(plain, protocol=5)), lambda: pickle.loads(pickle.dumps(data, protocol=5))),
    ]
    print(f"median of {args.repeats} after {args.warmup} warm-up")
    for name, base_fn, ours_fn in cases:
        base, ours = medians_s(base_fn, ours_fn, args.warmup, args.repeats)
        print(f"{name}: plain dict {base * 1e3:.1f} ms | DataProto {ours * 1e3:.1f} ms | "
              f"DataProto/plain {ours / base:.2f}x")
    base_bytes, ours_bytes = len(pickle.dumps(plain, protocol=5)), len(pickle.dumps(data, protocol=5))
    half_bytes = len(pickle.dumps(data.chunk(2)[1], protocol=5))
    print(f"pickled size: plain dict {base_bytes / 2**20:.2f} MiB | DataProto {ours_bytes / 2**20:.2f} MiB | "
          f"one chunk(2) half {half_bytes / 2**20:.2f} MiB")
    ray.shutdown()


if __name__ == "__main__":
    main()
