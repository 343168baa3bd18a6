// Constrained decoding of chat replies: OpenAI `tool_choice` required / named and
// `response_format` json_object / json_schema, as a mask over each step's logits.
//
// The reply is held to a plan of steps in the chat format's own syntax (runtime/chat_format.h):
// exact special ids, literal text (any tokenization whose bytes spell it), a JSON object (a
// byte-level JSON grammar: a token is allowed when its bytes keep the text a prefix of some JSON
// object), and free stretches (the think channel; K3's typed argument blocks) with a few ids
// forbidden. docs/serve.md#constrained-decoding lists the plans and what is only validated.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/chat_format.h"

namespace wren {

/// An incremental check of JSON text (RFC 8259) whose top-level value is an object. push() feeds
/// bytes; a byte that no JSON object text can continue with is refused (the state is then left
/// as it was). Strings hold well-formed UTF-8 (Unicode §3.9 table 3-7: no overlongs, surrogates
/// or code points past U+10FFFF; a character may be split across tokens) and no control bytes.
/// Nesting is limited to 64 levels and whitespace runs to 64 bytes (so a constrained model cannot
/// stall in blanks forever). Trivially copyable.
class JsonPrefix {
 public:
  /// Feeds one byte; false (and no change) when it cannot continue a JSON object.
  bool push(unsigned char c);
  /// Feeds bytes; false (state unspecified) when one is refused.
  bool push(std::string_view s) {
    for (char c : s)
      if (!push((unsigned char)c)) return false;
    return true;
  }
  /// The top-level object is closed: nothing more may follow.
  bool complete() const { return st_ == St::Done; }

 private:
  enum class St : uint8_t {
    Start, Value, ObjKeyOrEnd, ObjKey, Colon, AfterValue, ArrValueOrEnd, Str, StrEsc, StrU, StrUtf8,
    NumMinus, NumZero, NumInt, NumFracStart, NumFrac, NumExpStart, NumExpSign, NumExp, Lit, Done
  };
  bool step(unsigned char c);
  bool end_value();  // a scalar or container finished: AfterValue (or Done at depth 0)
  bool open(bool object);
  St st_ = St::Start;
  bool key_ = false;       // the string being read is an object key
  uint8_t depth_ = 0, ws_ = 0, aux_ = 0;  // aux_: \u digits read, the literal's position, UTF-8 bytes to come
  uint8_t lo_ = 0x80, hi_ = 0xBF;          // the range of the next UTF-8 continuation byte
  uint64_t kinds_ = 0;     // bit d: level d is an object (1) or array (0)
  const char* lit_ = nullptr;
};

/// What a reply must be.
struct ReplyRule {
  enum class Kind { Free, ToolCall, JsonObject } kind = Kind::Free;
  std::vector<std::string> tools;  ///< ToolCall: the allowed function names (one = tool_choice named)
  std::vector<std::string> required;  ///< JsonObject (json_schema): top-level keys checked after generation
  /// The reply's own check after generation: "" or why it breaks the rule (name not allowed,
  /// arguments not a JSON object, no call made).
  std::string check(const std::vector<ParsedToolCall>& calls, const std::string& content) const;
};

/// Masks the logits of one reply step by step (see the file comment). One per generation.
class ReplyConstraint {
 public:
  /// `thinking`: the generation prompt opened the think channel (XTML); `stop_ids`: ids that end
  /// generation (forbidden until the plan is done). Throws wren::Error when the tokenizer lacks a
  /// special the plan needs.
  ReplyConstraint(const ChatFormat& fmt, const ReplyRule& rule, bool thinking, std::vector<int> stop_ids);
  ~ReplyConstraint();
  /// Sets logits[id] = -inf for every id the plan does not allow next (n = the model's vocab;
  /// ids beyond the tokenizer are never allowed). Throws wren::Error if nothing is allowed.
  void mask(float* logits, int n) const;
  /// The id that was drawn (must have been allowed).
  void accept(int id);
  /// Every step of the plan has been taken.
  bool done() const { return at_ >= steps_.size(); }

  /// One step of the plan.
  struct Step {
    enum class Kind { Special, Text, Json, FreeUntil, FreeCall } kind = Kind::Special;
    int id = -1;                            ///< Special: the id; FreeUntil: the id that ends it
    std::vector<std::string> alternatives;  ///< Text: the literal texts allowed (prefix-free)
    std::string got;                        ///< Text: the bytes taken so far
    JsonPrefix json;                        ///< Json: the text so far
    std::vector<int> forbid;                ///< FreeUntil / FreeCall: ids not allowed
  };

 private:
  bool allowed(const Step& s, int id) const;
  void add_special(int id);
  void add_text(std::vector<std::string> alternatives);
  const ChatFormat& fmt_;
  std::vector<int> stop_ids_;
  std::vector<char> known_;  // [id]: a rank or an assigned special
  std::vector<Step> steps_;
  size_t at_ = 0;
  std::unique_ptr<ReplyParser> parser_;  // follows the reply (free steps end on its state)
};

}  // namespace wren
