# Drives a fixed load against a broker on 127.0.0.1:17731 (see callgrind.sh).
import os, struct, time
from wire import Conn, frame
# DRIVE_PAYLOAD_BYTES / DRIVE_ROUNDS change the load (default 128 B, 100 rounds).
PAYLOAD=int(os.environ.get("DRIVE_PAYLOAD_BYTES","128")); ROUNDS=int(os.environ.get("DRIVE_ROUNDS","100"))
s=Conn(1); recv_frames=s.recv_frames
topic=b"t"; payload=b"x"*PAYLOAD
body=struct.pack("<H",len(topic))+topic+struct.pack("<I",1)+struct.pack("<I",len(payload))+payload
t=time.time()
for r in range(ROUNDS):
    s.sendall(b"".join(frame(0x10,i,body) for i in range(256))); recv_frames(256)
print(ROUNDS*256, "pipelined produces", time.time()-t)
# fetch + ack
got=0
for r in range(ROUNDS):
    fb=struct.pack("<H",1)+b"t"+struct.pack("<IIII",256,0,0,0)
    s.sendall(frame(0x11,1,fb)); f=recv_frames(1)[0]
    # parse ids
    p=8; tl=struct.unpack("<H",f[p:p+2])[0]; p+=2+tl; cnt=struct.unpack("<I",f[p:p+4])[0]; p+=4; ids=[]
    for _ in range(cnt):
        mid=struct.unpack("<Q",f[p:p+8])[0]; p+=8+8+2; fl=f[p]; p+=1
        if fl&1: p+=11
        ln=struct.unpack("<I",f[p:p+4])[0]; p+=4+ln; ids.append(mid)
    got+=cnt
    ab=struct.pack("<H",1)+b"t"+struct.pack("<I",len(ids))+b"".join(struct.pack("<Q",i) for i in ids)
    s.sendall(frame(0x12,2,ab)); recv_frames(1)
print("fetched+acked", got, time.time()-t)
