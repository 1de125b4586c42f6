"""Input pipeline autotune: the decode workers and prefetch depth a training process's input
pipeline runs with, chosen from what the pipeline measures instead of set by hand, as tf.data's
AUTOTUNE and MindData's autotune do.

`Tuner` is the decision, pure: given what one measuring window saw (`Window`) and the process's
`Limits`, it returns the setting to measure next, or that it settled. No clock, no I/O: the
engine (train.py) measures windows (`WindowMeter`), combines them across ranks so that every rank
makes the same decisions, and rebuilds its loader at the next batch when the setting changes
(shards.BatchStream).

A window measures the two stages apart: the share of its time the training loop waited for a
batch (the stall), the batches it took per second, what training alone could take
(batches/s / (1 - stall)), and what the input stage can deliver: w workers / the mean seconds a
worker spends reading and decoding a batch (shards.DecodeTimes). The last does not move with
training's own speed, which varies with whatever else runs on the machine, so a raise of
workers is judged by it.

The rule, one window at a time:
1. A window measured right after a raise (a trial) is compared with the window before it. A
   raise of workers is kept when the input stage's batches/s rose by at least `min_gain` (the
   delivered batches/s when the input stage was not measured); a raise of prefetch, which adds
   no decoding, when the delivered batches/s rose by `min_gain`, or the stall fell by at least
   a quarter with batches/s not down by `min_gain` (workers that decode further ahead also
   take more of the cores training uses). Otherwise the setting goes back (the extra workers or buffers would cost CPU
   and memory for nothing) and that knob is done.
2. A stall share at or below `target_stall`: settled (the step no longer waits for its input).
3. Otherwise raise the next knob still open, workers first, then prefetch:
   - workers to as many as would deliver what training can take, with a tenth to spare
     (w x training / input batches/s; w / (1 - stall) when the input stage was not measured):
     at least +1, at most doubled (decoding stops scaling once the cores are busy), never above
     `max_workers`, and not when the window's CPU share is `cpu_full` or more: more workers
     would take the cores that training and the other workers already use;
   - prefetch doubled: deeper buffers absorb decode times that vary from batch to batch;
   both within `max_inflight`, the batches the memory budget holds (workers x prefetch).
4. Nothing left to raise: settled, on the best setting measured (a raise is kept only when it
   helped).
5. Settled because the stall was low, it keeps watching: a window whose stall is above
   `reopen_stall` (training got faster, the machine's other load went away, the data got
   heavier) opens the knobs again from where they are. Settled because raises stopped helping,
   it stays (raising again would only repeat the trials).

Each raise at least adds one and at most doubles, and a knob closes at its first raise that does
not help, so a round of tuning ends within max_workers + log2(max_inflight) + 2 windows, and
within a few windows in practice (1, 2, 4, ... workers); knobs only rise, so rounds are few.

Reading the limits (`process_cores`, `process_memory`, `shm_free`, `cpu_seconds`) is this
module's only I/O, kept out of the decision.
"""
import collections
import math
import os
import re

# A knob's highest value: the template's bounds of `workers` and `prefetch`.
MAX_WORKERS = 64
MAX_PREFETCH = 64
# Workers per core at most: a decode that waits on storage uses less than a core, and the
# measured CPU share stops raises before decoding that burns CPU oversubscribes the cores.
WORKERS_PER_CORE = 2
# The share of the process's memory that batches decoded ahead may take, and of the free
# /dev/shm (DataLoader workers hand batches over through shared memory; a container's is often
# small, 64 MiB by default under Docker).
PREFETCH_MEMORY_SHARE = 0.25
PREFETCH_SHM_SHARE = 0.5
# Where an `auto` knob starts: decode off the training thread, torch's default prefetch.
START = {"workers": 1, "prefetch": 2}

Setting = collections.namedtuple("Setting", "workers prefetch")
Setting.__doc__ = "Decode workers, and batches each keeps ready."

Window = collections.namedtuple("Window", "stall_share batches_per_second cpu_share input_batches_per_second",
                                defaults=(None,))
Window.__doc__ = """What one measuring window saw: the share of its time the training loop waited
for batches (0 to 1), the batches it trained on per second, the CPU seconds the process and its
decode workers used over the window's seconds times the process's cores (None: unknown), and
the batches per second the decode workers can deliver (None: unknown, or no workers)."""

