// The K3 chat format (see chat_format.h).
#include "runtime/chat_format.h"

#include <algorithm>
#include <map>

#include "core/error.h"

namespace wren {

using nlohmann::json;
using nlohmann::ordered_json;

namespace {

int need_special(const Tokenizer& tok, const char* s) {
  const auto id = tok.special_id(s);
  check(id.has_value(), std::string("the tokenizer has no special token ") + s +
                            " (tokenizer_config.json added_tokens_decoder): the K3 chat format needs it");
  return *id;
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::string strip(const std::string& s) {
  size_t a = 0, b = s.size();
  while (a < b && is_space(s[a])) ++a;
  while (b > a && is_space(s[b - 1])) --b;
  return s.substr(a, b - a);
}

std::string dump_text(const ordered_json& j) { return j.dump(-1, ' ', false, ordered_json::error_handler_t::replace); }

/// Python's `json.dumps(v, ensure_ascii=False)`: ", " between items, ": " after keys, key order
/// kept. Numbers and string escapes come from nlohmann's printer, which agrees with Python's for
/// what JSON can carry (shortest round-trip floats; \b \f \n \r \t, other controls as \u00xx).
std::string python_dumps(const ordered_json& j) {
  if (j.is_object()) {
    std::string s = "{";
    bool first = true;
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (!first) s += ", ";
      first = false;
      s += dump_text(ordered_json(it.key())) + ": " + python_dumps(it.value());
    }
    return s + "}";
  }
  if (j.is_array()) {
    std::string s = "[";
    for (size_t i = 0; i < j.size(); ++i) s += (i ? ", " : "") + python_dumps(j[i]);
    return s + "]";
  }
  return dump_text(j);
}

const char* xtml_type(const ordered_json& v) {
  if (v.is_boolean()) return "boolean";
  if (v.is_null()) return "null";
  if (v.is_number()) return "number";
  if (v.is_string()) return "string";
  if (v.is_object()) return "object";
  return "array";
}

/// Reorders each run of tool messages into the order of the preceding assistant's tool_calls,
/// matching tool_call_id to the call's id, and names each matched message after its call. A run
/// with any unmatched message is left as it is (the encoder's normalize step).
std::vector<ChatMessage> order_tool_results(const std::vector<ChatMessage>& in) {
  std::vector<ChatMessage> out;
  std::map<std::string, std::pair<int, std::string>> calls;  // id -> (1-based position, name)
  for (size_t i = 0; i < in.size();) {
    if (in[i].role == "assistant") {
      calls.clear();
      for (size_t k = 0; k < in[i].tool_calls.size(); ++k) {
        const ToolCall& c = in[i].tool_calls[k];
        if (!c.id.empty() && !calls.count(c.id)) calls[c.id] = {int(k) + 1, c.name};
      }
    }
    if (in[i].role != "tool") {
      out.push_back(in[i++]);
      continue;
    }
    struct Item { int pos; size_t off; ChatMessage m; };
    std::vector<Item> run;
    bool unresolved = false;
    for (size_t off = 0; i < in.size() && in[i].role == "tool"; ++i, ++off) {
      const auto it = in[i].tool_call_id.empty() ? calls.end() : calls.find(in[i].tool_call_id);
      if (it == calls.end()) {
        unresolved = true;
        run.push_back({0, off, in[i]});
      } else {
        run.push_back({it->second.first, off, in[i]});
        run.back().m.name = it->second.second;
      }
    }
    if (unresolved) {
      for (size_t k = 0; k < run.size(); ++k) out.push_back(in[i - run.size() + k]);
      continue;
    }
    std::stable_sort(run.begin(), run.end(), [](const Item& a, const Item& b) { return a.pos < b.pos; });
    for (Item& it : run) out.push_back(std::move(it.m));
  }
  return out;
}

}  // namespace

ChatFormat::ChatFormat(const Tokenizer& tok) : tok_(tok) {
  auto id = [&](const char* s) { return tok.special_id(s).value_or(-1); };
  const bool xtml = id("<|open|>") >= 0 && id("<|close|>") >= 0 && id("<|sep|>") >= 0 && id("<|end_of_msg|>") >= 0;
  const bool k2 = id("<|im_system|>") >= 0 && id("<|im_user|>") >= 0 && id("<|im_assistant|>") >= 0 &&
                  id("<|im_middle|>") >= 0 && id("<|im_end|>") >= 0;
  if (!xtml && k2) {
    dialect_ = ChatDialect::K2;
    eom_ = id("<|im_end|>");
    k2_ = {id("<|tool_calls_section_begin|>"), id("<|tool_calls_section_end|>"), id("<|tool_call_begin|>"),
           id("<|tool_call_argument_begin|>"), id("<|tool_call_end|>"), id("<|im_system|>"), id("<|im_user|>"),
           id("<|im_assistant|>"), id("<|im_middle|>")};
    return;
  }
  check(xtml, "the tokenizer (tokenizer_config.json added_tokens_decoder) has neither the K3 chat specials "
              "<|open|> <|close|> <|sep|> <|end_of_msg|> nor the K2 ones <|im_system|> <|im_user|> "
              "<|im_assistant|> <|im_middle|> <|im_end|>: no chat format fits it");
  open_ = need_special(tok, "<|open|>");
  close_ = need_special(tok, "<|close|>");
  sep_ = need_special(tok, "<|sep|>");
  eom_ = need_special(tok, "<|end_of_msg|>");
}

int ChatFormat::need_k2(int id, const char* what) const {
  check(id >= 0, std::string("the tokenizer has no special token ") + what +
                     " (tokenizer_config.json added_tokens_decoder): K2-style tool calls need it");
  return id;
}

bool ParsedToolCall::json_ok() const {
  if (!complete || bad_value) return false;
  try {
    return ordered_json::parse(arguments).is_object();
  } catch (const ordered_json::exception&) {
    return false;
  }
}

// ---- K2 dialect ----
// The Kimi K2 instruct chat template (as public copies of Kimi-K2-Instruct-0905's
// chat_template.jinja show it; docs/serve.md#chat-dialects), rendered segment by segment:
//   [tools]  <|im_system|>tool_declare<|im_middle|>TOOLS_JSON<|im_end|>
//   [first message not system] <|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>
//   user     <|im_user|>NAME_OR_ROLE<|im_middle|>CONTENT<|im_end|>
//   assistant <|im_assistant|>NAME_OR_ROLE<|im_middle|>CONTENT[<|tool_calls_section_begin|>
//            (<|tool_call_begin|>ID<|tool_call_argument_begin|>ARGS<|tool_call_end|>)*<|tool_calls_section_end|>]<|im_end|>
//   tool     <|im_system|>NAME_OR_ROLE<|im_middle|>## Return of TOOL_CALL_ID\nCONTENT<|im_end|>
//   system   <|im_system|>NAME_OR_ROLE<|im_middle|>CONTENT<|im_end|>
//   generation prompt <|im_assistant|>assistant<|im_middle|>

void ChatFormat::k2_header(std::vector<int>& out, int role_id, const std::string& role) const {
  out.push_back(role_id);
  text(out, role);
  out.push_back(k2_.im_middle);
}

std::vector<int> ChatFormat::render_k2(const std::vector<ChatMessage>& messages) const {
  std::vector<int> out;
  for (const ChatMessage& m : messages) {
    check(m.role == "system" || m.role == "user" || m.role == "assistant" || m.role == "tool",
          "chat message role '" + m.role + "' (expected system, user, assistant or tool)");
    const std::string& role_name = m.name.empty() ? m.role : m.name;
    k2_header(out, m.role == "user" ? k2_.im_user : m.role == "assistant" ? k2_.im_assistant : k2_.im_system,
              role_name);
    if (m.role == "assistant" && !m.tool_calls.empty()) {
      text(out, m.content);
      out.push_back(need_k2(k2_.section_begin, "<|tool_calls_section_begin|>"));
      for (const ToolCall& c : m.tool_calls) {
        out.push_back(need_k2(k2_.call_begin, "<|tool_call_begin|>"));
        text(out, c.id);
        out.push_back(need_k2(k2_.argument_begin, "<|tool_call_argument_begin|>"));
        text(out, c.arguments);
        out.push_back(need_k2(k2_.call_end, "<|tool_call_end|>"));
      }
      out.push_back(need_k2(k2_.section_end, "<|tool_calls_section_end|>"));
    } else if (m.role == "tool") {
      text(out, "## Return of " + m.tool_call_id + "\n");
      text(out, m.content);
    } else {
      text(out, m.content);
    }
    out.push_back(eom_);
  }
  return out;
}

std::string ChatFormat::escape_attribute(const std::string& v) {
  std::string a;
  for (char c : v) a += c == '&' ? std::string("&amp;") : std::string(1, c);
  std::string b;
  for (char c : a) b += c == '"' ? std::string("&quot;") : std::string(1, c);
  return b;
}

std::string ChatFormat::compact_sorted(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);  // json's objects are key-sorted maps
}

