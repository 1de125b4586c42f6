"""The peer for reading: iterates every sample of the shards with webdataset, touching every byte
count as yard-data read does (no decoding)."""
import json
import sys
import time

import webdataset as wds

root = sys.argv[1]
manifest = json.load(open(root + "/dataset.json"))
urls = [root + "/" + s["name"] for s in manifest["shards"]]
start = time.time()
samples = size = 0
for sample in wds.WebDataset(urls, shardshuffle=False, empty_check=False):
    samples += 1
    size += sum(len(v) for k, v in sample.items() if not k.startswith("__"))
seconds = time.time() - start
print(f"read {samples} samples, {size / 1e6:.1f} MB in {seconds:.2f}s: {samples / seconds:.0f} samples/s, {size / 1e6 / seconds:.0f} MB/s")
