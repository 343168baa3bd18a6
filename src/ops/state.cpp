// Per-sequence state (see state.h).
#include "ops/state.h"

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

size_t SequenceState::bytes_for(const Config& c, int capacity) {
  const size_t s = size_t(c.kda_heads) * c.kda_head_dim * c.kda_head_dim;
  const size_t conv = size_t(3) * c.kda_width() * (c.conv_kernel - 1);
  const size_t cache = size_t(capacity) * c.mla_cache_width();
  return (size_t(c.count(Mixer::KDA)) * (s + conv) + size_t(c.count(Mixer::MLA)) * cache) * sizeof(float);
}

}  // namespace wren
