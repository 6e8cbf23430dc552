"""Time to the first training step: ``main_ppo`` on TRL's GRPO workload, with a cold then a warm compile cache.

    python3 bench/first_step.py --out /tmp/first_step                 # on the GPU machine (TRL too)
    python3 bench/first_step.py --out /tmp/first_step --skip-trl --tiny   # a tiny CPU run of the script
    python3 bench/first_step.py --out /tmp/fs --skip-trl --variant "local:trainer.backend=local"  # + warm variants

The workload is ``bench/peer_grpo.py``'s (a random-weight Qwen2.5-0.5B-shaped model, 64 prompts of ~380
tokens x 4 generations, 256-token completions, KL to the reference), for one training step. Ours runs
``python3 -m verl.trainer.main_ppo`` twice with the same compile caches (``<out>/compile_cache``, given to
the run as ``TORCHINDUCTOR_CACHE_DIR`` and ``TRITON_CACHE_DIR``): emptied before the first run (cold), kept
for the second (warm). Only the compile caches start cold: the OS's file cache is warm after the model is
built. Measured: wall seconds from launching the process to the first step's metrics line on its stdout
(the console logger's ``step:1 - ...``), and to the process's end; the start-up report the run logs with
``VERL_LOGGING_LEVEL=INFO`` is printed too (where the time went). Baseline, same run: TRL's
``GRPOTrainer`` on the same workload (``peer_grpo.py``'s, one step), from launch to its first logged
metrics and to its end. Each process's output is kept in ``<out>/<run>.log``. Python's bytecode should be
cached, as after a ``pip install``; the script warns when torch's or transformers' is not (a read-only install
without it compiles thousands of modules from source in every process).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.peer_grpo import ours_command, prepare  # noqa: E402
from verl.utils import startup  # noqa: E402


def timed_run(command: list[str], env: dict, log_path: str, is_first_step) -> dict:
    """Run ``command``; seconds from launch to the first output line ``is_first_step`` accepts (None if
    none did) and to the end, and the start-up report's lines. Fails with the log's tail if the run fails."""
    start = time.perf_counter()
    first_step, report, in_report = None, [], False
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                   cwd=REPO, bufsize=1)
        for line in process.stdout:
            log.write(line)
            if first_step is None and is_first_step(line):
                first_step = time.perf_counter() - start
            if "start-up: " in line:  # the report's first line, then its indented ones
                report, in_report = [line[line.index("start-up: "):].rstrip()], True
            elif in_report and line.startswith("  "):
                report.append(line.rstrip())
            else:
                in_report = False
        returncode = process.wait()
    total = time.perf_counter() - start
    if returncode:
        with open(log_path) as f:
            tail = f.readlines()[-40:]
        raise RuntimeError(f"{' '.join(command[:4])} ... exited with {returncode}; the end of {log_path}:\n"
                           + "".join(tail))
    return {"first_step_s": first_step, "total_s": total, "report": report}


def run_ours(out: str, name: str, tiny: bool, max_prompt: int, cache: str, overrides: list[str]) -> dict:
    env = {**os.environ, "VERL_LOGGING_LEVEL": "INFO", "RAY_AUTH_MODE": "disabled", "PYTHONUNBUFFERED": "1",
           "VERL_FILE_LOGGER_PATH": os.path.join(out, f"{name}.jsonl"), "TORCHINDUCTOR_CACHE_DIR": cache,
           "TRITON_CACHE_DIR": os.path.join(cache, "triton"),
           "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    if os.path.exists(env["VERL_FILE_LOGGER_PATH"]):
        os.remove(env["VERL_FILE_LOGGER_PATH"])
    command = [sys.executable, "-m", "verl.trainer.main_ppo", *ours_command(out, 1, tiny, max_prompt, overrides)]
    result = timed_run(command, env, os.path.join(out, f"{name}.log"), lambda line: line.startswith("step:1 - "))
    with open(env["VERL_FILE_LOGGER_PATH"]) as f:
        metrics = json.loads(f.readline())["data"]
    result["stages"] = {k.split("/", 1)[1]: v for k, v in metrics.items() if k.startswith("timing_s/")}
    return result


def run_trl(out: str, tiny: bool) -> dict:
    """peer_grpo.py's TRL run, one step; its first metrics line is the dict the Trainer prints with a loss."""
    command = [sys.executable, os.path.join(REPO, "bench", "peer_grpo.py"), "--out", out, "--steps", "1", "--_trl",
               *(["--quick"] if tiny else [])]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return timed_run(command, env, os.path.join(out, "trl.log"), lambda line: line.startswith("{") and "loss" in line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--tiny", action="store_true", help="a tiny model on the CPU, to check the script")
    parser.add_argument("--skip-trl", action="store_true", help="ours only (TRL needs the trl package)")
    parser.add_argument("--ours-override", action="append", default=[], help="an extra main_ppo override (both runs)")
    parser.add_argument("--variant", action="append", default=[],
                        help="NAME:key=value;key=value -- one more warm-cache run of ours with these overrides "
                             "(after the default warm run; e.g. to compare backends or compile settings)")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    missing = startup.uncached_bytecode()
    if missing:
        print(f"warning: no compiled bytecode for {', '.join(missing)}: each run compiles their modules from source "
              "(seconds a process). Precompile first, e.g. PYTHONPYCACHEPREFIX=/tmp/pyc python3 -m compileall -q "
              "-j 0 <site-packages>, with PYTHONPYCACHEPREFIX exported for this script too", flush=True)
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    prepared = prepare(out, args.tiny)
    cache = os.path.join(out, "compile_cache")
    shutil.rmtree(cache, ignore_errors=True)
    results = {}
    runs = [("cold", []), ("warm", [])]
    for variant in args.variant:
        name, _, overrides = variant.partition(":")
        runs.append((name, [o for o in overrides.split(";") if o]))
    for name, overrides in runs:
        print(f"running ours, {name} ...", flush=True)
        results[name] = run_ours(out, name, args.tiny, max(prepared["prompt_tokens"]), cache,
                                 args.ours_override + overrides)
    if not args.skip_trl:
        print("running TRL ...", flush=True)
        results["trl"] = run_trl(out, args.tiny)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)

    def seconds(value):
        return f"{value:8.1f}" if value is not None else f"{'n/a':>8}"

    print(f"\n{'':30}{'to step 1 (s)':>14}{'to exit (s)':>12}{'vs TRL':>8}")
    labels = [("trl", "TRL GRPOTrainer"), ("cold", "ours, cold cache"), ("warm", "ours, warm cache")]
    labels += [(name, f"ours, warm, {name}") for name, _ in runs[2:]]
    for name, label in labels:
        if name in results:
            r = results[name]
            ratio = ""
            if "trl" in results and name != "trl" and results["trl"]["first_step_s"] and r["first_step_s"]:
                ratio = f"{results['trl']['first_step_s'] / r['first_step_s']:7.2f}x"
            print(f"{label:30}{seconds(r['first_step_s']):>14}{seconds(r['total_s']):>12}{ratio:>8}")
    for name, _ in runs:
        r = results[name]
        print(f"\nours, {name}: first step stages (s): "
              + ", ".join(f"{k} {v:.2f}" for k, v in r["stages"].items()))
        print("\n".join(r["report"]) if r["report"] else
              "no start-up report in the log (it is logged at INFO after the first step by WorkerGroups.log_startup)")


if __name__ == "__main__":
    main()
