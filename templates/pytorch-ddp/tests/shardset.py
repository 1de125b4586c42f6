"""Writes a dataset as `yard-data pack` does (crates/data/src/pack.rs, manifest.rs), so the tests
need no Rust build: USTAR shards `<prefix>-NNNNNN.tar` with fixed header fields, an index per
shard (`<prefix>-NNNNNN.idx.json`: each sample's key, header offset, and its members' data
offsets and sizes) and `dataset.json`, the manifest, written last.

The samples are the built-in example's by default: 8x8 single-channel images of 4 classes (class k
lights quadrant k, plus seeded jitter) as `<key>.bin` (64 float32) and `<key>.cls` (the label as
text); `fields` gives others (the GPU benchmark's token sequences).
"""
import hashlib
import io
import json
import os
import random
import struct
import tarfile

PREFIX = "shard"


def image(index, rng):
    cls = index % 4
    values = []
    for r in range(8):
        for c in range(8):
            lit = (r >= 4) * 2 + (c >= 4) == cls
            values.append(float(lit) + rng.uniform(-0.3, 0.3))
    return struct.pack("<64f", *values), str(cls).encode()


def image_fields(index, rng):
    """The example's sample `index`: [(extension, bytes)]."""
    return list(zip(("bin", "cls"), image(index, rng)))


def write_dataset(dest, shard_sizes, seed=12345, fields=image_fields, key_prefix="img"):
    """Writes len(shard_sizes) shards, shard i holding shard_sizes[i] samples keyed
    `<key_prefix><NNNNN>` (numbered across shards), each with the members `fields(number, rng)`
    gives. Returns every key, in packing order."""
    os.makedirs(dest, exist_ok=True)
    rng = random.Random(seed)
    keys, entries, number = [], [], 0
    for shard, size in enumerate(shard_sizes):
        name, index_name = f"{PREFIX}-{shard:06d}.tar", f"{PREFIX}-{shard:06d}.idx.json"
        buffer, indexed = io.BytesIO(), []
        with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as archive:
            for _ in range(size):
                key, members_data = f"{key_prefix}{number:05d}", fields(number, rng)
                number += 1
                keys.append(key)
                header_offset, members = archive.offset, []
                for ext, data in members_data:
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size, info.mode, info.mtime, info.uid, info.gid = len(data), 0o444, 0, 0, 0
                    # A USTAR header is one 512-byte block; the data follows it.
                    members.append({"ext": ext, "offset": archive.offset + 512, "size": len(data)})
                    archive.addfile(info, io.BytesIO(data))
                indexed.append({"key": key, "offset": header_offset, "members": members})
        data = buffer.getvalue()
        with open(os.path.join(dest, name), "wb") as f:
            f.write(data)
        with open(os.path.join(dest, index_name), "w") as f:
            json.dump({"shard": name, "samples": indexed}, f)
        entries.append({"name": name, "index": index_name, "samples": size, "bytes": len(data),
                        "sha256": hashlib.sha256(data).hexdigest()})
    content = hashlib.sha256()
    for entry in entries:
        content.update(f"{entry['name']}\0{entry['samples']}\0{entry['sha256']}\n".encode())
    manifest = {"format": "trainyard-shards-v1", "prefix": PREFIX, "shards": entries, "samples": sum(shard_sizes),
                "bytes": sum(e["bytes"] for e in entries), "content_hash": f"sha256:{content.hexdigest()}",
                "created_by": "templates/pytorch-ddp/tests/shardset.py"}
    with open(os.path.join(dest, "dataset.json"), "w") as f:
        json.dump(manifest, f)
    return keys
