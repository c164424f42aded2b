# One connection to the broker callgrind.sh runs (127.0.0.1:$CALLGRIND_PORT, 17731 unless set), as
# the drivers speak it: framing, and replies read in order.
import os, socket, struct


class Conn:
    def __init__(self, version):
        self.s = socket.create_connection(("127.0.0.1", int(os.environ.get("CALLGRIND_PORT", "17731"))))
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.s.sendall(frame(1, 1, struct.pack("<HHH", 1, version, 0)))
        r = self.recv_frames(1)[0]
        assert r[1] == 0 and struct.unpack("<H", r[8:10])[0] == version, r

    def sendall(self, data):
        self.s.sendall(data)

    def recv_frames(self, k):
        out = []
        while len(out) < k:
            while len(self.buf) >= 4 and len(self.buf) >= 4 + struct.unpack("<I", self.buf[:4])[0]:
                n = struct.unpack("<I", self.buf[:4])[0]
                out.append(self.buf[4:4 + n]); self.buf = self.buf[4 + n:]
            if len(out) >= k:
                break
            self.buf += self.s.recv(1 << 20)
        return out


def frame(op, rid, body):
    return struct.pack("<IBBHI", 8 + len(body), op, 0, 0, rid) + body
