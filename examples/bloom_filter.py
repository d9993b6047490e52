"""Score documents against a Bloom filter and a table of profile weights (the database
analytics workload of Xilinx's Vitis Bloom filter tutorial), streamed through the device.

Documents are runs of 32-bit words: a term id in the upper 24 bits, its frequency in the lower
8. A document's score is the sum of ``weights[term] × frequency`` over its words whose term
the Bloom filter may hold (two hash functions over ``2**BLOOM_BITS`` bits). The filter, the
weights and the document start offsets are resident arrays (``args=``: uploaded once, passed
to every launch); the words stream through in blocks, the data several times the memory
limit. The scores live in a writable resident table (``cv.resident(scores, writable=True)``)
copied back after the stream.

Documents straddle blocks. Each document is scored by one work item: the one at its first
word, or, for the document a block starts inside, the block's first work item, which scores
the rest of it in that block. Launches run one after another on the compute queue, so the
two halves of a straddling document add into its score in turn, never at once, and integer
scores (64-bit) make the answer exact: the same as the NumPy reference below, bit for bit.

The same scores also come from a two-kernel chain (``cv.chain``): the first link writes a
per-word flag (does the filter hold the word's term?) into a device-only temp, the second adds
up the flagged words' weights per document. The flags never cross the link: only the words go
in, and only the scores table comes back.

    python examples/bloom_filter.py [--mwords 64] [--terms 1048576] [--device SPEC]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

import conveyor as cv

BLOOM_BITS = 19  # bits in the filter: 2**19 bits = 16 K words of 32 bits
TERM_BITS = 24
HASH_1, HASH_2 = 0x9E3779B1, 0x85EBCA77  # multiplicative hashes (uint32 arithmetic)

SOURCE = cv.portable(f"""
#define BLOOM_BITS {BLOOM_BITS}
__kernel void score(__global const unsigned int *words, __global const unsigned int *bloom,
                    __global const unsigned int *weights, __global const ulong *starts,
                    __global ulong *scores, ulong docs, ulong offset, ulong n) {{
    ulong i = get_global_id(0);
    if (i >= n) return;
    ulong g = offset + i;
    ulong lo = 0, hi = docs;              /* the last document starting at or before g */
    while (hi - lo > 1) {{
        ulong mid = (lo + hi) / 2;
        if (starts[mid] <= g) lo = mid; else hi = mid;
    }}
    if (i != 0 && starts[lo] != g) return;  /* not a document's first word, nor the block's */
    ulong end = starts[lo + 1] < offset + n ? starts[lo + 1] : offset + n;
    ulong sum = 0;
    for (ulong j = g; j < end; j++) {{
        unsigned int word = words[j - offset];
        unsigned int term = word >> 8;
        unsigned int h1 = (term * {HASH_1}u) >> (32 - BLOOM_BITS);
        unsigned int h2 = ((term ^ 0x5bd1e995u) * {HASH_2}u) >> (32 - BLOOM_BITS);
        if (((bloom[h1 >> 5] >> (h1 & 31)) & 1u) && ((bloom[h2 >> 5] >> (h2 & 31)) & 1u))
            sum += (ulong)weights[term] * (word & 255u);
    }}
    scores[lo] += sum;
}}

/* The chain's first link: one flag per word, 1 where the filter may hold its term. */
__kernel void flag(__global const unsigned int *words, __global uchar *hits,
                   __global const unsigned int *bloom, ulong offset, ulong n) {{
    ulong i = get_global_id(0);
    if (i >= n) return;
    unsigned int term = words[i] >> 8;
    unsigned int h1 = (term * {HASH_1}u) >> (32 - BLOOM_BITS);
    unsigned int h2 = ((term ^ 0x5bd1e995u) * {HASH_2}u) >> (32 - BLOOM_BITS);
    hits[i] = (uchar)(((bloom[h1 >> 5] >> (h1 & 31)) & 1u) & ((bloom[h2 >> 5] >> (h2 & 31)) & 1u));
}}

