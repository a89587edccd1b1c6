"""Protobuf by hand for the integration tests that send raw bytes (the
fault tests send malformed messages; the batching test wants no generated
stubs): varints and length-delimited / varint fields."""


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
