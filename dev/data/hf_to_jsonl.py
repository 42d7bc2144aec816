#!/usr/bin/env python3
"""
hf_to_jsonl.py: a Hugging Face dataset, or parquet files, into the JSON lines that
prepare_data reads (one document per line, {"text": "..."}).

  # FineWeb's 10B-token sample, streamed from the Hub (needs `pip install datasets`)
  python dev/data/hf_to_jsonl.py --dataset HuggingFaceFW/fineweb --name sample-10BT -o data/fineweb_jsonl
  # parquet files already downloaded (needs `pip install pyarrow`)
  python dev/data/hf_to_jsonl.py --parquet 'fineweb/sample/10BT/*.parquet' -o data/fineweb_jsonl
  # then, on all cores, llm.c's shard names with the first shard as val:
  ./prepare_data -i data/fineweb_jsonl -o data/fineweb10B -n fineweb --val-shard

It writes OUT/part_000000.jsonl, part_000001.jsonl, ... of --docs-per-file documents each,
in the dataset's order; prepare_data reads a directory in name order, so the shards keep that
order. Each part is written under a temporary name and renamed when whole. A run that was
stopped can be started again with --resume and the same flags: it keeps the parts that hold
--docs-per-file documents and writes the others (without --resume, an OUT that holds parts
is refused).

Neither `datasets` nor `pyarrow` is needed by anything else in llm3d, and no test runs this:
without the package a mode needs, it says which and exits with status 1.
"""
import argparse
import glob
import json
import os
import sys
import time


def fail(message, status=1):
    print(f"hf_to_jsonl: {message}", file=sys.stderr)
    sys.exit(status)


def documents_from_hub(args):
    import datasets
    ds = datasets.load_dataset(args.dataset, name=args.name, split=args.split, streaming=True)
    for row in ds:
        yield row[args.field]


def documents_from_parquet(paths, args):
    import pyarrow.parquet as pq
    for path in paths:
        pf = pq.ParquetFile(path)
        if args.field not in pf.schema_arrow.names:
            fail(f"{path}: no column '{args.field}' (columns: {', '.join(pf.schema_arrow.names)}); give --field")
        for batch in pf.iter_batches(columns=[args.field], batch_size=4096):
            yield from batch.column(0).to_pylist()


def json_line(text):
    # ensure_ascii=False keeps the file small; a string with a lone surrogate (no UTF-8 for it)
    # is written with \u escapes instead, which prepare_data reads as U+FFFD, as tiktoken does
    line = json.dumps({"text": text}, ensure_ascii=False) + "\n"
    try:
        return line.encode("utf-8")
    except UnicodeEncodeError:
        return (json.dumps({"text": text}) + "\n").encode("ascii")


def count_lines(path):
    with open(path, "rb") as f:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 24), b""))


def write_parts(docs, args):
    os.makedirs(args.out, exist_ok=True)
    existing = sorted(glob.glob(os.path.join(args.out, "part_*.jsonl")))
    if existing and not args.resume:
        fail(f"-o {args.out} holds {len(existing)} parts already: give --resume to add the missing ones, or another -o")
    part, in_part, total, written_bytes = 0, 0, 0, 0
    start = time.time()
    f, tmp, skipping = None, None, False
    for text in docs:
        if text is None:
            continue  # a missing value is not a document
        if f is None and not skipping:
            path = os.path.join(args.out, f"part_{part:06d}.jsonl")
            skipping = os.path.exists(path) and count_lines(path) == args.docs_per_file  # --resume: whole already
            if not skipping:
                tmp = path + ".tmp"
                f = open(tmp, "wb")
        if f is not None:
            line = json_line(text)
            f.write(line)
            written_bytes += len(line)
        in_part += 1
        total += 1
        if in_part == args.docs_per_file:
            if f is not None:
                f.close()
                os.replace(tmp, tmp[:-4])
            f, skipping, in_part = None, False, 0
            part += 1
            elapsed = time.time() - start
            print(f"hf_to_jsonl: {total} documents, {part} parts, {written_bytes / 1e6:.0f} MB written, "
                  f"{total / max(elapsed, 1e-9):.0f} documents/s", file=sys.stderr)
        if args.limit and total >= args.limit:
            break
    if f is not None:
        f.close()
        os.replace(tmp, tmp[:-4])
        part += 1
    elif in_part > 0:
        part += 1
    print(f"hf_to_jsonl: {total} documents in {part} parts under {args.out} ({written_bytes / 1e6:.0f} MB written now)")


def main():
    ap = argparse.ArgumentParser(description="A Hugging Face dataset or parquet files into prepare_data's JSON lines")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--dataset", help="a dataset on the Hub, e.g. HuggingFaceFW/fineweb (streamed)")
    src.add_argument("--parquet", help="a glob of local parquet files, taken in sorted order")
    ap.add_argument("--name", default=None, help="the dataset's configuration, e.g. sample-10BT")
    ap.add_argument("--split", default="train")
    ap.add_argument("--field", default="text", help="the column holding each document (default text)")
    ap.add_argument("-o", "--out", required=True, help="output directory for part_NNNNNN.jsonl")
    ap.add_argument("--docs-per-file", type=int, default=1_000_000, help="documents per part (default 1000000)")
    ap.add_argument("--limit", type=int, default=0, help="stop after this many documents (0 = all)")
    ap.add_argument("--resume", action="store_true", help="keep the parts already in -o and write the rest")
    args = ap.parse_args()
    if args.docs_per_file < 1:
        fail(f"--docs-per-file {args.docs_per_file}: want 1 or more", 2)
    if args.dataset:
        try:
            import datasets  # noqa: F401
        except ImportError:
            fail("--dataset needs the `datasets` package: pip install datasets (or use --parquet with pyarrow)")
        docs = documents_from_hub(args)
    else:
        try:
            import pyarrow.parquet  # noqa: F401 (checked here, before anything is written)
        except ImportError:
            fail("--parquet needs the `pyarrow` package: pip install pyarrow")
        paths = sorted(glob.glob(args.parquet))
        if not paths:
            fail(f"--parquet {args.parquet}: no files match")
        docs = documents_from_parquet(paths, args)
    write_parts(docs, args)


if __name__ == "__main__":
    main()
