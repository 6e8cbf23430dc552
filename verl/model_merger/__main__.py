"""``python -m verl.model_merger {merge,test} --backend fsdp --local_dir ... [--target_dir | --test_hf_dir] ...``"""

from __future__ import annotations

import argparse
import sys

from verl.model_merger.fsdp import compare_with_hf, merge_fsdp_checkpoint
from verl.workers.engine.checkpoint import read_fsdp_config


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m verl.model_merger",
                                     description="Export a verl checkpoint as a Hugging Face model folder.")
    commands = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (("merge", "write a Hugging Face folder"), ("test", "compare with a Hugging Face folder")):
        sub = commands.add_parser(name, help=help_text)
        sub.add_argument("--backend", choices=["fsdp", "megatron"], default="fsdp")
        sub.add_argument("--local_dir", required=True, help=".../global_step_N/actor (or critic)")
        sub.add_argument("--trust-remote-code", action="store_true")
        if name == "merge":
            sub.add_argument("--target_dir", required=True, help="the Hugging Face folder to write")
            sub.add_argument("--dtype", default=None, help="convert the weights, e.g. bfloat16 (default: as saved)")
            sub.add_argument("--overwrite", action="store_true", help="replace a non-empty --target_dir")
            sub.add_argument("--hf_upload_path", default=None, help="not supported: upload the folder yourself")
            sub.add_argument("--merge_lora", action="store_true",
                             help="LoRA checkpoint: write the base model with the adapter merged in (default: the "
                                  "PEFT adapter folder)")
            sub.add_argument("--base_model", default=None,
                             help="with --merge_lora: the base model folder (default: the one the run started from)")
        else:
            sub.add_argument("--test_hf_dir", required=True, help="a Hugging Face folder with the expected weights")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.backend == "megatron":
        print("error: --backend megatron: this verl trains with FSDP only; use --backend fsdp", file=sys.stderr)
        return 2
    try:
        if args.command == "merge":
            if args.hf_upload_path:
                print("error: --hf_upload_path is not supported (no hub access here); merge, then upload the "
                      "folder with `huggingface-cli upload`", file=sys.stderr)
                return 2
            path = merge_fsdp_checkpoint(args.local_dir, args.target_dir, dtype=args.dtype,
                                         trust_remote_code=args.trust_remote_code, overwrite=args.overwrite,
                                         merge_lora=args.merge_lora, base_model=args.base_model)
            lora = read_fsdp_config(args.local_dir).get("lora") and not args.merge_lora
            print(f"wrote {'a PEFT LoRA adapter' if lora else 'a Hugging Face model'} to {path}")
            return 0
        problems = compare_with_hf(args.local_dir, args.test_hf_dir)
    except (FileNotFoundError, FileExistsError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if problems:
        print("the checkpoint differs from " + args.test_hf_dir + ":\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    print(f"every weight of {args.test_hf_dir} matches the checkpoint")
    return 0


if __name__ == "__main__":
    sys.exit(main())
