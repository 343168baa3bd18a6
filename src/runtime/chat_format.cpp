// The K3 chat format (see chat_format.h).
#include "runtime/chat_format.h"

#include "core/error.h"

namespace wren {

namespace {
int need_special(const Tokenizer& tok, const char* s) {
  const auto id = tok.special_id(s);
  check(id.has_value(), std::string("the tokenizer has no special token ") + s +
                            " (tokenizer_config.json added_tokens_decoder): the K3 chat format needs it");
  return *id;
}
}  // namespace

ChatFormat::ChatFormat(const Tokenizer& tok)
    : tok_(tok),
      open_(need_special(tok, "<|open|>")),
      close_(need_special(tok, "<|close|>")),
      sep_(need_special(tok, "<|sep|>")),
      eom_(need_special(tok, "<|end_of_msg|>")) {}

std::string ChatFormat::escape_attribute(const std::string& v) {
  std::string a;
  for (char c : v) a += c == '&' ? std::string("&amp;") : std::string(1, c);
  std::string b;
  for (char c : a) b += c == '"' ? std::string("&quot;") : std::string(1, c);
  return b;
}

void ChatFormat::text(std::vector<int>& out, const std::string& s) const {
  if (s.empty()) return;
  const std::vector<int> ids = tok_.encode(s, SpecialMode::Disabled);
  out.insert(out.end(), ids.begin(), ids.end());
}

void ChatFormat::open_tag(std::vector<int>& out, const std::string& name, const std::string& role) const {
  out.push_back(open_);
  text(out, name);
  if (!role.empty()) {  // segments: ` role`, `="`, the escaped value, `"`
    text(out, " role");
    text(out, "=\"");
    text(out, escape_attribute(role));
    text(out, "\"");
  }
  out.push_back(sep_);
}

void ChatFormat::close_tag(std::vector<int>& out, const std::string& name) const {
  out.push_back(close_);
  text(out, name);
  out.push_back(sep_);
}

std::vector<int> ChatFormat::render(const std::vector<ChatMessage>& messages, bool thinking) const {
  std::vector<int> out;
  for (const ChatMessage& m : messages) {
    check(m.role == "system" || m.role == "user" || m.role == "assistant",
          "chat message role '" + m.role + "' (expected system, user or assistant)");
    open_tag(out, "message", m.role);
    if (m.role == "assistant") {
      if (thinking) {
        open_tag(out, "think");
        text(out, m.reasoning);
        close_tag(out, "think");
      }
      open_tag(out, "response");
      text(out, m.content);
      close_tag(out, "response");
    } else {
      text(out, m.content);
    }
    close_tag(out, "message");
    out.push_back(eom_);
  }
  return out;
}

std::vector<int> ChatFormat::generation_prompt(bool thinking) const {
  std::vector<int> out;
  open_tag(out, "message", "assistant");
  open_tag(out, thinking ? "think" : "response");
  return out;
}

std::vector<int> ChatFormat::close_reply(bool in_think) const {
  std::vector<int> out;
  if (in_think) {
    close_tag(out, "think");
    open_tag(out, "response");
  }
  close_tag(out, "response");
  close_tag(out, "message");
  out.push_back(eom_);
  return out;
}

ReplyParser::ReplyParser(const ChatFormat& fmt, bool thinking)
    : fmt_(fmt), channel_(thinking ? Channel::Think : Channel::Response) {}

ReplyParser::Channel ReplyParser::push(int id) {
  if (done_) return Channel::Other;
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
      if (opening_ && tag_ == "think") channel_ = Channel::Think;
      else if (opening_ && tag_ == "response") channel_ = Channel::Response;
      else if (!opening_) channel_ = Channel::Other;  // between a close tag and the next open
    } else {
      tag_ += fmt_.tokenizer().token_bytes(id);
    }
    return Channel::Tag;
  }
  return channel_;
}

}  // namespace wren
