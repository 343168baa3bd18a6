// The engine's step: a Forward plus the policy around it. After a device failure (DeviceError)
// the runner says so once on stderr, creates the fallback backend (the CPU), rebuilds the failed
// sequence's state there by running its token log again, repeats the call, and runs every later
// call there (other states move on their next call). The token log (SequenceState::history) is
// kept here: each successful run appends its ids. The forward pass itself stays a pure step.
#pragma once
#include <functional>
#include <memory>

#include "core/error.h"
#include "model/forward.h"

namespace wren {

class Runner final : public TokenStep {
 public:
  /// As Forward's constructor (the runner owns its Forward; experts come from the backend).
  Runner(const Model& model, Backend& backend, ForwardOptions opts = {});
  ~Runner() override;

  /// Makes device failures survivable (see the top of this file): `make` returns the fallback
  /// backend, called once on the first failure. A state fed through x0 cannot be rebuilt: then
  /// the DeviceError propagates, as it does without a fallback.
  void set_fallback(std::function<std::unique_ptr<Backend>()> make) {
    make_fallback_ = [make = std::move(make)] { return Fallback{make(), nullptr}; };
  }
  /// What a fallback runs on: the backend, and the model whose weights it reads (null = the
  /// runner's model; a model whose weights were placed on the failed device needs a host copy).
  struct Fallback {
    std::unique_ptr<Backend> backend;
    const Model* model = nullptr;
  };
  /// As set_fallback above, with the model the fallback backend reads (loaded when it is made).
  void set_fallback_with_model(std::function<Fallback()> make) { make_fallback_ = std::move(make); }
  /// Runs every call through the pipeline step `p` (--pipeline: PipelineForward; --gpus or a
  /// launcher: RankPipeline; docs/parallel.md) instead of the single-backend forward; its
  /// backend() must be this runner's backend. `make_state` makes its sequence states (split like
  /// its stages). The CPU fallback still applies (a failed state moves whole to the CPU).
  void set_pipeline(std::unique_ptr<TokenStep> p, std::function<std::unique_ptr<SequenceState>(int)> make_state) {
    pipe_ = std::move(p);
    make_state_ = std::move(make_state);
  }
  /// The pipeline step set by set_pipeline, or null.
  TokenStep* pipeline() const { return pipe_.get(); }
  /// A fresh state for this runner's step (split like the pipeline's stages when there is one).
  std::unique_ptr<SequenceState> new_sequence(int capacity) {
    if (pipe_ && !fallback_) return make_state_(capacity);
    return std::make_unique<SequenceState>(backend(), config(), capacity);
  }
  /// True once the runner runs on its fallback backend.
  bool on_fallback() const { return fallback_ != nullptr; }

  /// Forward::run on the current backend, then appends ids to the state's token log.
  void run(SequenceState& state, const int* ids, const float* x0, int T, float* logits, bool all_logits,
           const ForwardHooks* hooks = nullptr) override;
  /// Forward::run_batch (one decode step over B sequences), then appends each id to its state's
  /// log. After a device failure every state moves to the fallback and runs its token there.
  void run_batch(SequenceState* const* states, const int* ids, int B, float* logits) override;
  /// Forward::run_mixed (decodes and prefill chunks of several sequences in one step), then
  /// appends each entry's ids to its state's log. After a device failure every state moves to
  /// the fallback and runs its entry there.
  void run_mixed(const BatchEntry* entries, int n) override;
  /// Forward::decode_greedy (steps recorded ahead where the backend records), appending each
  /// step's id to the state's log as its step completes. After a device failure the state moves
  /// to the fallback and the remaining steps run there (the failed one again).
  int decode_greedy(SequenceState& state, int first, int max_steps, const std::function<bool(int)>& on_id) override;
  /// The backend calls run on now: the fallback once a device failed, else the one given.
  Backend& backend() override { return fallback_ ? *fallback_be_ : fwd_.backend(); }
  const Config& config() const override { return fwd_.config(); }
  int layers_run() const override { return fwd_.layers_run(); }
  /// The forward pass on the backend given at construction.
  Forward& forward() { return fwd_; }
  /// The model the current backend reads (the fallback's own once on the fallback).
  const Model& model() const { return fallback_ ? fallback_->model() : fwd_.model(); }

 private:
  /// Says so on stderr and creates the fallback backend and forward (the first failure).
  void start_fallback(const DeviceError& e);
  void run_fallback(SequenceState& state, const int* ids, const float* x0, int T, float* logits,
                    bool all_logits, const ForwardHooks* hooks);
  Forward fwd_;
  std::unique_ptr<TokenStep> pipe_;  ///< --pipeline / --gpus: the stages, or null
  std::function<std::unique_ptr<SequenceState>(int)> make_state_;
  std::function<Fallback()> make_fallback_;
  std::unique_ptr<Backend> fallback_be_;
  std::unique_ptr<Forward> fallback_;  ///< the same forward on fallback_be_, once a step failed
};

}  // namespace wren
