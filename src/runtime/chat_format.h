// The K3 chat format (XTML, docs/model.md#chat-format): messages, tool declarations, tool calls and tool
// results to token ids, and the streamed reply back into its think, response and tools channels.
//
// Beyond docs/model.md#chat-format's short list, the rules follow Moonshot's encoder (`encoding_k3.py`, as vLLM
// ships it), read and rewritten here:
//   - a `tools` list is declared first, as `<|open|>message role="system" type="tool-declare"<|sep|>`
//     with a fixed header and the tools as compact JSON with every object's keys sorted;
//   - with thinking on, a `thinking-effort` system message follows (effort low / high / max,
//     default max);
//   - then the messages; an assistant message is think (thinking on only) + response + an optional
//     `tools` channel of `call tool=".." index="k"` blocks (k from 1), each with one
//     `argument key=".." type=".."` block per argument (strings raw, other values as JSON with
//     Python's default ", " / ": " separators) or, when the arguments string is not JSON, one
//     `json type="object"` block holding it raw;
//   - a `tool` message is `role="tool" tool="NAME" index="k"` (k counts tool messages since the
//     last assistant message; runs of tool messages are first put in the order of the assistant's
//     calls by `tool_call_id`);
//   - a system message carrying `tools` (dynamic tools) is a tool-declare message with the
//     "New Tools Available" header, whatever its content;
//   - tool_choice `required` / `none` add a `tool-choice` system message after the messages.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace wren {

/// One tool call of an assistant message (OpenAI `tool_calls[i]`).
struct ToolCall {
  std::string id;         ///< opaque; matched by tool messages' tool_call_id
  std::string name;       ///< function.name
  std::string arguments;  ///< function.arguments: a JSON object as text (or any text: rendered raw)
};

/// One message of a conversation. `reasoning` is the assistant's think channel (may be empty).
struct ChatMessage {
  ChatMessage(std::string role = "", std::string content = "", std::string reasoning = "")
      : role(std::move(role)), content(std::move(content)), reasoning(std::move(reasoning)) {}
  std::string role;  ///< "system", "user", "assistant", "tool"
  std::string content;
  std::string reasoning;
  std::vector<ToolCall> tool_calls;  ///< assistant
  std::string tool_call_id;          ///< tool: which call this answers
  std::string name;                  ///< optional `name` attribute; for a tool message the tool name
  nlohmann::json tools;              ///< system: dynamic tool declarations (null = none)
};

/// How the model may use tools (OpenAI `tool_choice`).
enum class ToolChoice { Auto, None, Required, Named };

/// Whole-prompt options: what the encoder renders around the messages.
struct ChatOptions {
  bool thinking = true;
  std::string effort = "max";     ///< thinking effort: low, high or max (rendered when thinking)
  nlohmann::json tools;           ///< OpenAI `tools` list (null or empty = none declared)
  ToolChoice tool_choice = ToolChoice::Auto;  ///< Named renders like Auto (the encoder adds nothing)
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

  /// The ids of `messages` alone (no declarations, effort or tool-choice notes): used to append
  /// turns to a conversation already rendered. With `thinking`, assistant messages carry a
  /// (possibly empty) think pair, without it none (upstream behaviour).
  /// Throws wren::Error on a bad message (unknown role, arguments JSON that is not an object,
  /// a tool message whose tool cannot be resolved).
  std::vector<int> render(const std::vector<ChatMessage>& messages, bool thinking) const;
  /// The whole prompt as the encoder renders it: tool declarations, the thinking-effort message
  /// (thinking on), the messages, the tool-choice note, then the generation prompt.
  std::vector<int> prompt(const std::vector<ChatMessage>& messages, const ChatOptions& o) const;
  /// What precedes the first message: the tool declarations and (thinking on) the effort message.
  std::vector<int> preamble(const ChatOptions& o) const;
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
  /// The thinking efforts the encoder accepts.
  static bool valid_effort(const std::string& e) { return e == "low" || e == "high" || e == "max"; }
  /// JSON text with every object's keys sorted and no spaces (the encoder's tool declarations).
  static std::string compact_sorted(const nlohmann::json& j);

 private:
  using Attrs = std::vector<std::pair<std::string, std::string>>;
  void text(std::vector<int>& out, const std::string& s) const;
  void open_tag(std::vector<int>& out, const std::string& name, const Attrs& attrs = {}) const;
  void close_tag(std::vector<int>& out, const std::string& name) const;
  void system_note(std::vector<int>& out, const std::string& type, const std::string& body) const;
  void tool_declare(std::vector<int>& out, const nlohmann::json& tools, bool dynamic) const;
  void assistant(std::vector<int>& out, const ChatMessage& m, bool thinking) const;
  const Tokenizer& tok_;
  int open_, close_, sep_, eom_;
};

/// One parsed tool call of a reply.
struct ParsedToolCall {
  std::string name;
  std::string arguments;  ///< JSON object text, keys in the order the model wrote them
  bool complete = false;  ///< its `<|close|>call<|sep|>` was seen
};

/// A piece of a tool call for streaming: the first piece of a call carries its name; the
/// arguments pieces of one call concatenate to its final `arguments`.
struct ToolCallDelta {
  int index = 0;  ///< 0-based position of the call in the reply
  std::string name;
  std::string arguments;
};

/// Splits a streamed assistant reply into channels: text after `<|open|>think<|sep|>` is
/// reasoning, after `<|open|>response<|sep|>` the answer, after `<|open|>tools<|sep|>` tool calls
/// (parsed here: `call` blocks with `argument` or `json` children); tag names between `<|open|>`
/// or `<|close|>` and `<|sep|>` are consumed, `<|end_of_msg|>` ends the reply. A tools channel is
/// recognised anywhere (also straight after an unclosed think channel).
class ReplyParser {
 public:
  enum class Channel { Think, Response, Tag, Other, Tools };
  /// `thinking`: the generation prompt opened the think channel (else the response channel).
  ReplyParser(const ChatFormat& fmt, bool thinking);
  /// Feeds one id; returns the channel the id's text belongs to (Tag for structure, Tools for
  /// the tools channel, whose text is consumed here). The text of Think/Response ids comes from
  /// a StreamDecoder the caller runs on them.
  Channel push(int id);
  Channel channel() const { return channel_; }
  bool done() const { return done_; }
  /// The calls seen so far (the last one may be incomplete).
  const std::vector<ParsedToolCall>& calls() const { return calls_; }
  /// Moves out the tool-call pieces produced since the last call.
  std::vector<ToolCallDelta> take_deltas();

 private:
  void on_tag(bool opening, const std::string& tag);
  void arg_done(const std::string& json_value);
  const ChatFormat& fmt_;
  Channel channel_;
  bool in_tag_ = false, opening_ = false, done_ = false, in_tools_ = false;
  std::string tag_;
  enum class Block { None, Argument, Json } block_ = Block::None;
  bool in_call_ = false, arg_is_string_ = true;
  int call_args_ = 0;
  std::string arg_key_, value_;
  std::vector<ParsedToolCall> calls_;
  std::vector<ToolCallDelta> deltas_;
};

}  // namespace wren