void ChatFormat::text(std::vector<int>& out, const std::string& s) const {
  if (s.empty()) return;
  const std::vector<int> ids = tok_.encode(s, SpecialMode::Disabled);
  out.insert(out.end(), ids.begin(), ids.end());
}

void ChatFormat::open_tag(std::vector<int>& out, const std::string& name, const Attrs& attrs) const {
  out.push_back(open_);
  text(out, name);
  for (const auto& [key, value] : attrs) {  // segments: ` key`, `="`, the escaped value, `"`
    text(out, " " + key);
    text(out, "=\"");
    text(out, escape_attribute(value));
    text(out, "\"");
  }
  out.push_back(sep_);
}

void ChatFormat::close_tag(std::vector<int>& out, const std::string& name) const {
  out.push_back(close_);
  text(out, name);
  out.push_back(sep_);
}

void ChatFormat::system_note(std::vector<int>& out, const std::string& type, const std::string& body) const {
  open_tag(out, "message", {{"role", "system"}, {"type", type}});
  text(out, strip(body));
  close_tag(out, "message");
  out.push_back(eom_);
}

void ChatFormat::tool_declare(std::vector<int>& out, const json& tools, bool dynamic) const {
  const std::string head = dynamic ? "## New Tools Available\n"
                                     "The system dynamically extends the toolset via lazy-loading.\n"
                                     "You have access to all existing and extended tools.\n"
                                     "Here are the specs for the extended tools.\n\n"
                                   : "# Tools\nHere are the available tools, described in JSONSchema.\n\n";
  open_tag(out, "message", {{"role", "system"}, {"type", "tool-declare"}});
  text(out, head + "```json\n" + compact_sorted(tools) + "\n```");
  close_tag(out, "message");
  out.push_back(eom_);
}

