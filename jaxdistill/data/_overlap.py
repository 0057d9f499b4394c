"""Which images of one set also appear in another (equal pixels, to rounding): the public/private overlap check.

A public set (FedMD's, the labeling pipeline's D_pub and D_eval) must not hold private records: the privacy
statements treat public data as fixed while a private record is added or removed, and a public copy of that
record is released whole.
"""

from __future__ import annotations

import numpy as np

__all__ = ["shared_images", "first_copies"]

_CHUNK = 4096  # rows hashed at a time (a 4096 x D uint64 temporary)


#: Pixels in [0, 1] are compared on a grid of 1 / (255 * 16): the 8-bit values b / 255 are its points 16 b, so
#: two scalings of one byte image (x / 255 and x * (1 / 255) differ in the last bit for 126 of the 256 bytes) agree.
_GRID = 255 * 16


def _words(images: np.ndarray) -> np.ndarray:
  """``[N, D]`` int32: each pixel's nearest multiple of 1 / ``_GRID`` (pixels in [0, 1], as ImageData holds).

  Equal float32 bytes were required: a private record scaled the other common way (1 ulp apart in
  half its pixels) passed as a public image, and so did one with a -0.0 pixel until it was normalised.
  """
  x = np.asarray(images, dtype=np.float32).reshape(len(images), -1)
  return np.rint(x * np.float32(_GRID)).astype(np.int32)  # -0.0 rounds to 0


def _keys(words: np.ndarray) -> np.ndarray:
  """``[N]`` uint64 keys: sum_i w_i a_i mod 2^64 with fixed odd weights; equal rows, equal keys."""
  weights = np.random.default_rng(words.shape[1]).integers(0, 2**63, words.shape[1], dtype=np.uint64)
  weights = weights * np.uint64(2) + np.uint64(1)
  out = np.empty(len(words), np.uint64)
  for start in range(0, len(words), _CHUNK):
    out[start:start + _CHUNK] = words[start:start + _CHUNK].astype(np.uint64) @ weights  # wraps mod 2^64
  return out


def shared_images(images: np.ndarray, others: np.ndarray) -> np.ndarray:
  """bool ``[N]``: which of ``images`` ``[N, H, W, C]`` also appear among ``others`` (equal on the grid).

  Exact: rows are matched by a vectorised 64-bit hash, then every candidate is compared pixel by pixel
  with the rows of ``others`` sharing its hash (about 0.1 s for Fashion-MNIST's 10,000 test images
  against its 60,000 training images on one CPU core).
  """
  images, others = np.asarray(images), np.asarray(others)
  found = np.zeros(len(images), bool)
  if not len(images) or not len(others) or images.shape[1:] != others.shape[1:]:
    return found
  a, b = _words(images), _words(others)
  ka, kb = _keys(a), _keys(b)
  candidates = np.flatnonzero(np.isin(ka, kb))
  if not candidates.size:
    return found
  order = np.argsort(kb, kind="stable")
  sorted_keys = kb[order]
  lo = np.searchsorted(sorted_keys, ka[candidates], "left")
  hi = np.searchsorted(sorted_keys, ka[candidates], "right")
  # Most candidates have one row of that key: compare them all at once, then any others of a shared key.
  for start in range(0, candidates.size, _CHUNK):
    part = slice(start, start + _CHUNK)
    found[candidates[part]] = (a[candidates[part]] == b[order[lo[part]]]).all(axis=1)
  for i, start, stop in zip(candidates, lo, hi):
    if not found[i] and stop - start > 1:
      found[i] = any(np.array_equal(a[i], b[j]) for j in order[start + 1:stop])
  return found


def first_copies(images: np.ndarray) -> np.ndarray:
  """int ``[N]``: for each of ``images`` ``[N, ...]``, the index of the first image equal to it on the grid.

  ``first_copies(x)[i] == i`` for an image that occurs once (or first): duplicates within one set, which a split
  of it must keep on one side. Exact, as :func:`shared_images` (a hash, then pixel comparisons within a hash).
  """
  images = np.asarray(images)
  first = np.arange(len(images))
  if len(images) < 2:
    return first
  words = _words(images)
  keys = _keys(words)
  order = np.argsort(keys, kind="stable")  # equal keys in index order
  sorted_keys = keys[order]
  starts = np.flatnonzero(np.r_[True, sorted_keys[1:] != sorted_keys[:-1]])
  stops = np.r_[starts[1:], len(order)]
  for start, stop in zip(starts[stops - starts > 1], stops[stops - starts > 1]):
    rows = order[start:stop]
    for j, i in enumerate(rows):
      for earlier in rows[:j]:
        if first[earlier] == earlier and np.array_equal(words[i], words[earlier]):
          first[i] = earlier
          break
  return first
