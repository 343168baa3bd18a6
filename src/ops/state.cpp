// Per-sequence state (see state.h).
#include "ops/state.h"

#include <string>

#include "core/error.h"

namespace wren {

SequenceState::SequenceState(Backend& backend, const Config& cfg, int capacity)
    : be_(&backend), cfg_(cfg), capacity_(capacity) {
  allocate();
}

SequenceState::~SequenceState() { free_buffers(); }

void SequenceState::allocate() {
  kda_.assign(cfg_.n_layers, KdaState{});
  mla_.assign(cfg_.n_layers, MlaCache{});
  for (int i = 0; i < cfg_.n_layers; ++i) {
    if (cfg_.layers[i].mixer == Mixer::KDA) {
      kda_[i].S = be_->alloc(s_len());
      kda_[i].conv = be_->alloc(conv_len() ? conv_len() : 1);
    } else {
      mla_[i].kv = be_->alloc(cache_len());
      mla_[i].capacity = capacity_;
    }
  }
}

void SequenceState::free_buffers() {
  for (auto& k : kda_) {
    if (k.S) be_->release(k.S);
    if (k.conv) be_->release(k.conv);
  }
  for (auto& m : mla_)
    if (m.kv) be_->release(m.kv);
  kda_.clear();
  mla_.clear();
}

void SequenceState::move_to(Backend& be) {
  free_buffers();
  be_ = &be;
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

void SequenceState::reset() {
  for (auto& k : kda_) {
    if (k.S) be_->fill_zero(k.S, s_len());
    if (k.conv) be_->fill_zero(k.conv, conv_len());
  }
  for (auto& m : mla_) m.length = 0;
  position_ = 0;
  history_.clear();
  replayable_ = true;
}

void SequenceState::copy_from(const SequenceState& o) {
  for (size_t i = 0; i < kda_.size(); ++i) {
    if (kda_[i].S) {
      be_->copy(o.kda_[i].S, s_len(), kda_[i].S);
      be_->copy(o.kda_[i].conv, conv_len(), kda_[i].conv);
    }
    if (mla_[i].kv) {
      be_->copy(o.mla_[i].kv, size_t(o.mla_[i].length) * cfg_.mla_cache_width(), mla_[i].kv);
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
    if (kda_[i].S) {
      be_->to_host(kda_[i].S, s_len(), p), p += s_len();
      be_->to_host(kda_[i].conv, conv_len(), p), p += conv_len();
    }
    if (mla_[i].kv && mla_[i].length > 0) {
      const size_t rows = size_t(mla_[i].length) * W;
      be_->to_host(mla_[i].kv, rows, p), p += rows;
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
    if (kda_[i].S) {
      be_->from_host(p, s_len(), kda_[i].S), p += s_len();
      be_->from_host(p, conv_len(), kda_[i].conv), p += conv_len();
    }
    if (mla_[i].kv) {
      const size_t rows = size_t(mla_lengths[i]) * W;
      if (rows) be_->from_host(p, rows, mla_[i].kv), p += rows;
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
