"""CPU accounting for the Python benches, computed as the Rust benches compute it
(``hmc_bench_kit::cpu``): the user and system CPU time of every process taking part in a
measured section, every thread included, from the processes' own accounting
(``/proc/PID/stat``), per GiB moved and per operation.

    from _cpu import cpu_seconds, family_pids, group_pids, per_gib, per_op_us

Each bench driver imports it from its own folder (the script's folder is first on
``sys.path``).
"""

import os

GIB = 1 << 30

NOTE = ("CPU-s/GiB and CPU us/op: user and system CPU time of every process taking part "
        "(every thread, from /proc/PID/stat), over the measured loop, per GiB moved and per "
        "operation.")


def cpu_seconds(pids):
    """User and system CPU of the processes ``pids`` so far, every thread included (their
    own accounting, ``/proc/PID/stat``); a process gone counts 0."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / tick


def group_pids(pgid):
    """The processes of process group ``pgid``."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[2]) == pgid:
                        out.append(int(d))
            except (OSError, ValueError, IndexError):
                continue
    return out


def family_pids(pid):
    """``pid`` and every process below it (its children, theirs, ...), as they are now."""
    parent = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    parent[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(c for c, pp in parent.items() if pp == p)
    return out


def per_gib(cpu_s, nbytes):
    """CPU-seconds per GiB for ``cpu_s`` CPU-seconds over ``nbytes`` moved (None for none)."""
    return cpu_s / (nbytes / GIB) if nbytes else None


def per_op_us(cpu_s, ops):
    """CPU-microseconds per operation (None for no operations)."""
    return cpu_s * 1e6 / ops if ops else None


def cell(v, decimals):
    """A table cell: ``v`` with ``decimals`` decimals, ``-`` for None."""
    return "-" if v is None else f"{v:.{decimals}f}"
