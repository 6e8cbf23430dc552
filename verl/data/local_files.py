"""Read a local copy of a dataset's train/test splits and write verl parquet files.

Used by the scripts in ``examples/data_preprocess/``. A local copy may be:

- a folder downloaded with ``huggingface-cli download <repo> --repo-type dataset --local-dir DIR``:
  shards named ``train-00000-of-00001.parquet`` / ``test-...`` in a config folder (``main/`` for
  GSM8K), in ``data/`` (the default config of most datasets) or directly in DIR;
- a folder holding ``train.parquet`` / ``test.parquet`` or ``train.jsonl`` / ``test.jsonl``;
- one or two files whose names say their split (``train*.parquet``, ``gsm8k_test.jsonl``, ...).

Only the standard library, pandas and pyarrow are needed (no Hugging Face ``datasets``).
"""

import json
import os
import re

import pandas as pd

from verl.utils.fs import atomic_write

SPLITS = ("train", "test")
FORMATS = (".parquet", ".jsonl")  # in order of preference when a folder holds both

# "train" or "test" as a word of the file name: train-00000-of-00001.parquet, gsm8k_test.jsonl
_SPLIT_IN_NAME = re.compile(r"(?<![a-z])(train|test)(?![a-z])")


class LocalDatasetError(Exception):
    """A problem with the user's input data; the message says what and where."""


def split_of(filename: str):
    """The split a data file holds, judged by its name ("train", "test"), or None."""
    name = os.path.basename(filename).lower()
    if not name.endswith(FORMATS):
        return None
    found = set(_SPLIT_IN_NAME.findall(name))
    return found.pop() if len(found) == 1 else None


def _split_files_in(folder: str) -> dict:
    """{split: sorted shard paths} for the data files directly inside ``folder``."""
    found = {}
    for ext in FORMATS:  # a split found as parquet is not read a second time from jsonl
        shards = {}
        for name in sorted(os.listdir(folder)):
            path = os.path.join(folder, name)
            split = split_of(name)
            if split and name.lower().endswith(ext) and os.path.isfile(path):
                shards.setdefault(split, []).append(path)
        for split, files in shards.items():
            found.setdefault(split, files)
    return found


def _describe(folder: str, limit: int = 20) -> str:
    names = sorted(n + ("/" if os.path.isdir(os.path.join(folder, n)) else "") for n in os.listdir(folder))
    shown = ", ".join(names[:limit]) + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")
    return f"  {folder}: {shown or '(empty)'}"


def find_split_files(paths, config_dirs=()) -> dict:
    """Locate the split files of a local dataset copy; returns {split: [file, ...]}.

    ``paths`` is one folder, or one or two files. In a folder, the sub-folders ``config_dirs``
    (e.g. ``("main",)`` for GSM8K), then the folder itself, then ``data/`` are searched, and the
    first one holding any split files is used, so other configs (GSM8K's ``socratic/``) and
    per-subject copies are never mixed in.
    """
    paths = [os.path.expanduser(p) for p in ([paths] if isinstance(paths, str) else paths)]
    for p in paths:
        if not os.path.exists(p):
            raise LocalDatasetError(f"--local_dataset_path {p!r} does not exist.")

    if len(paths) == 1 and os.path.isdir(paths[0]):
        root = paths[0]
        candidates = [os.path.join(root, d) for d in (*config_dirs, ".", "data")]
        candidates = [os.path.normpath(c) for c in candidates if os.path.isdir(c)]
        for folder in candidates:
            found = _split_files_in(folder)
            if found:
                return {split: found[split] for split in SPLITS if split in found}
        listing = "\n".join(_describe(c) for c in candidates)
        where = ", ".join(f"{d}/" for d in config_dirs) + (", " if config_dirs else "")
        raise LocalDatasetError(
            f"No train/test split files found in {root!r}.\nSearched these folders, which contain:\n{listing}\n"
            f"Expected files named like train-00000-of-00001.parquet and test-00000-of-00001.parquet "
            f"(as `huggingface-cli download` saves them), train.parquet/test.parquet or "
            f"train.jsonl/test.jsonl, in {where}the folder itself or data/."
        )

    found = {}
    for p in paths:
        split = split_of(p)
        if os.path.isdir(p) or split is None:
            raise LocalDatasetError(f"Cannot tell which split {p!r} holds. Pass one folder, or one or two "
                                    ".parquet/.jsonl files whose names contain 'train' or 'test' (e.g. "
                                    "train-00000-of-00001.parquet, test.jsonl).")
        if split in found:
            raise LocalDatasetError(f"Two files given for the {split} split: {found[split][0]!r} and {p!r}.")
        found[split] = [p]
    return {split: found[split] for split in SPLITS if split in found}


