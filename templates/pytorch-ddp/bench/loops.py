"""The seed table's two loops without the engine (bench/seed_table.py runs them), on the model and
data of bench/transformer.py, on the GPU when there is one (else the CPU):

- `plain`: a training loop as a user writes one from PyTorch's tutorials: a Dataset reading one
  file per sample, a DataLoader (shuffled, worker processes, no pinned memory), the batch moved
  with `.to(device)`, AdamW, fp32, no compile. What the engine is compared against.
- `bare`: the framework's own limit: the whole dataset already on the device, bf16 autocast,
  torch.compile, AdamW's fused kernel as the engine uses on a GPU, nothing else: no data
  loading, no DDP, no checkpoints, no metrics. The engine's step time is compared with it.

Both print `step N loss X` every --log-every steps after reading the loss (which waits for the
device), as the engine does, so the harness times all of them alike from those lines; `plain`
adds `stall S`, the seconds it waited for batches so far. `bare` first prints
`flops_per_sample N`: torch's FLOP counter over one eager forward and backward.

Usage: loops.py plain|bare --files DIR --batch-size B --steps N --log-every L [--workers W]
"""
import argparse
import os
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import transformer  # noqa: E402

LR = 3e-4


class SampleFiles(Dataset):
    """One `.bin` file per sample in a folder."""

    def __init__(self, folder):
        self.paths = sorted(os.path.join(folder, name) for name in os.listdir(folder) if name.endswith(".bin"))

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, index):
        with open(self.paths[index], "rb") as f:
            return transformer.decode({"bin": f.read()})


def plain(args, device):
    loader = DataLoader(SampleFiles(args.files), batch_size=args.batch_size, shuffle=True, drop_last=True,
                        num_workers=args.workers, persistent_workers=args.workers > 0)
    model = transformer.build_model().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    step, stall = 0, 0.0
    while step < args.steps:
        batches = iter(loader)
        while step < args.steps:
            waited = time.monotonic()
            try:
                inputs, targets = next(batches)
            except StopIteration:
                break
            stall += time.monotonic() - waited
            inputs, targets = inputs.to(device), targets.to(device)
            loss = transformer.loss_fn(model(inputs), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if step % args.log_every == 0:
                print(f"step {step} loss {loss.item():.4f} stall {stall:.4f}", flush=True)


def samples_on(device, folder):
    """Every sample's inputs and targets, stacked, on `device`."""
    pairs = [sample for sample in SampleFiles(folder)]
    inputs = torch.stack([p[0] for p in pairs]).to(device)
    targets = torch.stack([p[1] for p in pairs]).to(device)
    return inputs, targets


def flops_per_sample(model, inputs, targets, autocast):
    try:
        from torch.utils.flop_counter import FlopCounterMode
        with FlopCounterMode(display=False) as counter:
            with autocast:
                loss = transformer.loss_fn(model(inputs), targets)
            loss.backward()
        model.zero_grad(set_to_none=True)
        return counter.get_total_flops() / len(inputs)
    except Exception as err:  # noqa: BLE001 - a measurement beside the point: say why it is missing
        print(f"flops_per_sample unknown: {type(err).__name__}: {err}", flush=True)
        return None


def bare(args, device):
    inputs, targets = samples_on(device, args.files)
    batches = len(inputs) // args.batch_size
    model = transformer.build_model().to(device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16)
    flops = flops_per_sample(model, inputs[:args.batch_size], targets[:args.batch_size], autocast)
    if flops is not None:
        print(f"flops_per_sample {flops:.0f}", flush=True)
    compiled = torch.compile(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, **({"fused": True} if device.type == "cuda" else {}))
    for step in range(1, args.steps + 1):
        first = (step - 1) % batches * args.batch_size
        with autocast:
            loss = transformer.loss_fn(compiled(inputs[first:first + args.batch_size]),
                                       targets[first:first + args.batch_size])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % args.log_every == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("loop", choices=["plain", "bare"])
    p.add_argument("--files", required=True)
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--log-every", type=int, required=True)
    p.add_argument("--workers", type=int, default=4)
    args = p.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print(f"{args.loop} loop on {device}: {transformer.describe()}", flush=True)
    torch.manual_seed(0)
    (plain if args.loop == "plain" else bare)(args, device)
    print("done", flush=True)


if __name__ == "__main__":
    main()
