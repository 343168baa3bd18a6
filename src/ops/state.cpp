// Per-sequence state (see state.h).
#include "ops/state.h"

#include <string>

#include "core/error.h"

namespace wren {

SequenceState::SequenceState(Backend& backend, const Config& cfg, int capacity)
    : be_(&backend), layer_be_(size_t(cfg.n_layers), &backend), cfg_(cfg), capacity_(capacity) {
  allocate();
}

SequenceState::SequenceState(const std::vector<Backend*>& layer_backends, const Config& cfg, int capacity)
    : be_(nullptr), layer_be_(layer_backends), split_(true), cfg_(cfg), capacity_(capacity) {
  check(int(layer_backends.size()) == cfg.n_layers, "sequence state: " + std::to_string(layer_backends.size()) +
                                                        " layer backends for " + std::to_string(cfg.n_layers) + " layers");
  for (Backend* b : layer_backends)
    if (b && !be_) be_ = b;
  check(be_ != nullptr, "sequence state: no layer has a backend");
  allocate();
}

bool SequenceState::holds(const Backend& be, int first, int end) const {
  if (!split_) return &be == be_;
  for (int i = first; i < end; ++i)
    if (layer_be_[size_t(i)] != &be) return false;
  return true;
}

SequenceState::~SequenceState() { free_buffers(); }

void SequenceState::allocate() {
  kda_.assign(cfg_.n_layers, KdaState{});
  mla_.assign(cfg_.n_layers, MlaCache{});
  for (int i = 0; i < cfg_.n_layers; ++i) {
    Backend* be = layer_be_[size_t(i)];
    if (!be) continue;  // a layer of another rank's stage
    if (cfg_.layers[i].mixer == Mixer::KDA) {
      kda_[i].S = be->alloc(s_len());
      kda_[i].conv = be->alloc(conv_len() ? conv_len() : 1);
    } else {
      mla_[i].kv = be->alloc(cache_len());
      mla_[i].capacity = capacity_;
    }
  }
}

void SequenceState::free_buffers() {
  for (size_t i = 0; i < kda_.size(); ++i) {
    Backend* be = layer_be_[i];
    if (kda_[i].S) be->release(kda_[i].S);
    if (kda_[i].conv) be->release(kda_[i].conv);
    if (mla_[i].kv) be->release(mla_[i].kv);
  }
  kda_.clear();
  mla_.clear();
}

void SequenceState::move_to(Backend& be) {
  free_buffers();
  be_ = &be;
  layer_be_.assign(size_t(cfg_.n_layers), &be);
  split_ = false;
  allocate();
  position_ = 0;
  history_.clear();
  replayable_ = true;
}

void SequenceState::record(const int* ids, int n, bool replayable) {
  if (!replayable) replayable_ = false;
  if (replayable_) history_.insert(history_.end(), ids, ids + n);
  else history_.clear();
}

void SequenceState::mark(Mark& m) const {
  m.position = position_;
  m.mla_lengths.resize(mla_.size());
  for (size_t i = 0; i < mla_.size(); ++i) m.mla_lengths[i] = mla_[i].length;
}

void SequenceState::rewind(const Mark& m) noexcept {
  position_ = m.position;
  for (size_t i = 0; i < mla_.size() && i < m.mla_lengths.size(); ++i) mla_[i].length = m.mla_lengths[i];
}

void SequenceState::reset() {
  for (size_t i = 0; i < kda_.size(); ++i) {
    KdaState& k = kda_[i];
    if (k.S) layer_be_[i]->fill_zero(k.S, s_len());
    if (k.conv) layer_be_[i]->fill_zero(k.conv, conv_len());
  }
  for (auto& m : mla_) m.length = 0;
  position_ = 0;
  history_.clear();
  replayable_ = true;
}

void SequenceState::copy_from(const SequenceState& o) {
  for (size_t i = 0; i < kda_.size(); ++i) {
    Backend* be = layer_be_[i];
    if (kda_[i].S) {
      be->copy(o.kda_[i].S, s_len(), kda_[i].S);
      be->copy(o.kda_[i].conv, conv_len(), kda_[i].conv);
    }
    if (mla_[i].kv) {
      be->copy(o.mla_[i].kv, size_t(o.mla_[i].length) * cfg_.mla_cache_width(), mla_[i].kv);
      mla_[i].length = o.mla_[i].length;
    }
  }
  position_ = o.position_;
  history_ = o.history_;
  replayable_ = o.replayable_;
}

void SequenceState::save(std::vector<float>& out, std::vector<int>& mla_lengths) const {
  const size_t W = cfg_.mla_cache_width();
  size_t n = 0;
  mla_lengths.assign(kda_.size(), 0);
  for (size_t i = 0; i < kda_.size(); ++i) {
    if (kda_[i].S) n += s_len() + conv_len();
    if (mla_[i].kv) n += size_t(mla_[i].length) * W, mla_lengths[i] = mla_[i].length;
  }
  out.resize(n);
  float* p = out.data();
  for (size_t i = 0; i < kda_.size(); ++i) {
    Backend* be = layer_be_[i];
    if (kda_[i].S) {
      be->to_host(kda_[i].S, s_len(), p), p += s_len();
      be->to_host(kda_[i].conv, conv_len(), p), p += conv_len();
    }
    if (mla_[i].kv && mla_[i].length > 0) {
      const size_t rows = size_t(mla_[i].length) * W;
      be->to_host(mla_[i].kv, rows, p), p += rows;
    }
  }
}

void SequenceState::load(const std::vector<float>& data, const std::vector<int>& mla_lengths,
                         const std::vector<int>& history) {
  const size_t W = cfg_.mla_cache_width();
  check(mla_lengths.size() == kda_.size(), "state snapshot: " + std::to_string(mla_lengths.size()) +
                                               " layers, this sequence has " + std::to_string(kda_.size()));
  size_t n = 0;
  for (size_t i = 0; i < kda_.size(); ++i) {
    if (kda_[i].S) n += s_len() + conv_len();
    if (mla_[i].kv) {
      check(mla_lengths[i] >= 0 && mla_lengths[i] <= capacity_,
            "state snapshot: layer " + std::to_string(i) + " holds " + std::to_string(mla_lengths[i]) +
                " cache rows, more than this sequence's capacity of " + std::to_string(capacity_));
      n += size_t(mla_lengths[i]) * W;
    }
  }
  check(n == data.size(), "state snapshot: " + std::to_string(data.size()) + " floats, expected " + std::to_string(n));
  const float* p = data.data();
  for (size_t i = 0; i < kda_.size(); ++i) {
    Backend* be = layer_be_[i];
    if (kda_[i].S) {
      be->from_host(p, s_len(), kda_[i].S), p += s_len();
      be->from_host(p, conv_len(), kda_[i].conv), p += conv_len();
    }
    if (mla_[i].kv) {
      const size_t rows = size_t(mla_lengths[i]) * W;
      if (rows) be->from_host(p, rows, mla_[i].kv), p += rows;
      mla_[i].length = mla_lengths[i];
    }
  }
  position_ = int(history.size());
  history_ = history;
  replayable_ = true;
}

size_t SequenceState::bytes_for(const Config& c, int capacity) {
  const size_t s = size_t(c.kda_heads) * c.kda_head_dim * c.kda_head_dim;
  const size_t conv = size_t(3) * c.kda_width() * (c.conv_kernel - 1);
  const size_t cache = size_t(capacity) * c.mla_cache_width();
  return (size_t(c.count(Mixer::KDA)) * (s + conv) + size_t(c.count(Mixer::MLA)) * cache) * sizeof(float);
}

}  // namespace wren