void ChatFormat::assistant(std::vector<int>& out, const ChatMessage& m, bool thinking) const {
  if (thinking) {
    open_tag(out, "think");
    if (!strip(m.reasoning).empty()) text(out, m.reasoning);
    close_tag(out, "think");
  }
  open_tag(out, "response");
  text(out, m.content);
  close_tag(out, "response");
  if (m.tool_calls.empty()) return;
  open_tag(out, "tools");
  for (size_t k = 0; k < m.tool_calls.size(); ++k) {
    const ToolCall& c = m.tool_calls[k];
    open_tag(out, "call", {{"tool", c.name}, {"index", std::to_string(k + 1)}});
    ordered_json args = ordered_json::object();
    bool raw = false;
    if (!strip(c.arguments).empty()) {
      try {
        args = ordered_json::parse(c.arguments);
      } catch (const ordered_json::parse_error&) {
        raw = true;  // not JSON: the encoder keeps it as one raw json block
      }
      check(raw || args.is_object(), "tool call '" + c.name + "': arguments must be a JSON object, got " +
                                         c.arguments.substr(0, 80));
    }
    if (raw) {
      open_tag(out, "json", {{"type", "object"}});
      text(out, c.arguments);
      close_tag(out, "json");
    } else {
      for (auto it = args.begin(); it != args.end(); ++it) {
        open_tag(out, "argument", {{"key", it.key()}, {"type", xtml_type(it.value())}});
        text(out, it.value().is_string() ? it.value().get<std::string>() : python_dumps(it.value()));
        close_tag(out, "argument");
      }
    }
    close_tag(out, "call");
  }
  close_tag(out, "tools");
}

