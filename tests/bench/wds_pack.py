"""The peer: packs the same tree with webdataset's ShardWriter, grouping files by key exactly as
yard-data does (walk, sort, group), so both do the same work."""
import os
import sys

import webdataset as wds

root, out, maxsize = sys.argv[1], sys.argv[2], int(sys.argv[3])
os.makedirs(out, exist_ok=True)
paths = []
for folder, _, files in os.walk(root):
    for name in files:
        paths.append(os.path.relpath(os.path.join(folder, name), root))
paths.sort()
samples = {}
for path in paths:
    base = os.path.basename(path)
    key = os.path.join(os.path.dirname(path), base.split(".", 1)[0])
    samples.setdefault(key, []).append((base.split(".", 1)[1].lower(), path))
with wds.ShardWriter(os.path.join(out, "data-%06d.tar"), maxsize=maxsize, maxcount=100000, verbose=0) as sink:
    for key in sorted(samples):
        sample = {"__key__": key}
        for ext, path in samples[key]:
            with open(os.path.join(root, path), "rb") as f:
                sample[ext] = f.read()
        sink.write(sample)
