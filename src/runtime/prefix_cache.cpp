// Prefix cache of sequence-state snapshots (see prefix_cache.h).
#include "runtime/prefix_cache.h"

#include <algorithm>

#include "core/error.h"
#include "core/hash.h"

namespace wren {

namespace {
uint64_t key_of(const int* ids, size_t n) { return fnv1a64(ids, n * sizeof(int)); }
}  // namespace

size_t PrefixCache::Entry::bytes() const {
  return sizeof(Entry) + tokens.size() * sizeof(int) + data.size() * sizeof(float) +
         mla_lengths.size() * sizeof(int) + logits.size() * sizeof(float);
}

PrefixCache::PrefixCache(size_t budget_bytes, int interval) : budget_(budget_bytes), interval_(interval) {
  check(interval >= 1, "prefix cache: the snapshot interval must be at least 1 token");
  stats_.budget = budget_;
}

PrefixCacheStats PrefixCache::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_;
}

int PrefixCache::restore(SequenceState& st, const std::vector<int>& tokens, std::vector<float>* last_logits) {
  std::lock_guard<std::mutex> lk(mu_);
  ++stats_.lookups;
  const int n = int(tokens.size());
  if (lru_.empty() || n == 0) return 0;
  // Candidate lengths, longest first; each is hashed once (FNV-1a runs on, prefix by prefix).
  std::vector<int> cands;
  for (auto it = lengths_.rbegin(); it != lengths_.rend(); ++it)
    if (it->first <= n && it->first <= st.capacity()) cands.push_back(it->first);
  if (cands.empty()) return 0;
  std::vector<uint64_t> h(size_t(cands.front()) + 1);
  h[0] = kFnv1a64Offset;
  for (int i = 0; i < cands.front(); ++i) h[size_t(i) + 1] = fnv1a64(&tokens[size_t(i)], sizeof(int), h[size_t(i)]);
  for (const int L : cands) {
    const bool full = L == n;
    if (full && !last_logits) continue;
    auto [b, e] = index_.equal_range(h[size_t(L)]);
    for (auto it = b; it != e; ++it) {
      Entry& en = *it->second;
      if (int(en.tokens.size()) != L || (full && en.logits.empty())) continue;
      if (!std::equal(en.tokens.begin(), en.tokens.end(), tokens.begin())) continue;  // a collision: not ours
      st.load(en.data, en.mla_lengths, en.tokens);
      if (full) *last_logits = en.logits;
      lru_.splice(lru_.begin(), lru_, it->second);  // most recently used
      ++stats_.hits;
      stats_.cached_tokens += uint64_t(L);
      return L;
    }
  }
  return 0;
}

void PrefixCache::store(const SequenceState& st, const float* logits, int V) {
  if (budget_ == 0 || !st.replayable() || st.position() == 0) return;
  const std::vector<int>& tokens = st.history();
  if (int(tokens.size()) != st.position()) return;  // the log does not describe the state
  const uint64_t key = key_of(tokens.data(), tokens.size());
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto [b, e] = index_.equal_range(key);
    for (auto it = b; it != e; ++it) {
      Entry& en = *it->second;
      if (en.tokens != tokens) continue;
      lru_.splice(lru_.begin(), lru_, it->second);
      if (logits && en.logits.empty()) {
        en.logits.assign(logits, logits + V);
        stats_.bytes += size_t(V) * sizeof(float);
        evict_to(budget_);
      }
      return;
    }
  }
  Entry en{key, tokens, {}, {}, {}};
  st.save(en.data, en.mla_lengths);  // outside the lock: the copy is the slow part
  if (logits) en.logits.assign(logits, logits + V);
  const size_t bytes = en.bytes();
  std::lock_guard<std::mutex> lk(mu_);
  if (bytes > budget_) return;  // larger than the whole cache
  // Another thread may have stored the same ids meanwhile: keep one.
  auto [b, e] = index_.equal_range(key);
  for (auto it = b; it != e; ++it)
    if (it->second->tokens == tokens) return;
  evict_to(budget_ - bytes);
  lru_.push_front(std::move(en));
  index_.emplace(key, lru_.begin());
  ++lengths_[int(tokens.size())];
  stats_.bytes += bytes;
  ++stats_.entries;
  ++stats_.stores;
}

void PrefixCache::erase(Lru::iterator it) {
  auto [b, e] = index_.equal_range(it->key);
  for (auto j = b; j != e; ++j)
    if (j->second == it) {
      index_.erase(j);
      break;
    }
  const int L = int(it->tokens.size());
  if (--lengths_[L] == 0) lengths_.erase(L);
  stats_.bytes -= it->bytes();
  --stats_.entries;
  lru_.erase(it);
}

void PrefixCache::evict_to(size_t budget) {
  while (!lru_.empty() && stats_.bytes > budget) {
    erase(std::prev(lru_.end()));
    ++stats_.evictions;
  }
}

}  // namespace wren
