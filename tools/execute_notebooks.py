"""Re-execute the course's notebooks in place, each top to bottom in a fresh kernel.

    python tools/execute_notebooks.py                                 # every chapter of the source edition
    python tools/execute_notebooks.py notebooks/solutions/01_*.ipynb  # some of them

The source edition (notebooks/solutions/, the chapters with their answers) is the one executed; the
learner edition (notebooks/) is generated from it afterwards by tools/editions.py, never executed here.
Each kernel runs with one thread (OMP_NUM_THREADS=1) in the notebook's folder, so the stored
outputs are the ones nbval will see in CI. Prints each notebook's wall time and its kernel's peak
memory (VmHWM, the kernel process's high-water resident set), and stops at the first error.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

import nbformat
from nbclient import NotebookClient

ROOT = pathlib.Path(__file__).resolve().parents[1]


def kernel_peak_mib(client: NotebookClient) -> float:
    """The kernel process's peak resident memory in MiB (Linux), read before the kernel stops."""
    pid = client.km.provisioner.process.pid  # type: ignore[union-attr]
    for line in pathlib.Path(f"/proc/{pid}/status").read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def kernel_cpu_seconds(client: NotebookClient) -> float:
    """The kernel process's CPU time (user + system) so far, in seconds (Linux); wall time on a shared
    machine overstates what a chapter costs, CPU time does not."""
    pid = client.km.provisioner.process.pid  # type: ignore[union-attr]
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace").rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def execute(path: pathlib.Path, timeout: int = 600) -> tuple[float, float]:
    notebook = nbformat.read(path, as_version=4)
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["MKL_NUM_THREADS"] = "1"
    start = time.perf_counter()
    client = NotebookClient(
        notebook,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
    )
    with client.setup_kernel():
        client.execute(cleanup_kc=False)
        elapsed = time.perf_counter() - start
        peak = kernel_peak_mib(client)
        cpu = kernel_cpu_seconds(client)
        print(f"{path.name}: kernel CPU time {cpu:.1f} s", flush=True)
    # tools/chapter_times.py states each chapter's time from this measurement: the kernel's CPU time, which on one
    # thread is what the chapter costs a learner's quiet machine (wall time on a busy one overstates it: chapter 10
    # recorded 677 s of wall time beside other jobs, and 162 s of CPU, 195 s of wall time, run again alone)
    notebook.metadata.setdefault("transformer_lab", {})["kernel_seconds"] = round(cpu)
    nbformat.write(notebook, path)
    return elapsed, peak


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebooks", nargs="*", type=pathlib.Path, help="notebooks to run (default: all)")
    args = parser.parse_args(argv)
    paths = args.notebooks or sorted((ROOT / "notebooks" / "solutions").glob("[0-9][0-9]_*.ipynb"))
    for path in paths:
        print(f"{path.name}: running...", flush=True)
        elapsed, peak = execute(path.resolve())
        print(f"{path.name}: {elapsed:.1f} s, kernel peak memory {peak:.0f} MiB", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
