"""Protobuf by hand for the integration tests that send raw bytes (the
fault tests send malformed messages; the batching test wants no generated
stubs; the cluster harness reads a message it has no .proto for): varints
and length-delimited / varint fields, and a decoder of one message's
fields."""


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field_bytes(num, data):
    return varint(num << 3 | 2) + varint(len(data)) + data


def field_int(num, v):
    return varint(num << 3) + varint(v)


def decode(buf):
    """{field: [values]}: ints for varints, bytes for length-delimited."""
    out = {}
    i = 0
    while i < len(buf):
        tag, i = read_varint(buf, i)
        f, wt = tag >> 3, tag & 7
        if wt == 0:
            v, i = read_varint(buf, i)
        elif wt == 2:
            n, i = read_varint(buf, i)
            v = buf[i:i + n]
            i += n
        elif wt == 1:
            v = buf[i:i + 8]
            i += 8
        elif wt == 5:
            v = buf[i:i + 4]
            i += 4
        else:
            raise ValueError("wire type %d" % wt)
        out.setdefault(f, []).append(v)
    return out


def read_varint(buf, i):
    x = shift = 0
    while True:
        b = buf[i]
        i += 1
        x |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return x, i