std::vector<int> ChatFormat::render(const std::vector<ChatMessage>& messages_in, bool thinking) const {
  if (dialect_ == ChatDialect::K2) return render_k2(messages_in);
  const std::vector<ChatMessage> messages = order_tool_results(messages_in);
  std::vector<int> out;
  const std::vector<ToolCall>* last_calls = nullptr;
  int tool_index = 0;
  for (const ChatMessage& m : messages) {
    check(m.role == "system" || m.role == "user" || m.role == "assistant" || m.role == "tool",
          "chat message role '" + m.role + "' (expected system, user, assistant or tool)");
    if (m.role == "system" && m.tools.is_array() && !m.tools.empty()) {
      tool_declare(out, m.tools, true);
      continue;
    }
    if (m.role == "tool") {
      ++tool_index;
      std::string name = m.name;
      if (name.empty() && last_calls && tool_index <= int(last_calls->size())) name = (*last_calls)[tool_index - 1].name;
      check(!name.empty(), "a tool message needs a resolvable tool: give tool_call_id (matching an earlier "
                           "assistant tool call) or name");
      open_tag(out, "message", {{"role", "tool"}, {"tool", name}, {"index", std::to_string(tool_index)}});
      text(out, m.content);
    } else {
      Attrs attrs = {{"role", m.role}};
      if (!m.name.empty()) attrs.push_back({"name", m.name});
      open_tag(out, "message", attrs);
      if (m.role == "assistant") {
        last_calls = &m.tool_calls;
        tool_index = 0;
        assistant(out, m, thinking);
      } else {
        text(out, m.content);
      }
    }
    close_tag(out, "message");
    out.push_back(eom_);
  }
  return out;
}

std::vector<int> ChatFormat::preamble(const ChatOptions& o, const std::vector<ChatMessage>& messages) const {
  std::vector<int> out;
  if (dialect_ == ChatDialect::K2) {
    if (o.tools.is_array() && !o.tools.empty()) {
      k2_header(out, k2_.im_system, "tool_declare");
      text(out, python_dumps(ordered_json::parse(o.tools.dump())));
      out.push_back(eom_);
    }
    if (!messages.empty() && messages.front().role != "system") {
      k2_header(out, k2_.im_system, "system");
      text(out, "You are Kimi, an AI assistant created by Moonshot AI.");
      out.push_back(eom_);
    }
    return out;
  }
  if (o.tools.is_array() && !o.tools.empty()) tool_declare(out, o.tools, false);
  if (o.thinking && valid_effort(o.effort))
    system_note(out, "thinking-effort",
                "`thinking_effort` guides on how much to think in your thinking channel (not including the "
                "response channel), supported values include `low`, `medium`, `high`, and `max`.\n"
                "Now the system is invoked with `thinking_effort=" + o.effort + "`.");
  return out;
}

std::vector<int> ChatFormat::prompt(const std::vector<ChatMessage>& messages, const ChatOptions& o) const {
  if (dialect_ == ChatDialect::K2) {  // no effort message and no tool-choice note in the K2 template
    std::vector<int> out = preamble(o, messages);
    const std::vector<int> body = render_k2(messages), gen = generation_prompt(false);
    out.insert(out.end(), body.begin(), body.end());
    out.insert(out.end(), gen.begin(), gen.end());
    return out;
  }
  check(!o.thinking || valid_effort(o.effort), "thinking effort '" + o.effort + "' (expected low, high or max)");
  std::vector<int> out = preamble(o, messages);
  const std::vector<int> body = render(messages, o.thinking);
  out.insert(out.end(), body.begin(), body.end());
  if (o.tool_choice == ToolChoice::Required)
    system_note(out, "tool-choice", "The system is invoked with `tool_choice=required`.\nYou MUST call tools in the next message.");
  else if (o.tool_choice == ToolChoice::None)
    system_note(out, "tool-choice",
                "The system is invoked with `tool_choice=none`.\nYou MUST NOT call any tools in the next message.");
  const std::vector<int> gen = generation_prompt(o.thinking);
  out.insert(out.end(), gen.begin(), gen.end());
  return out;
}

std::vector<int> ChatFormat::generation_prompt(bool thinking) const {
  std::vector<int> out;
  if (dialect_ == ChatDialect::K2) {
    k2_header(out, k2_.im_assistant, "assistant");
    return out;
  }
  open_tag(out, "message", {{"role", "assistant"}});
  open_tag(out, thinking ? "think" : "response");
  return out;
}

