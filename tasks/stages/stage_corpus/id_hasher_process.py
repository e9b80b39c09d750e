"""The sentence-id helper process (:mod:`.id_hasher`), run as a script: it reads batches of texts from stdin
(a header, the int64 offsets, the UTF-8 bytes) and writes each text's blake2b-128 digest to stdout, in order,
until stdin ends. It imports nothing but the standard library, so it starts in milliseconds."""

import hashlib
import struct
import sys
from itertools import pairwise
from typing import BinaryIO

HEADER = struct.Struct("<QQ")  # texts in the batch, bytes of UTF-8 text
DIGEST_BYTES = 16


def serve(source: BinaryIO, sink: BinaryIO) -> None:
    blake2b = hashlib.blake2b
    while header := source.read(HEADER.size):
        count, size = HEADER.unpack(header)
        offsets = memoryview(source.read(8 * (count + 1))).cast("q").tolist()
        text = memoryview(source.read(size))
        digests = [blake2b(text[a:b], digest_size=DIGEST_BYTES).digest() for a, b in pairwise(offsets)]
        sink.write(b"".join(digests))
        sink.flush()


if __name__ == "__main__":
    serve(sys.stdin.buffer, sys.stdout.buffer)
