"""A Kaimon extension's view of the bus: a libzmq SUB socket that
prefix-subscribes, receives two-frame messages and deserializes each
payload the way Julia's Serialization does, for the subset of tags a
NamedTuple of three Strings uses. Prints one JSON line per message:
{"topic", "channel", "data", "session_name"}.

usage: python3 kaimon_sub.py <address> <prefix>
"""
import json
import struct
import sys

import zmq

SYMBOL, DATATYPE, TUPLE, MODULE, STRING = 0x01, 0x10, 0x14, 0x1F, 0x21
SHORTBACKREF, LONGSTRING, OBJECT, SHARED_REF = 0x2C, 0x30, 0x34, 0x39
EMPTY_TUPLE, NOTHING, SYM_TUPLE, SYM_CORE = 0x44, 0x4E, 0x53, 0x9B


class Reader:
    def __init__(self, b):
        self.b, self.i, self.refs = b, 0, []

    def byte(self):
        v = self.b[self.i]
        self.i += 1
        return v

    def take(self, n):
        v = self.b[self.i:self.i + n]
        if len(v) != n:
            raise ValueError("truncated")
        self.i += n
        return v

    def header(self):
        h = self.take(8)
        if h[:3] != b"7JL" or h[4] != 0x04:
            raise ValueError("bad header %r" % h)

    def symbol(self):
        n = self.byte()
        s = self.take(n).decode()
        if n > 7:
            self.refs.append(s)
        return s

    def module(self):
        t = self.byte()
        if t != MODULE:
            raise ValueError("module tag %#x" % t)
        path = []
        while True:
            t = self.byte()
            if t == EMPTY_TUPLE:
                return path
            if t == NOTHING:
                continue
            if t == SYM_CORE:
                path.append("Core")
            elif t == SYMBOL:
                path.append(self.symbol())
            else:
                raise ValueError("module tag %#x" % t)

    def datatype(self):
        slot = len(self.refs)
        self.refs.append(None)
        t = self.byte()
        if t == SYM_TUPLE:
            name = "Tuple"
        elif t == SYMBOL:
            name = self.symbol()
        else:
            raise ValueError("datatype name tag %#x" % t)
        self.module()
        (n,) = struct.unpack("<i", self.take(4))
        params = [self.value() for _ in range(n)]
        self.refs[slot] = (name, params)
        return (name, params)

    def value(self):
        t = self.byte()
        if t == 0x00:
            return ("type", self.byte())
        if t == SYMBOL:
            return self.symbol()
        if t == TUPLE:
            n = self.byte()
            return tuple(self.value() for _ in range(n))
        if t == DATATYPE:
            return self.datatype()
        if t == STRING:
            return self.take(self.byte()).decode()
        if t == LONGSTRING:
            (n,) = struct.unpack("<q", self.take(8))
            return self.take(n).decode()
        if t == SHARED_REF:
            v = self.value()
            self.refs.append(v)
            return v
        if t == SHORTBACKREF:
            (slot,) = struct.unpack("<H", self.take(2))
            return self.refs[slot]
        if t == OBJECT:
            name, params = self.value()
            if name != "NamedTuple":
                raise ValueError("object of type %s" % name)
            names = params[0]
            return {n: self.value() for n in names}
        raise ValueError("tag %#x at %d" % (t, self.i - 1))


def deserialize(b):
    r = Reader(b)
    r.header()
    v = r.value()
    if r.i != len(b):
        raise ValueError("%d trailing bytes" % (len(b) - r.i))
    return v


def main():
    address, prefix = sys.argv[1], sys.argv[2]
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    # libzmq's default receive high-water mark (1000 messages), as a Kaimon
    # extension's ZMQ.jl socket has: once that many wait, libzmq stops
    # reading the connection until half are taken.
    sub.setsockopt(zmq.RCVHWM, 1000)
    sub.setsockopt(zmq.RECONNECT_IVL, 50)
    sub.connect(address)
    sub.setsockopt(zmq.SUBSCRIBE, prefix.encode())
    print(json.dumps({"ready": True}), flush=True)
    while True:
        frames = sub.recv_multipart()
        if len(frames) != 2:
            print(json.dumps({"error": "%d frames" % len(frames)}), flush=True)
            continue
        try:
            nt = deserialize(frames[1])
        except Exception as e:  # report, never die
            print(json.dumps({"error": str(e)}), flush=True)
            continue
        out = {"topic": frames[0].decode()}
        out.update(nt)
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
