# Drives 25,600 pipelined PRODUCEs of 128 B (100 rounds of 256, one
# message each, protocol version 4) against a broker on 127.0.0.1:17731,
# each message with a 16-byte dedup id (property 6), or with DEDUP=0
# without: what remembering and checking the ids costs, counted by
# callgrind.sh (`DRIVE=drive_dedup.py`). No FETCH: the ids' cost is the
# produce's.
import os, struct
from wire import Conn, frame
DEDUP=int(os.environ.get("DEDUP","1")); ROUNDS=100
s=Conn(4); recv_frames=s.recv_frames
topic=b"t"; payload=b"x"*128
n=0
for r in range(ROUNDS):
    fr=[]
    for i in range(256):
        props=struct.pack("<BH",6,16)+struct.pack("<QQ",7,n) if DEDUP else b""
        n+=1
        body=struct.pack("<H",1)+topic+b"\x00"+struct.pack("<I",1)+struct.pack("<H",len(props))+props+struct.pack("<I",len(payload))+payload
        fr.append(frame(0x10,i,body))
    s.sendall(b"".join(fr))
    for f in recv_frames(256): assert f[1]==0, f
print(n, "produces, dedup", DEDUP)
