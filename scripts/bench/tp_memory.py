#!/usr/bin/env python3
"""Per-rank memory against the tensor-parallel size (docs/parallelism.md, BENCHMARKS.md): each
process (each MPI rank) runs in a memory cgroup of its own (cgroup v1 memory controller, root).

1. Unlimited: the peak charge (memory.max_usage_in_bytes: weights, KV, buffers and the page cache
   of the mapped file it touched) and the weight bytes each rank holds, at T = 1 and T = 2.
2. A limit between the two (default: the mean of T = 1's peak and T = 2's largest rank peak, or
   --limit): T = 1 under it is killed by the kernel; T = 2 with each rank under the same limit
   runs, and its greedy tokens equal the unlimited T = 2 run's.

  scripts/bench/tp_memory.py [-m MODEL] [--limit 450MiB]
MODEL defaults to the Qwen2.5-0.5B shapes at Q8_0 that scripts/peer/make_models.py writes.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INFERD = ROOT / "build" / "inferd"
CGROUP = Path("/sys/fs/cgroup/memory")
MPI = ["mpirun", "--oversubscribe", "--allow-run-as-root", "--mca", "btl", "self,vader", "--mca",
       "btl_vader_single_copy_mechanism", "none"]
WRAPPER = """#!/bin/sh
# LIMIT TAG COMMAND...: COMMAND in the memory cgroup inferd-TAG-RANK with LIMIT bytes
limit="$1"; tag="$2"; shift 2
cg=/sys/fs/cgroup/memory/inferd-$tag-${OMPI_COMM_WORLD_RANK:-0}
mkdir -p "$cg" && echo "$limit" > "$cg/memory.limit_in_bytes" && echo $$ > "$cg/cgroup.procs" || exit 99
exec "$@"
"""


def size(text):
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(KiB|MiB|GiB|)", text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text}: a size like 450MiB")
    return int(float(m.group(1)) * {"": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[m.group(2)])


def run(wrapper, model, ranks, limit, tag):
    for old in CGROUP.glob(f"inferd-{tag}-*"):
        old.rmdir()
    cmd = [str(INFERD), "run", "-m", model, "--prompt-ids", "1,2,3,4,5,6,7,8", "-n", "8", "-t", "1"]
    cmd = [wrapper, str(limit), tag] + cmd
    if ranks > 1:
        cmd = MPI + ["-np", str(ranks)] + cmd + ["--tensor-parallel-size", str(ranks)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    peaks, failed = [], []
    for r in range(ranks):
        cg = CGROUP / f"inferd-{tag}-{r}"
        peaks.append(int((cg / "memory.max_usage_in_bytes").read_text()))
        oom = (cg / "memory.oom_control").read_text()
        kills = re.search(r"^oom_kill (\d+)$", oom, re.M)
        failed.append(kills is not None and int(kills.group(1)) > 0)
        cg.rmdir()
    weights = [int(w) for w in re.findall(r"weight_bytes=(\d+)", p.stderr)]
    tokens = p.stdout.strip().splitlines()[0] if p.returncode == 0 and p.stdout.strip() else None
    return p.returncode, peaks, weights, tokens, failed


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=str(Path(os.environ.get("INFERD_PEER_DIR", Path.home() / ".cache/inferd-peer"))
                                                  / "models" / "qwen2.5-0.5b-shapes-q8_0.gguf"))
    ap.add_argument("--limit", type=size, help="the per-process limit of part 2")
    a = ap.parse_args()
    if not (CGROUP / "memory.limit_in_bytes").exists():
        sys.exit("tp_memory: needs the cgroup v1 memory controller at /sys/fs/cgroup/memory (and root)")
    if not Path(a.model).exists():
        sys.exit(f"tp_memory: {a.model}: no such file (scripts/peer/make_models.py --types q8_0 writes it)")
    mib = lambda b: f"{b / (1 << 20):.0f} MiB"  # noqa: E731
    with tempfile.NamedTemporaryFile("w", suffix=".sh", delete=False) as f:
        f.write(WRAPPER)
    os.chmod(f.name, 0o755)
    try:
        print(f"model {Path(a.model).name}, {mib(Path(a.model).stat().st_size)} on disk")
        rc1, peak1, w1, tok1, _ = run(f.name, a.model, 1, 1 << 40, "t1")
        rc2, peak2, w2, tok2, _ = run(f.name, a.model, 2, 1 << 40, "t2")
        assert rc1 == 0 and rc2 == 0, (rc1, rc2)
        print(f"T = 1: peak {mib(peak1[0])} (weights held: whole model)")
        for r in range(2):
            print(f"T = 2, rank {r}: peak {mib(peak2[r])}, weights held {mib(w2[r]) if r < len(w2) else '?'}")
        limit = a.limit or (peak1[0] + max(peak2)) // 2
        rc1l, _, _, tok1l, oom1 = run(f.name, a.model, 1, limit, "t1l")
        rc2l, _, _, tok2l, oom2 = run(f.name, a.model, 2, limit, "t2l")
        print(f"limit {mib(limit)} per process:")
        print(f"  T = 1: exit {rc1l}{' (killed by the kernel: out of memory)' if any(oom1) else ''}")
        print(f"  T = 2: exit {rc2l}{' (a rank killed: out of memory)' if any(oom2) else ''}, "
              f"tokens {'equal to' if tok2l == tok2 else 'NOT equal to'} the unlimited run's")
    finally:
        os.unlink(f.name)


if __name__ == "__main__":
    main()
