// Rank-BPE merge loops (see bpe.h).
#include "tokenizer/bpe.h"

#include <algorithm>
#include <array>
#include <climits>
#include <cstdint>
#include <queue>

namespace wren {

namespace {

constexpr size_t kScanMax = 256;  // pieces up to this many bytes use the simple scan
constexpr int kNoRank = INT_MAX;

int rank_or_none(const RankTable& ranks, std::string_view bytes) {
  const int r = ranks.find(bytes);
  return r == RankTable::kNone ? kNoRank : r;
}

/// Emits the ranks of the parts delimited by `starts` (ascending byte offsets, then the end).
template <class Starts>
void emit_parts(const RankTable& ranks, std::string_view piece, const Starts& starts, size_t n,
                std::vector<int>& out) {
  for (size_t i = 0; i + 1 < n; ++i)
    out.push_back(ranks.find(piece.substr(starts[i], starts[i + 1] - starts[i])));
}

}  // namespace

namespace {

/// The O(n^2) merge on fixed buffers (no allocation); n = piece.size() <= kScanMax.
void scan_merge(const RankTable& ranks, std::string_view piece, std::vector<int>& out) {
  // start[i]: byte offset of part i (start[m] = end); pair[i]: rank of parts i and i+1 merged.
  std::array<uint32_t, kScanMax + 1> start;
  std::array<int, kScanMax> pair;
  size_t m = piece.size();  // number of parts
  for (size_t i = 0; i <= m; ++i) start[i] = uint32_t(i);
  auto pair_rank = [&](size_t i) {
    return i + 2 <= m ? rank_or_none(ranks, piece.substr(start[i], start[i + 2] - start[i])) : kNoRank;
  };
  for (size_t i = 0; i < m; ++i) pair[i] = pair_rank(i);
  while (m > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < m; ++i)
      if (pair[i] < pair[best]) best = i;
    if (pair[best] == kNoRank) break;
    std::copy(start.begin() + best + 2, start.begin() + m + 1, start.begin() + best + 1);
    std::copy(pair.begin() + best + 2, pair.begin() + m, pair.begin() + best + 1);
    --m;
    pair[best] = pair_rank(best);
    if (best > 0) pair[best - 1] = pair_rank(best - 1);
  }
  emit_parts(ranks, piece, start, m + 1, out);
}

}  // namespace

void bpe_encode_scan(const RankTable& ranks, std::string_view piece, std::vector<int>& out) {
  if (piece.size() <= kScanMax) return scan_merge(ranks, piece, out);
  // Long pieces: the same algorithm on heap buffers (used by tests only; bpe_encode takes the heap path).
  std::vector<uint32_t> start(piece.size() + 1);
  for (size_t i = 0; i <= piece.size(); ++i) start[i] = uint32_t(i);
  std::vector<int> pair(piece.size(), kNoRank);
  auto pair_rank = [&](size_t i) {
    return i + 2 < start.size() ? rank_or_none(ranks, piece.substr(start[i], start[i + 2] - start[i]))
                                : kNoRank;
  };
  for (size_t i = 0; i + 1 < start.size(); ++i) pair[i] = pair_rank(i);
  while (start.size() > 2) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < start.size(); ++i)
      if (pair[i] < pair[best]) best = i;
    if (pair[best] == kNoRank) break;
    start.erase(start.begin() + best + 1);
    pair.erase(pair.begin() + best + 1);
    pair[best] = pair_rank(best);
    if (best > 0) pair[best - 1] = pair_rank(best - 1);
  }
  emit_parts(ranks, piece, start, start.size(), out);
}

void bpe_encode_heap(const RankTable& ranks, std::string_view piece, std::vector<int>& out) {
  const size_t n = piece.size();
  // Parts form a linked list over their first byte index; a part ends where its next begins.
  std::vector<uint32_t> next(n), prev(n);
  std::vector<bool> alive(n, true);
  for (size_t i = 0; i < n; ++i) next[i] = uint32_t(i + 1), prev[i] = uint32_t(i - 1);
  auto end_of = [&](uint32_t i) { return next[i]; };  // next[i] == n for the last part
  struct Cand {
    int rank;
    uint32_t left, end;  // pair = bytes [left, end)
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push_pair = [&](uint32_t i) {
    if (next[i] >= n) return;
    const uint32_t e = end_of(next[i]);
    const int r = rank_or_none(ranks, piece.substr(i, e - i));
    if (r != kNoRank) heap.push({r, i, e});
  };
  for (uint32_t i = 0; i + 1 < n; ++i) push_pair(i);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    if (!alive[c.left] || next[c.left] >= n || end_of(next[c.left]) != c.end) continue;  // stale
    const uint32_t j = next[c.left];
    alive[j] = false;
    next[c.left] = next[j];
    if (next[j] < n) prev[next[j]] = c.left;
    push_pair(c.left);
    if (c.left > 0) push_pair(prev[c.left]);
  }
  std::vector<uint32_t> starts;
  for (uint32_t i = 0; i < n; i = next[i]) starts.push_back(i);
  starts.push_back(uint32_t(n));
  emit_parts(ranks, piece, starts, starts.size(), out);
}

void bpe_encode(const RankTable& ranks, std::string_view piece, std::vector<int>& out) {
  const int whole = ranks.find(piece);
  if (whole != RankTable::kNone) {
    out.push_back(whole);
    return;
  }
  if (piece.size() <= kScanMax) bpe_encode_scan(ranks, piece, out);
  else bpe_encode_heap(ranks, piece, out);
}

}  // namespace wren
