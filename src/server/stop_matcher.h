// Stop strings for streamed text: text is released only once it can no longer begin a stop
// string, and generation ends at the first match (the stop string itself is never emitted).
#pragma once
#include <string>
#include <vector>

namespace wren::server {

/// Filters a stream of text pieces against a set of stop strings.
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  /// Adds text; returns the part that is now safe to emit (before any match, minus a held-back
  /// tail that could still start a stop string). After a match, returns "" for everything.
  std::string push(const std::string& text);
  /// Ends the stream: returns the held-back tail (empty after a match).
  std::string flush();
  bool matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool matched_ = false;
};

}  // namespace wren::server