def read_records(files) -> list:
    """All rows of the given .parquet / .jsonl shards, in order, as a list of dicts."""
    rows = []
    for path in files:
        if path.lower().endswith(".parquet"):
            rows.extend(pd.read_parquet(path).to_dict("records"))
            continue
        # json line by line, not pd.read_json: that would turn numeric-looking strings into numbers.
        with open(path, encoding="utf-8") as f:
            for line_no, line in enumerate(f, start=1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise LocalDatasetError(f"{path}, line {line_no}: not valid JSON ({e}).") from None
    return rows


def load_local_splits(paths, columns, config_dirs=()) -> dict:
    """{split: rows} for every split found; checks that each row has the needed ``columns``."""
    splits = {}
    for split, files in find_split_files(paths, config_dirs).items():
        rows = read_records(files)
        if not rows:
            raise LocalDatasetError(f"The {split} split ({', '.join(files)}) has no rows.")
        for i, row in enumerate(rows):
            if not isinstance(row, dict):
                raise LocalDatasetError(f"Row {i} of the {split} split ({', '.join(files)}) is not a JSON object.")
            missing = [c for c in columns if c not in row]
            if missing:
                raise LocalDatasetError(f"Row {i} of the {split} split ({', '.join(files)}) lacks the column(s) "
                                        f"{missing}; it has {sorted(row)}. Expected columns: {list(columns)}.")
        splits[split] = rows
    return splits


def load_hub_splits(repo: str, config, local_name: str) -> dict:
    """{split: rows} from the Hugging Face Hub, when the optional ``datasets`` package is installed."""
    try:
        import datasets
    except ImportError:
        raise LocalDatasetError(
            "No --local_dataset_path given, and the Hugging Face `datasets` package is not installed.\n"
            "Download the dataset once with\n"
            f"  huggingface-cli download {repo} --repo-type dataset --local-dir data/{local_name}\n"
            f"then pass --local_dataset_path data/{local_name}"
        ) from None
    dataset = datasets.load_dataset(repo, config)
    return {split: dataset[split].to_list() for split in SPLITS if split in dataset}


def write_parquet_atomic(rows: list, path: str) -> None:
    """Write ``rows`` to ``path`` so that readers never see a half-written file."""
    with atomic_write(path) as f:
        pd.DataFrame(rows).to_parquet(f, index=False)


def save_splits(rows_by_split: dict, out_dir: str) -> dict:
    """Write ``<out_dir>/<split>.parquet`` for each split and print a short summary."""
    out_dir = os.path.expanduser(out_dir)
    written = {}
    for split, rows in rows_by_split.items():
        written[split] = os.path.join(out_dir, f"{split}.parquet")
        write_parquet_atomic(rows, written[split])
        print(f"{split}: {len(rows)} rows -> {written[split]}")
    for split in SPLITS:
        if split not in rows_by_split:
            print(f"note: the input has no {split} split, so no {split}.parquet was written")
    first_split = next(iter(rows_by_split))
    print(f"first {first_split} row:")
    for key, value in rows_by_split[first_split][0].items():
        text = repr(value)
        print(f"  {key}: {text if len(text) <= 120 else text[:117] + '...'}")
    return written
