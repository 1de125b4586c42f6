#!/usr/bin/env python3
"""Turns the summary.json of tests/gpu/run into the seed table for docs/PERFORMANCE.md (markdown):
one row per setting (plain loop fp32, engine fp32, engine bf16, engine bf16 + compile, engine
fp16 + scaler, bare loop bf16 + compile) with samples/s, the ratio to the plain loop, GPU
utilisation and step time; then lines for the engine's step time against the bare loop, model
FLOP utilisation, the input stall, and the platform run. Plain Python: no torch needed.

Usage: tests/gpu/table.py SUMMARY.json [--out TABLE.md]
"""
import argparse
import json
import sys

ORDER = ["plain_fp32", "engine_fp32", "engine_bf16", "engine_bf16_compile", "engine_fp16", "bare_bf16_compile"]
LABELS = {
    "plain_fp32": "plain PyTorch loop, fp32 (DataLoader over files)",
    "engine_fp32": "pytorch-ddp engine, fp32",
    "engine_bf16": "engine, bf16",
    "engine_bf16_compile": "**engine, bf16 + compile**",
    "engine_fp16": "engine, fp16 + gradient scaler",
    "bare_bf16_compile": "bare loop, bf16 + compile, data on the GPU",
}


def number(value, digits=0, suffix=""):
    return "—" if value is None else f"{value:,.{digits}f}{suffix}"


def step(summary, name):
    return summary.get("steps", {}).get(name) or {}


def table(summary):
    environment = step(summary, "environment").get("result") or {}
    seed = step(summary, "seed_table")
    result = seed.get("result") or {}
    rows = {row.get("name"): row for row in result.get("rows", [])}
    lines = []
    gpu = environment.get("gpu_name") or "no GPU"
    lines.append(f"Measured by `tests/gpu/run` on {gpu} (driver {environment.get('driver') or '—'}), torch "
                 f"{environment.get('torch') or '—'}, CUDA {environment.get('torch_cuda') or '—'}, "
                 f"{summary.get('run', {}).get('started', '')}{' — DRY RUN on CPU, toy sizes' if summary.get('run', {}).get('dry_run') else ''}.")
    lines.append("")
    if result.get("model"):
        lines.append(f"Model: {result['model']}; batch {result.get('batch_size')} per step; "
                     f"{number(result.get('flops_per_sample', 0) / 1e9, 1)} GFLOP per sample ({result.get('flops_source')}).")
        lines.append("")
    if seed and seed.get("status") != "ok" and not rows:
        lines.append(f"The seed table did not run: {seed.get('status')}: {seed.get('reason') or '—'}.")
        return "\n".join(lines) + "\n"
    lines.append("| setting | samples/s | ratio to the plain loop | GPU utilisation | step time |")
    lines.append("|---|---|---|---|---|")
    for name in ORDER:
        row = rows.get(name)
        label = LABELS[name]
        if row is None:
            lines.append(f"| {label} | not run | | | |")
        elif row.get("status") != "ok":
            lines.append(f"| {label} | {row.get('status')}: {row.get('reason', '')} | | | |")
        else:
            ratio = row.get("ratio_to_plain")
            lines.append(f"| {label} | {number(row['samples_per_s'])} | {number(ratio, 2, 'x')} | "
                         f"{number(row.get('gpu_util_pct'), 0, '%')} | {number(row.get('step_ms'), 2, ' ms')} |")
    lines.append("")
    goals = result.get("goals", {})
    over_bare = goals.get("engine_step_over_bare")
    if over_bare:
        lines.append(f"- Engine step time against the bare loop (bf16 + compile): {over_bare['value']:+.1%} "
                     f"(goal: {over_bare['goal']}).")
    for name in ("engine_bf16_compile", "bare_bf16_compile"):
        row = rows.get(name, {})
        if row.get("mfu_vs_h200_bf16_peak") is not None:
            lines.append(f"- Model FLOP utilisation, {LABELS[name].strip('*')}: {row['mfu_vs_h200_bf16_peak']:.1%} of the "
                         f"H200's bf16 peak ({result.get('peak_bf16_flops', 0) / 1e12:.0f} TFLOP/s measured), "
                         f"{row.get('model_tflops')} TFLOP/s.")
    compiled = rows.get("engine_bf16_compile", {})
    if compiled.get("input_stall_share") is not None:
        lines.append(f"- Input stall, engine bf16 + compile ({compiled.get('decode_workers')} decode workers, prefetch "
                     f"{compiled.get('prefetch')}): {compiled['input_stall_share']:.2%} of the step time.")
    pipeline = step(summary, "input")
    measured = pipeline.get("result") or {}
    if measured.get("status") == "ok":
        lines.append(f"- Input pipeline with autotune on (engine bf16, batch {measured.get('batch_size')}): stall "
                     f"{number(100 * measured.get('input_stall_share', 0), 2, '%')} of the step time, "
                     f"{number(measured.get('samples_per_s'))} samples/s, GPU {number(measured.get('gpu_util_pct'), 0, '%')}, "
                     f"settled on {measured.get('input_workers')} workers x {measured.get('input_prefetch')} prefetch.")
    elif pipeline:
        lines.append(f"- Input pipeline with autotune on: {pipeline.get('status')}: {pipeline.get('reason') or '—'}.")
    platform = step(summary, "platform")
    if platform:
        detail = (platform.get("result") or {}).get("gpu")
        lines.append(f"- Through the platform (`trainyard dev` with this machine's GPUs, a pytorch-ddp job): {platform.get('status')}"
                     f"{': ' + platform['reason'] if platform.get('reason') else ''}"
                     f"{'; record: ' + detail if detail else ''}.")
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("summary")
    p.add_argument("--out")
    args = p.parse_args()
    with open(args.summary) as f:
        text = table(json.load(f))
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