Decision = collections.namedtuple("Decision", "setting settled reason")
Decision.__doc__ = "The setting to run (and measure) next, whether tuning is over, and why, in words."


class Limits(collections.namedtuple("Limits", "max_workers max_inflight")):
    """What the process's resources allow: decode workers, and batches decoded ahead at once
    over all workers (workers x prefetch)."""

    @classmethod
    def of(cls, cores, prefetch_memory, batch_bytes):
        """The limits of a process with `cores` cores and `prefetch_memory` bytes for batches
        decoded ahead, whose batches take `batch_bytes` each."""
        workers = min(MAX_WORKERS, max(1, math.floor(WORKERS_PER_CORE * cores)))
        return cls(workers, max(1, int(prefetch_memory // max(1, batch_bytes))))


class Tuner:
    """Hill climbing on measured throughput within limits (the module's rule). `knobs` are the
    ones to tune ("workers", "prefetch"); the others stay as `start` has them. Feed it every
    window measured at the setting it returned last."""

    def __init__(self, start, limits, knobs=("workers", "prefetch"), target_stall=0.05, min_gain=0.05,
                 cpu_full=0.9, reopen_stall=0.15):
        self.limits, self.target_stall, self.min_gain, self.cpu_full = limits, target_stall, min_gain, cpu_full
        self.reopen_stall = reopen_stall
        self.tuned = [k for k in ("workers", "prefetch") if k in knobs]
        workers, prefetch = start
        if "workers" in self.tuned:
            workers = min(workers, limits.max_workers)
        if "prefetch" in self.tuned:
            prefetch = max(1, min(prefetch, limits.max_inflight // max(1, workers)))
        self.setting = Setting(workers, prefetch)
        self._trial = None  # (setting before the raise, its window, the knob raised)
        self._open = self._knobs()
        self.settled, self._watching = not self._open, False

    def _knobs(self):
        # Prefetch means nothing without workers (unless they may rise).
        return [k for k in self.tuned
                if not (k == "prefetch" and self.setting.workers == 0 and "workers" not in self.tuned)]

    def observe(self, window):
        """The next decision, from a window measured at `self.setting`."""
        said = ""
        if self.settled:
            if not (self._watching and window.stall_share > self.reopen_stall):
                return Decision(self.setting, True, "settled")
            self.settled, self._watching, self._open = False, False, self._knobs()
            said = f"stall {window.stall_share:.0%} again, above {self.reopen_stall:.0%}: tuning again; "
        if self._trial is not None:
            before, before_window, knob = self._trial
            self._trial = None
            helped, measured = self._judged(knob, before_window, window)
            said = f"{knob} {getattr(self.setting, knob)} over {getattr(before, knob)}: {measured}"
            if helped:
                said += ", kept; "
            else:
                said += f", not enough: back to {getattr(before, knob)}; "
                self.setting = before
                self._open.remove(knob)
                window = before_window  # where we are again, and still stalled (or it would have settled)
        if window.stall_share <= self.target_stall:
            self._watching = True
            return self._settle(f"{said}stall {window.stall_share:.0%} at most {self.target_stall:.0%}")
        for knob in list(self._open):
            raised = self._raised(knob, window)
            if raised is None:
                self._open.remove(knob)
                continue
            self._trial = (self.setting, window, knob)
            before, self.setting = self.setting, raised
            return Decision(raised, False, f"{said}{stages(window)}: {knob} {getattr(before, knob)} -> "
                                           f"{getattr(raised, knob)}")
        return self._settle(f"{said}{stages(window)}; nothing left to raise within the limits {self._limits_text()}")

    def _judged(self, knob, before, after):
        """Whether a raise of `knob` helped, from the windows before and after it, and what
        was measured, in words."""
        def gain(old, new):
            return new / old - 1 if old > 0 else math.inf
        delivered = gain(before.batches_per_second, after.batches_per_second)
        if knob == "workers" and before.input_batches_per_second and after.input_batches_per_second:
            supply = gain(before.input_batches_per_second, after.input_batches_per_second)
            return supply >= self.min_gain, f"input stage {supply:+.0%} batches/s"
        if knob == "workers":
            return delivered >= self.min_gain, f"{delivered:+.0%} batches/s"
        less_stall = after.stall_share <= 0.75 * before.stall_share and delivered > -self.min_gain
        return (less_stall or delivered >= self.min_gain,
                f"stall {before.stall_share:.0%} -> {after.stall_share:.0%}, {delivered:+.0%} batches/s")

    def _settle(self, reason):
        self.settled = True
        return Decision(self.setting, True, reason)

    def _limits_text(self):
        return f"({self.limits.max_workers} workers, {self.limits.max_inflight} batches ahead)"

    def _raised(self, knob, window):
        """The setting with `knob` raised by the rule, or None when it cannot rise."""
        workers, prefetch = self.setting
        if knob == "workers":
            if window.cpu_share is not None and window.cpu_share >= self.cpu_full:
                return None
            stall, supply = window.stall_share, window.input_batches_per_second
            if supply and stall < 1:
                wanted = math.ceil(1.1 * workers * window.batches_per_second / (1 - stall) / supply)
            else:
                wanted = math.ceil(workers / (1 - stall)) if stall < 1 else 2 * workers
            more = min(max(workers + 1, min(2 * workers, wanted)), self.limits.max_workers)
            if "prefetch" in self.tuned:
                more = min(more, self.limits.max_inflight)
                prefetch = max(1, min(prefetch, self.limits.max_inflight // more))
            else:
                more = min(more, self.limits.max_inflight // max(1, prefetch))
            return Setting(more, prefetch) if more > workers else None
        if workers == 0:
            return None
        deeper = min(2 * prefetch, MAX_PREFETCH, self.limits.max_inflight // workers)
        return Setting(workers, deeper) if deeper > prefetch else None


def stages(window):
    """The stages' throughput as a window shows them, in words: what training took, what it
    could take alone ((1 - stall) of the time was its own), what the decode workers can deliver,
    and the CPU used."""
    rate = window.batches_per_second
    if rate <= 0:
        return f"stall {window.stall_share:.0%}"
    training = rate / max(1e-9, 1 - window.stall_share)
    supply = window.input_batches_per_second
    decode = f", decode workers {supply:.1f}" if supply else ""
    cpu = f"; CPU {window.cpu_share:.0%} of its cores" if window.cpu_share is not None else ""
    return f"stall {window.stall_share:.0%} ({rate:.1f} batches/s; training could take {training:.1f}{decode}{cpu})"


Counters = collections.namedtuple("Counters", "cpu_seconds decode_seconds decode_batches")
Counters.__doc__ = """Running totals a window takes differences of: CPU seconds used by the process
and its decode workers, seconds decode workers spent reading and decoding, and the batches they
made (each None when unknown)."""


class WindowMeter:
    """Measures windows for a `Tuner`, from times and counters the caller passes (no clock
    inside). A window runs from the end of a step to the end of a later one, so it holds whole
    batches and their waits; after a change of setting the first `warmup` batches are left out
    (the engine leaves out workers x prefetch: the new workers' first round, all asked for at
    once, arrives in a burst after training waited for it, and is not what they do after)."""

    def __init__(self, min_seconds, min_batches=8):
        self.min_seconds, self.min_batches = min_seconds, min_batches
        self.restart(0)

    def restart(self, warmup):
        self._skip, self.start, self._counters = warmup, None, None
        self.stall, self.batches = 0.0, 0

    def batch_taken(self, waited):
        """A batch arrived after the training loop waited `waited` seconds for it."""
        if self.start is None:
            self._skip -= 1
        else:
            self.stall += waited
            self.batches += 1

    def step_ended(self, now, counters):
        """An optimizer step ended at `now`, with the `Counters` then."""
        if self.start is None and self._skip <= 0:
            self.start, self._counters = now, counters

    def ready(self, now):
        return self.start is not None and self.batches >= self.min_batches and now - self.start >= self.min_seconds

    def window(self, now, counters, cores, workers):
        """The window from its start to `now`, the end of a step, with the `Counters` then, for
        a process with `cores` cores and `workers` decode workers."""
        seconds = max(now - self.start, 1e-9)

        def delta(name):
            old, new = getattr(self._counters, name), getattr(counters, name)
            return None if old is None or new is None else new - old
        cpu, decoding, decoded = delta("cpu_seconds"), delta("decode_seconds"), delta("decode_batches")
        cpu_share = cpu / (seconds * cores) if cpu is not None and cores > 0 else None
        supply = workers * decoded / decoding if workers > 0 and decoded and decoding else None
        return Window(min(1.0, self.stall / seconds), self.batches / seconds, cpu_share, supply)


# Reading the limits.

def read_text(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def cgroup_cpu_quota(root="/"):
    """The cores a cgroup CPU quota allows (cgroup v2 cpu.max, else v1 cpu.cfs_quota_us over
    cpu.cfs_period_us); None without a quota."""
    text = read_text(os.path.join(root, "sys/fs/cgroup/cpu.max"))
    if text:
        parts = text.split()  # "<quota> <period>", or "max <period>" without a quota
        return int(parts[0]) / int(parts[1]) if len(parts) == 2 and parts[0] != "max" else None
    for folder in ("cpu", "cpu,cpuacct"):
        quota = read_text(os.path.join(root, f"sys/fs/cgroup/{folder}/cpu.cfs_quota_us"))
        period = read_text(os.path.join(root, f"sys/fs/cgroup/{folder}/cpu.cfs_period_us"))
        if quota and period and int(quota) > 0 and int(period) > 0:
            return int(quota) / int(period)
    return None


def cgroup_memory_limit(root="/"):
    """The cgroup's memory limit in bytes (v2 memory.max, else v1 memory.limit_in_bytes); None
    without one (v1 reports 'none' as a huge number, which MemTotal then undercuts)."""
    for name in ("sys/fs/cgroup/memory.max", "sys/fs/cgroup/memory/memory.limit_in_bytes"):
        text = read_text(os.path.join(root, name))
        if text and text.strip().isdigit():
            return int(text)
    return None


def memory_total(root="/"):
    match = re.search(r"^MemTotal:\s+(\d+) kB", read_text(os.path.join(root, "proc/meminfo")) or "", re.MULTILINE)
    return int(match.group(1)) * 1024 if match else None


def quantity_bytes(text):
    """A Kubernetes-style memory quantity as the template writes it (`4Gi`, `512Mi`, `1000`) in
    bytes; None for empty or anything else."""
    match = re.fullmatch(r"\s*(\d+)(Ki|Mi|Gi|Ti)?\s*", text or "")
    if not match:
        return None
    return int(match.group(1)) * {None: 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}[match.group(2)]


def process_cores(replica_cpu=None, processes=1, root="/"):
    """The cores one of a replica's `processes` training processes may use: the fewest of the
    CPUs it may run on (sched_getaffinity), the cgroup's quota and the replica's `cpu`
    (None: not given), shared equally."""
    known = [len(os.sched_getaffinity(0)), cgroup_cpu_quota(root), replica_cpu]
    return min(c for c in known if c) / max(1, processes)


def process_memory(replica_memory=None, processes=1, root="/"):
    """The bytes of memory one of a replica's `processes` training processes may count on: the
    least of the cgroup's limit, the machine's memory and the replica's `memory` (None: not
    given), shared equally."""
    known = [cgroup_memory_limit(root), memory_total(root), replica_memory]
    known = [m for m in known if m]
    return min(known) // max(1, processes) if known else None


def shm_free(root="/"):
    """Free bytes in /dev/shm, where decode workers put the batches they hand over; None without it."""
    try:
        stat = os.statvfs(os.path.join(root, "dev/shm"))
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize


def prefetch_memory(memory, shm, processes=1):
    """Bytes batches decoded ahead may take in one process: a share of its memory and of the
    replica's free /dev/shm (None: unknown)."""
    budgets = [PREFETCH_MEMORY_SHARE * memory if memory else None,
               PREFETCH_SHM_SHARE * shm / max(1, processes) if shm else None]
    budgets = [b for b in budgets if b is not None]
    return min(budgets) if budgets else 1 << 30


def cpu_seconds(pids):
    """CPU seconds used so far by this process (all its threads) and by the processes `pids`
    (its decode workers), from os.times and /proc/<pid>/stat; a process gone meanwhile counts 0."""
    times = os.times()
    total, tick = times.user + times.system, os.sysconf("SC_CLK_TCK")
    for pid in pids:
        stat = read_text(f"/proc/{pid}/stat")
        if stat:
            fields = stat[stat.rindex(")") + 2:].split()
            total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return total
