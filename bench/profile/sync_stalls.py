# The disk's own fdatasync stalls, with no broker: appends of SYNC_BYTES
# (default 200) to a fallocated file in SYNC_DIR (default the current
# directory), each followed by fdatasync, for SYNC_SECONDS (default 4), on
# core SYNC_CORE (default 0), while core BUSY_CORE spins (if set). Prints
# the syncs' p50, p99, longest and how many took over 10 ms: what sets a
# durable broker's p99 on this machine (bench/README.md, "Where the two
# targets stand"). Example: SYNC_CORE=1 python3 bench/profile/sync_stalls.py
import os, time

core = int(os.environ.get("SYNC_CORE", "0"))
busy = os.environ.get("BUSY_CORE")
size = int(os.environ.get("SYNC_BYTES", "200"))
seconds = float(os.environ.get("SYNC_SECONDS", "4"))
path = os.path.join(os.environ.get("SYNC_DIR", "."), "sync-stalls.tmp")

spinner = None
if busy is not None:
    spinner = os.fork()
    if spinner == 0:
        os.sched_setaffinity(0, {int(busy)})
        end = time.perf_counter() + seconds + 0.5
        while time.perf_counter() < end:
            pass
        os._exit(0)
os.sched_setaffinity(0, {core})
fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
try:
    os.posix_fallocate(fd, 0, 64 << 20)
    buf, lat, off = b"x" * size, [], 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        os.pwrite(fd, buf, off)
        off += size
        t = time.perf_counter_ns()
        os.fdatasync(fd)
        lat.append((time.perf_counter_ns() - t) / 1000)
finally:
    os.close(fd)
    os.remove(path)
    if spinner:
        os.waitpid(spinner, 0)
w = sorted(lat)
print(f"core {core}, busy core {busy}: {len(w)} syncs of {size} B in {seconds:.0f} s, "
      f"p50 {w[len(w) // 2]:.0f} us, p99 {w[int(len(w) * 0.99)]:.0f} us, longest {w[-1]:.0f} us, "
      f"{sum(1 for v in w if v > 10_000)} over 10 ms")
