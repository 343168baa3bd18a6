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
//
// A second dialect, K2 (the `<|im_...|>` messages and `<|tool_calls_section_begin|>` tool calls of
// Kimi K2 and the public Kimi Linear instruct checkpoints), is chosen when the tokenizer has the K2
// specials instead of the XTML ones (docs/serve.md#chat-dialects: what it renders, and which parts
// of it are not pinned down by the spec).
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

/// Which chat format the tokenizer's specials call for (never chosen by model name).
enum class ChatDialect {
  Xtml,  ///< K3: <|open|> <|close|> <|sep|> <|end_of_msg|> (docs/model.md#chat-format)
  K2,    ///< Kimi K2 / Kimi Linear: <|im_system|> <|im_user|> <|im_assistant|> <|im_middle|> <|im_end|>
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
  /// Picks the dialect from the tokenizer's specials: XTML when it has the four XTML specials,
  /// else K2 when it has the five `<|im_...|>` specials (its tool-call specials are then needed
  /// only to render or parse tool calls). Throws wren::Error naming the missing specials otherwise.
  explicit ChatFormat(const Tokenizer& tok);
  ChatDialect dialect() const { return dialect_; }

  /// The ids of `messages` alone (no declarations, effort or tool-choice notes): used to append
  /// turns to a conversation already rendered. With `thinking`, assistant messages carry a
  /// (possibly empty) think pair, without it none (upstream behaviour).
  /// Throws wren::Error on a bad message (unknown role, arguments JSON that is not an object,
  /// a tool message whose tool cannot be resolved).
  std::vector<int> render(const std::vector<ChatMessage>& messages, bool thinking) const;
  /// The whole prompt as the encoder renders it: tool declarations, the thinking-effort message
  /// (thinking on), the messages, the tool-choice note, then the generation prompt.
  std::vector<int> prompt(const std::vector<ChatMessage>& messages, const ChatOptions& o) const;
  /// What precedes the first message: the tool declarations and (XTML, thinking on) the effort
  /// message; K2: also the template's default system message when `messages` (the first turn)
  /// does not start with a system message.
  std::vector<int> preamble(const ChatOptions& o, const std::vector<ChatMessage>& messages = {}) const;
  /// The assistant generation prompt: `<|open|>message role="assistant"<|sep|>` then
  /// `<|open|>think<|sep|>` (thinking) or `<|open|>response<|sep|>`.
  std::vector<int> generation_prompt(bool thinking) const;
  /// Closes an assistant reply cut short (token limit or cancel) so the history stays well formed:
  /// the open channel's close tag (plus an empty response when still thinking), then
  /// `<|close|>message<|sep|><|end_of_msg|>`.
  std::vector<int> close_reply(bool in_think) const;

  /// The id that ends an assistant reply: <|end_of_msg|> (XTML) or <|im_end|> (K2).
  int end_of_msg() const { return eom_; }
  /// K2 tool-call specials (-1 when the tokenizer lacks one; XTML: all -1).
  struct K2Ids {
    int section_begin = -1, section_end = -1, call_begin = -1, argument_begin = -1, call_end = -1;
    int im_system = -1, im_user = -1, im_assistant = -1, im_middle = -1;
  };
  const K2Ids& k2() const { return k2_; }
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
  std::vector<int> render_k2(const std::vector<ChatMessage>& messages) const;
  void k2_header(std::vector<int>& out, int role_id, const std::string& role) const;
  int need_k2(int id, const char* what) const;
  const Tokenizer& tok_;
  ChatDialect dialect_ = ChatDialect::Xtml;
  int open_ = -1, close_ = -1, sep_ = -1, eom_ = -1;
  K2Ids k2_;
};

/// One parsed tool call of a reply.
struct ParsedToolCall {
  std::string id;  ///< K2: the model's own call id (`functions.NAME:IDX`); XTML: empty
  std::string name;
  std::string arguments;  ///< JSON object text, keys in the order the model wrote them
  bool complete = false;  ///< its `<|close|>call<|sep|>` (K2: `<|tool_call_end|>`) was seen
  /// Complete and `arguments` is a JSON object (XTML: every typed argument parsed as JSON).
  bool json_ok() const;
  bool bad_value = false;  ///< XTML: a non-string argument or json block was not valid JSON
};

/// A piece of a tool call for streaming: the first piece of a call carries its name; the
/// arguments pieces of one call concatenate to its final `arguments`.
struct ToolCallDelta {
  int index = 0;  ///< 0-based position of the call in the reply
  std::string id;  ///< first piece, K2 only: the model's call id
  std::string name;
  std::string arguments;
};

/// Splits a streamed assistant reply into channels: text after `<|open|>think<|sep|>` is
/// reasoning, after `<|open|>response<|sep|>` the answer, after `<|open|>tools<|sep|>` tool calls
/// (parsed here: `call` blocks with `argument` or `json` children); tag names between `<|open|>`
/// or `<|close|>` and `<|sep|>` are consumed, `<|end_of_msg|>` ends the reply. A tools channel is
/// recognised anywhere (also straight after an unclosed think channel).
///
/// K2 dialect: there is no think channel; text is the answer until `<|tool_calls_section_begin|>`;
/// each `<|tool_call_begin|>HEADER<|tool_call_argument_begin|>ARGS<|tool_call_end|>` is a call
/// (HEADER `functions.NAME:IDX` gives the id and, without the `functions.` prefix and `:IDX`, the
/// name; ARGS are streamed byte for byte as they come); text after `<|tool_calls_section_end|>`
/// is dropped (as vLLM's K2 parser does); `<|im_end|>` ends the reply.
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
  Channel push_k2(int id);
  const ChatFormat& fmt_;
  enum class K2State { None, Header, Args } k2_state_ = K2State::None;
  std::string header_;
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
