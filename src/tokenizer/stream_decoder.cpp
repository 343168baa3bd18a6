// Incremental detokenization (see stream_decoder.h).
#include "tokenizer/stream_decoder.h"

#include "tokenizer/utf8.h"

namespace wren {

std::string StreamDecoder::push(int id) {
  pending_ += tok_->token_bytes(id);
  const size_t keep = utf8::incomplete_tail(pending_);
  std::string out = utf8::repair(std::string_view(pending_).substr(0, pending_.size() - keep));
  pending_.erase(0, pending_.size() - keep);
  return out;
}

std::string StreamDecoder::finish() {
  std::string out = utf8::repair(pending_);
  pending_.clear();
  return out;
}

}  // namespace wren
