#!/usr/bin/env python3
"""Reads TensorBoard event files without TensorFlow or a protobuf library, from the format
alone: TFRecord framing (uint64 length, uint32 masked CRC-32C of the length bytes, the data,
uint32 masked CRC-32C of the data; mask(c) = ((c >> 15) | (c << 17)) + 0xa282ead8, little
endian), each record a tensorflow.Event: wall_time (1, double), step (2, int64 varint),
file_version (3, string), summary (5, Summary: value (1, repeated Value: tag (1, string),
simple_value (2, float))). Fields it does not know are skipped by their wire type.

Usage: tfevents_read.py FILE...   prints "step tag value" per scalar (value as float32 repr),
                                  exit 1 with the reason on a damaged file
As a module: read_events(path) -> (file_version, [(step, {tag: value})]) in file order.
"""
import struct
import sys


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


class Damaged(Exception):
    pass


def records(blob):
    pos = 0
    while pos < len(blob):
        if pos + 12 > len(blob):
            raise Damaged("record at byte %d: truncated header (%d bytes left)" % (pos, len(blob) - pos))
        head = blob[pos:pos + 8]
        (n,) = struct.unpack("<Q", head)
        (crc_len,) = struct.unpack("<I", blob[pos + 8:pos + 12])
        if crc_len != masked(head):
            raise Damaged("record at byte %d: length CRC mismatch" % pos)
        data = blob[pos + 12:pos + 12 + n]
        if len(data) != n or pos + 16 + n > len(blob):
            raise Damaged("record at byte %d: truncated data" % pos)
        (crc_data,) = struct.unpack("<I", blob[pos + 12 + n:pos + 16 + n])
        if crc_data != masked(data):
            raise Damaged("record at byte %d: data CRC mismatch" % pos)
        yield data
        pos += 16 + n


def varint(buf, i):
    shift = value = 0
    while True:
        if i >= len(buf):
            raise Damaged("varint runs past the message")
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, i


def fields(buf):
    """(field number, wire type, value) of each field: int for varints, bytes otherwise."""
    i = 0
    while i < len(buf):
        key, i = varint(buf, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = varint(buf, i)
        elif wire == 1:
            value, i = buf[i:i + 8], i + 8
        elif wire == 2:
            n, i = varint(buf, i)
            value, i = buf[i:i + n], i + n
        elif wire == 5:
            value, i = buf[i:i + 4], i + 4
        else:
            raise Damaged("wire type %d is not expected here" % wire)
        if i > len(buf):
            raise Damaged("field %d runs past the message" % field)
        yield field, wire, value


def summary_values(buf):
    out = {}
    for field, wire, value in fields(buf):
        if field != 1 or wire != 2:
            continue
        tag, simple = None, None
        for f, w, v in fields(value):
            if f == 1 and w == 2:
                tag = v.decode("utf-8")
            elif f == 2 and w == 5:
                (simple,) = struct.unpack("<f", v)
        if tag is not None and simple is not None:
            out[tag] = simple
    return out


def read_events(path):
    blob = open(path, "rb").read()
    version, steps = None, []
    for data in records(blob):
        step, values = 0, None
        for field, wire, value in fields(data):
            if field == 2 and wire == 0:
                step = value - (1 << 64) if value >= 1 << 63 else value
            elif field == 3 and wire == 2:
                version = value.decode("utf-8")
            elif field == 5 and wire == 2:
                values = summary_values(value)
        if values is not None:
            steps.append((step, values))
    return version, steps


def main(paths):
    for path in paths:
        try:
            version, steps = read_events(path)
        except Damaged as e:
            print("%s: damaged: %s" % (path, e))
            return 1
        print("# %s: %s, %d steps" % (path, version, len(steps)))
        for step, values in steps:
            for tag, value in values.items():
                print(step, tag, repr(value))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