/* The chain's second link: score() with the flags of the first link instead of the hashes. */
__kernel void score_flagged(__global const unsigned int *words, __global const uchar *hits,
                            __global const unsigned int *weights, __global const ulong *starts,
                            __global ulong *scores, ulong docs, ulong offset, ulong n) {{
    ulong i = get_global_id(0);
    if (i >= n) return;
    ulong g = offset + i;
    ulong lo = 0, hi = docs;
    while (hi - lo > 1) {{
        ulong mid = (lo + hi) / 2;
        if (starts[mid] <= g) lo = mid; else hi = mid;
    }}
    if (i != 0 && starts[lo] != g) return;
    ulong end = starts[lo + 1] < offset + n ? starts[lo + 1] : offset + n;
    ulong sum = 0;
    for (ulong j = g; j < end; j++) {{
        unsigned int word = words[j - offset];
        if (hits[j - offset]) sum += (ulong)weights[word >> 8] * (word & 255u);
    }}
    scores[lo] += sum;
}}
""")


def _hashes(terms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    terms = terms.astype(np.uint32)
    shift = np.uint32(32 - BLOOM_BITS)
    h1 = (terms * np.uint32(HASH_1)) >> shift
    h2 = ((terms ^ np.uint32(0x5BD1E995)) * np.uint32(HASH_2)) >> shift
    return h1, h2


def make_filter(profile_terms: np.ndarray) -> np.ndarray:
    """The Bloom filter (uint32 words) holding ``profile_terms``."""
    bloom = np.zeros(2**BLOOM_BITS // 32, np.uint32)
    for h in _hashes(profile_terms):
        np.bitwise_or.at(bloom, h >> 5, np.uint32(1) << (h & 31))
    return bloom


def make_documents(words: int, rng: np.random.Generator, terms: int
                   ) -> tuple[np.ndarray, np.ndarray]:
    """``words`` document words (term ids below ``terms``) and the start of each document
    (one more entry than documents: the last is ``words``); some documents are empty."""
    term = rng.integers(0, terms, words, dtype=np.uint32)
    frequency = rng.integers(1, 256, words, dtype=np.uint32)
    sizes = rng.integers(0, 400, words // 150 + 2)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    starts = np.minimum(starts[: np.searchsorted(starts, words) + 1], words)
    starts[-1] = words
    return (term << 8) | frequency, starts.astype(np.uint64)


def reference(words: np.ndarray, starts: np.ndarray, bloom: np.ndarray,
              weights: np.ndarray) -> np.ndarray:
    """The same scores with NumPy."""
    term = words >> 8
    h1, h2 = _hashes(term)
    hit = ((bloom[h1 >> 5] >> (h1 & 31)) & 1).astype(bool)
    hit &= ((bloom[h2 >> 5] >> (h2 & 31)) & 1).astype(bool)
    value = np.where(hit, weights[term].astype(np.uint64) * (words & 255), 0).astype(np.uint64)
    totals = np.concatenate([[0], np.cumsum(value, dtype=np.uint64)]).astype(np.uint64)
    return totals[starts[1:].astype(np.int64)] - totals[starts[:-1].astype(np.int64)]


def run(device: cv.Device, words: int, memory_limit: int, terms: int = 2**16,
        seed: int = 0, chain: bool = False) -> tuple[bool, cv.Report]:
    """Score ``words`` words of documents on ``device``; (exact against NumPy, report).
    ``chain=True`` scores them with the two-kernel chain (flags, then scores)."""
    rng = np.random.default_rng(seed)
    doc_words, starts = make_documents(words, rng, terms)
    bloom = make_filter(rng.choice(terms, terms // 8, replace=False).astype(np.uint32))
    weights = rng.integers(0, 2**20, terms, dtype=np.uint32)
    scores = np.zeros(len(starts) - 1, np.uint64)
    with cv.resident(scores, writable=True) as table:
        if chain:
            links = cv.chain(
                cv.link(device.compile(SOURCE, "flag"), reads="in0", writes="hits",
                        args=(bloom,)),
                cv.link(device.compile(SOURCE, "score_flagged"), reads=("in0", "hits"),
                        args=(weights, starts, table, len(scores))),
                temps={"hits": np.uint8})  # one flag per word, on the device only
            report = cv.stream(links, [doc_words], [], device=device,
                               memory_limit=memory_limit)
        else:
            report = cv.stream(device.compile(SOURCE, "score"), [doc_words], [],
                               device=device, memory_limit=memory_limit,
                               args=(bloom, weights, starts, table, len(scores)))
    return bool(np.array_equal(scores, reference(doc_words, starts, bloom, weights))), report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mwords", type=float, default=64, help="millions of document words")
    parser.add_argument("--terms", type=int, default=2**20,
                        help="distinct term ids (the weight table holds 4 bytes each)")
    parser.add_argument("--device", default=None)
    options = parser.parse_args(argv)
    device = cv.device(options.device)
    words = int(options.mwords * 1e6)
    if not 0 < options.terms <= 2**TERM_BITS:
        parser.error(f"--terms takes 1 to {2**TERM_BITS} (term ids are {TERM_BITS} bits)")
    # The words are 4x the memory limit, which also holds the resident tables.
    limit = words + 8 * options.terms + 2**22
    exact, report = run(device, words, memory_limit=limit, terms=options.terms)
    print(report)
    print(f"{words} words, scores exact against NumPy: {exact}")
    chained, report = run(device, words, memory_limit=limit, terms=options.terms, chain=True)
    print(report)
    print(f"{words} words, two-kernel chain (flags stay on the device), scores exact against "
          f"NumPy: {chained}")
    return 0 if exact and chained else 1


if __name__ == "__main__":
    sys.exit(main())
