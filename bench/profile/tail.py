# One message at a time against a runnel on 127.0.0.1:$TAIL_PORT (default
# 17732), then its loop-turn metrics from /metrics on $TAIL_METRICS_PORT
# (default 17733): what a stall in the loop comes from (bench/README.md,
# "The non-durable tail"). Each round is PRODUCE of one message, FETCH of
# one, ACK of it, each waiting for its reply: a depth-1 producer and
# consumer on one connection. TAIL_MESSAGES (default 200000) rounds of
# TAIL_PAYLOAD_BYTES (default 100).
import os, socket, struct, time, urllib.request

PORT = int(os.environ.get("TAIL_PORT", "17732"))
METRICS = int(os.environ.get("TAIL_METRICS_PORT", "17733"))
N = int(os.environ.get("TAIL_MESSAGES", "200000"))
PAYLOAD = b"x" * int(os.environ.get("TAIL_PAYLOAD_BYTES", "100"))

s = socket.create_connection(("127.0.0.1", PORT))
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
buf = b""


def frame(op, rid, body):
    return struct.pack("<IBBHI", 8 + len(body), op, 0, 0, rid) + body


def recv_frame():
    global buf
    while len(buf) < 4 or len(buf) < 4 + struct.unpack("<I", buf[:4])[0]:
        buf += s.recv(1 << 16)
    n = struct.unpack("<I", buf[:4])[0]
    f, buf = buf[4 : 4 + n], buf[4 + n :]
    return f


topic = struct.pack("<H", 1) + b"t"
produce = frame(0x10, 1, topic + struct.pack("<II", 1, len(PAYLOAD)) + PAYLOAD)
fetch = frame(0x11, 2, topic + struct.pack("<IIII", 1, 0, 0, 0))
s.sendall(frame(1, 0, struct.pack("<HHH", 1, 1, 0)))
recv_frame()
worst, started = 0.0, time.time()
for i in range(N):
    t = time.perf_counter()
    s.sendall(produce)
    recv_frame()
    s.sendall(fetch)
    f = recv_frame()
    p = 8 + 2 + 1
    assert struct.unpack("<I", f[p : p + 4])[0] == 1, "FETCH found no message"
    msg_id = struct.unpack("<Q", f[p + 4 : p + 12])[0]
    s.sendall(frame(0x12, 3, topic + struct.pack("<IQ", 1, msg_id)))
    recv_frame()
    worst = max(worst, time.perf_counter() - t)
print(f"{N} rounds in {time.time() - started:.1f} s; slowest round {worst * 1e3:.2f} ms")
text = urllib.request.urlopen(f"http://127.0.0.1:{METRICS}/metrics").read().decode()
for line in text.splitlines():
    if line.startswith(("runnel_loop_slow_turns_total", "runnel_loop_turns_total")) or (
        line.startswith(("runnel_loop_turn_duration_seconds", "runnel_loop_phase_duration_seconds"))
        and ("le=\"0.001\"" in line or "le=\"+Inf\"" in line or "_sum" in line)
    ):
        print(line)