std::vector<int> ChatFormat::close_reply(bool in_think) const {
  std::vector<int> out;
  if (dialect_ == ChatDialect::K2) return {eom_};
  if (in_think) {
    close_tag(out, "think");
    open_tag(out, "response");
  }
  close_tag(out, "response");
  close_tag(out, "message");
  out.push_back(eom_);
  return out;
}

// ---- reply parsing ----

namespace {

/// `name k1="v1" k2="v2"` -> name and the unescaped attributes.
std::string parse_tag(const std::string& tag, std::map<std::string, std::string>& attrs) {
  size_t i = 0;
  while (i < tag.size() && !is_space(tag[i])) ++i;
  const std::string name = tag.substr(0, i);
  while (i < tag.size()) {
    while (i < tag.size() && is_space(tag[i])) ++i;
    const size_t k0 = i;
    while (i < tag.size() && (std::isalnum((unsigned char)tag[i]) || tag[i] == '_' || tag[i] == '-')) ++i;
    const std::string key = tag.substr(k0, i - k0);
    if (key.empty() || tag.compare(i, 2, "=\"") != 0) {
      ++i;
      continue;
    }
    i += 2;
    const size_t v0 = i;
    while (i < tag.size() && tag[i] != '"') ++i;
    std::string v = tag.substr(v0, i - v0);
    ++i;
    std::string u;  // &quot; then &amp; (the reverse of escape_attribute)
    for (size_t p = 0; p < v.size();) {
      if (v.compare(p, 6, "&quot;") == 0) u += '"', p += 6;
      else u += v[p++];
    }
    std::string w;
    for (size_t p = 0; p < u.size();) {
      if (u.compare(p, 5, "&amp;") == 0) w += '&', p += 5;
      else w += u[p++];
    }
    attrs[key] = w;
  }
  return name;
}

}  // namespace

ReplyParser::ReplyParser(const ChatFormat& fmt, bool thinking)
    : fmt_(fmt), channel_(thinking && fmt.dialect() == ChatDialect::Xtml ? Channel::Think : Channel::Response) {}

ReplyParser::Channel ReplyParser::push_k2(int id) {
  const ChatFormat::K2Ids& k = fmt_.k2();
  if (id == fmt_.end_of_msg()) {
    done_ = true;
    return Channel::Tag;
  }
  if (id == k.section_begin) {
    in_tools_ = true;
    channel_ = Channel::Tools;
    return Channel::Tag;
  }
  if (id == k.section_end) {
    in_tools_ = false;
    k2_state_ = K2State::None;
    channel_ = Channel::Other;  // what follows the section is dropped
    return Channel::Tag;
  }
  if (id == k.call_begin) {  // recognised also outside a section
    k2_state_ = K2State::Header;
    header_.clear();
    channel_ = Channel::Tools;
    return Channel::Tag;
  }
  if (id == k.argument_begin && k2_state_ == K2State::Header) {
    const std::string h = strip(header_);
    std::string name = h.substr(0, h.rfind(':') == std::string::npos ? h.size() : h.rfind(':'));
    if (name.rfind("functions.", 0) == 0) name = name.substr(10);
    calls_.push_back({h, name, "", false});
    deltas_.push_back({int(calls_.size()) - 1, h, name, ""});
    k2_state_ = K2State::Args;
    return Channel::Tag;
  }
  if (id == k.call_end && k2_state_ == K2State::Args) {
    calls_.back().complete = true;
    k2_state_ = K2State::None;
    channel_ = in_tools_ ? Channel::Tools : Channel::Other;
    return Channel::Tag;
  }
  if (k2_state_ == K2State::Header) {
    header_ += fmt_.tokenizer().token_bytes(id);
    return Channel::Tools;
  }
  if (k2_state_ == K2State::Args) {
    const std::string piece(fmt_.tokenizer().token_bytes(id));
    calls_.back().arguments += piece;
    deltas_.push_back({int(calls_.size()) - 1, "", "", piece});
    return Channel::Tools;
  }
  return channel_;
}

std::vector<ToolCallDelta> ReplyParser::take_deltas() {
  std::vector<ToolCallDelta> d;
  d.swap(deltas_);
  return d;
}

