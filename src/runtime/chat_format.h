// The K3 chat format (XTML, docs/model.md#chat-format): messages to token ids, and the streamed reply
// back into its think and response channels.
#pragma once
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace wren {

/// One message of a conversation. `reasoning` is the assistant's think channel (may be empty).
struct ChatMessage {
  std::string role;  ///< "system", "user", "assistant"
  std::string content;
  std::string reasoning;
};

/// Renders messages as XTML token ids. Every structural piece is encoded as its own segment
/// (segment boundaries are token boundaries); only <|open|>, <|close|>, <|sep|>, <|end_of_msg|>
/// are special ids; content and attribute values are encoded with specials disabled, so a literal
/// "<|open|>" typed by a user stays plain text. No [BOS] is added: the upstream encoding_k3.py
/// ports emit none for chat (docs/model.md#open-points, 1; colibri's engine adds one — unsettled).
class ChatFormat {
 public:
  /// Throws wren::Error if the tokenizer lacks one of the four structural specials.
  explicit ChatFormat(const Tokenizer& tok);

  /// The ids of `messages`; with `thinking`, assistant messages carry a (possibly empty) think
  /// pair, without it none (upstream behaviour).
  std::vector<int> render(const std::vector<ChatMessage>& messages, bool thinking) const;
  /// The assistant generation prompt: `<|open|>message role="assistant"<|sep|>` then
  /// `<|open|>think<|sep|>` (thinking) or `<|open|>response<|sep|>`.
  std::vector<int> generation_prompt(bool thinking) const;
  /// Closes an assistant reply cut short (token limit or cancel) so the history stays well formed:
  /// the open channel's close tag (plus an empty response when still thinking), then
  /// `<|close|>message<|sep|><|end_of_msg|>`.
  std::vector<int> close_reply(bool in_think) const;

  int end_of_msg() const { return eom_; }
  int open_id() const { return open_; }
  int close_id() const { return close_; }
  int sep_id() const { return sep_; }
  const Tokenizer& tokenizer() const { return tok_; }

  /// `&` -> `&amp;` first, then `"` -> `&quot;` (docs/model.md#chat-format).
  static std::string escape_attribute(const std::string& v);

 private:
  void text(std::vector<int>& out, const std::string& s) const;
  void open_tag(std::vector<int>& out, const std::string& name, const std::string& role = "") const;
  void close_tag(std::vector<int>& out, const std::string& name) const;
  const Tokenizer& tok_;
  int open_, close_, sep_, eom_;
};

/// Splits a streamed assistant reply into channels: text after `<|open|>think<|sep|>` is
/// reasoning, after `<|open|>response<|sep|>` the answer; tag names between `<|open|>` or
/// `<|close|>` and `<|sep|>` are consumed, `<|end_of_msg|>` ends the reply.
class ReplyParser {
 public:
  enum class Channel { Think, Response, Tag, Other };
  /// `thinking`: the generation prompt opened the think channel (else the response channel).
  ReplyParser(const ChatFormat& fmt, bool thinking);
  /// Feeds one id; returns the channel the id's text belongs to (Tag for structure). The text
  /// itself comes from a StreamDecoder the caller runs on ids whose channel is Think/Response.
  Channel push(int id);
  Channel channel() const { return channel_; }
  bool done() const { return done_; }

 private:
  const ChatFormat& fmt_;
  Channel channel_;
  bool in_tag_ = false, opening_ = false, done_ = false;
  std::string tag_;
};

}  // namespace wren