void ReplyParser::arg_done(const std::string& json_value) {
  // Appended in place: GCC 12's -Wrestrict misfires on a chain of operator+ here (Release builds).
  std::string piece(call_args_ == 0 ? "{" : ",");
  piece += dump_text(ordered_json(arg_key_));
  piece += ':';
  piece += json_value;
  ++call_args_;
  calls_.back().arguments += piece;
  deltas_.push_back({int(calls_.size()) - 1, "", "", piece});
}

void ReplyParser::on_tag(bool opening, const std::string& tag) {
  std::map<std::string, std::string> attrs;
  const std::string name = parse_tag(tag, attrs);
  if (opening) {
    if (name == "think") channel_ = Channel::Think, in_tools_ = false;
    else if (name == "response") channel_ = Channel::Response, in_tools_ = false;
    else if (name == "tools") channel_ = Channel::Tools, in_tools_ = true;
    if (!in_tools_) return;
    if (name == "call") {
      in_call_ = true;
      call_args_ = 0;
      calls_.push_back({"", attrs["tool"], "", false});
      deltas_.push_back({int(calls_.size()) - 1, "", attrs["tool"], ""});
    } else if (in_call_ && name == "argument") {
      block_ = Block::Argument;
      arg_key_ = attrs["key"];
      arg_is_string_ = !attrs.count("type") || attrs["type"] == "string";
      value_.clear();
    } else if (in_call_ && name == "json") {
      block_ = Block::Json;
      value_.clear();
    }
    return;
  }
  // closing
  if (in_tools_ && in_call_ && name == "argument" && block_ == Block::Argument) {
    block_ = Block::None;
    std::string v = dump_text(ordered_json(value_));
    if (!arg_is_string_) {
      try {
        v = dump_text(ordered_json::parse(value_));
      } catch (const ordered_json::parse_error&) {  // not JSON after all: keep it as a string
        calls_.back().bad_value = true;
      }
    }
    arg_done(v);
  } else if (in_tools_ && in_call_ && name == "json" && block_ == Block::Json) {
    block_ = Block::None;
    std::string piece = value_;
    try {
      const ordered_json j = ordered_json::parse(value_);
      if (j.is_object()) piece = dump_text(j);
      else calls_.back().bad_value = true;
    } catch (const ordered_json::parse_error&) {
      calls_.back().bad_value = true;
    }
    if (call_args_ == 0) {
      calls_.back().arguments += piece;
      deltas_.push_back({int(calls_.size()) - 1, "", "", piece});
      call_args_ = -1;  // the whole object came as one block
    }
  } else if (in_tools_ && in_call_ && name == "call") {
    in_call_ = false;
    block_ = Block::None;
    const std::string tail = call_args_ == 0 ? "{}" : call_args_ > 0 ? "}" : "";
    calls_.back().arguments += tail;
    calls_.back().complete = true;
    if (!tail.empty()) deltas_.push_back({int(calls_.size()) - 1, "", "", tail});
  } else if (name == "tools") {
    in_tools_ = false, in_call_ = false, block_ = Block::None;
    channel_ = Channel::Other;
  } else if (!in_tools_) {
    channel_ = Channel::Other;  // between a close tag and the next open
  }
}

ReplyParser::Channel ReplyParser::push(int id) {
  if (done_) return Channel::Other;
  if (fmt_.dialect() == ChatDialect::K2) return push_k2(id);
  if (id == fmt_.end_of_msg()) {
    done_ = true;
    return Channel::Tag;
  }
  if (id == fmt_.open_id() || id == fmt_.close_id()) {
    in_tag_ = true;
    opening_ = id == fmt_.open_id();
    tag_.clear();
    return Channel::Tag;
  }
  if (in_tag_) {
    if (id == fmt_.sep_id()) {
      in_tag_ = false;
      on_tag(opening_, tag_);
    } else {
      tag_ += fmt_.tokenizer().token_bytes(id);
    }
    return Channel::Tag;
  }
  if (channel_ == Channel::Tools) {
    if (block_ != Block::None) value_ += fmt_.tokenizer().token_bytes(id);
    return Channel::Tools;
  }
  return channel_;
}

}  // namespace wren
