// Constrained decoding of chat replies (see reply_constraint.h).
#include "runtime/reply_constraint.h"

#include <algorithm>
#include <limits>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace wren {

// ---- JsonPrefix ----

namespace {
bool is_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
bool is_hex(unsigned char c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
constexpr int kMaxDepth = 64, kMaxWs = 64;
}  // namespace

bool JsonPrefix::push(unsigned char c) {
  const JsonPrefix keep = *this;
  if (step(c)) return true;
  *this = keep;
  return false;
}

bool JsonPrefix::open(bool object) {
  if (depth_ >= kMaxDepth) return false;
  if (object) kinds_ |= uint64_t(1) << depth_;
  else kinds_ &= ~(uint64_t(1) << depth_);
  ++depth_;
  st_ = object ? St::ObjKeyOrEnd : St::ArrValueOrEnd;
  return true;
}

bool JsonPrefix::end_value() {
  st_ = depth_ == 0 ? St::Done : St::AfterValue;
  return true;
}

bool JsonPrefix::step(unsigned char c) {
  const bool top_object = depth_ > 0 && (kinds_ >> (depth_ - 1) & 1);
  switch (st_) {
    case St::Start: case St::Value: case St::ArrValueOrEnd: case St::ObjKeyOrEnd:
    case St::ObjKey: case St::Colon: case St::AfterValue:
      if (is_ws(c)) return ++ws_ <= kMaxWs;
      ws_ = 0;
      break;
    default:
      break;
  }
  switch (st_) {
    case St::Start:
      return c == '{' && open(true);
    case St::ArrValueOrEnd:
      if (c == ']') return --depth_, end_value();
      [[fallthrough]];
    case St::Value:
      if (c == '{') return open(true);
      if (c == '[') return open(false);
      if (c == '"') return key_ = false, st_ = St::Str, true;
      if (c == '-') return st_ = St::NumMinus, true;
      if (c == '0') return st_ = St::NumZero, true;
      if (is_digit(c)) return st_ = St::NumInt, true;
      lit_ = c == 't' ? "true" : c == 'f' ? "false" : c == 'n' ? "null" : nullptr;
      if (!lit_) return false;
      aux_ = 1;
      st_ = St::Lit;
      return true;
    case St::ObjKeyOrEnd:
      if (c == '}') return --depth_, end_value();
      [[fallthrough]];
    case St::ObjKey:
      if (c != '"') return false;
      key_ = true;
      st_ = St::Str;
      return true;
    case St::Colon:
      if (c != ':') return false;
      st_ = St::Value;
      return true;
    case St::AfterValue:
      if (c == ',') return st_ = top_object ? St::ObjKey : St::Value, true;
      if ((c == '}' && top_object) || (c == ']' && !top_object)) return --depth_, end_value();
      return false;
    case St::Str:
      if (c == '"') {
        if (key_) return st_ = St::Colon, true;
        return end_value();
      }
      if (c == '\\') return st_ = St::StrEsc, true;
      if (c < 0x20) return false;
      if (c < 0x80) return true;
      lo_ = 0x80, hi_ = 0xBF;
      if (c >= 0xC2 && c <= 0xDF) aux_ = 1;
      else if (c >= 0xE0 && c <= 0xEF) aux_ = 2, lo_ = c == 0xE0 ? 0xA0 : 0x80, hi_ = c == 0xED ? 0x9F : 0xBF;
      else if (c >= 0xF0 && c <= 0xF4) aux_ = 3, lo_ = c == 0xF0 ? 0x90 : 0x80, hi_ = c == 0xF4 ? 0x8F : 0xBF;
      else return false;
      st_ = St::StrUtf8;
      return true;
    case St::StrUtf8:
      if (c < lo_ || c > hi_) return false;
      lo_ = 0x80, hi_ = 0xBF;
      if (--aux_ == 0) st_ = St::Str;
      return true;
    case St::StrEsc:
      if (c == 'u') return aux_ = 0, st_ = St::StrU, true;
      if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' || c == 't')
        return st_ = St::Str, true;
      return false;
    case St::StrU:
      if (!is_hex(c)) return false;
      if (++aux_ == 4) st_ = St::Str;
      return true;
    case St::NumMinus:
      if (c == '0') return st_ = St::NumZero, true;
      if (is_digit(c)) return st_ = St::NumInt, true;
      return false;
    case St::NumInt:
      if (is_digit(c)) return true;
      [[fallthrough]];
    case St::NumZero:
      if (c == '.') return st_ = St::NumFracStart, true;
      if (c == 'e' || c == 'E') return st_ = St::NumExpStart, true;
      end_value();  // the number ended (numbers are never top-level): this byte follows it
      return step(c);
    case St::NumFracStart:
      return is_digit(c) && (st_ = St::NumFrac, true);
    case St::NumFrac:
      if (is_digit(c)) return true;
      if (c == 'e' || c == 'E') return st_ = St::NumExpStart, true;
      end_value();
      return step(c);
    case St::NumExpStart:
      if (c == '+' || c == '-') return st_ = St::NumExpSign, true;
      return is_digit(c) && (st_ = St::NumExp, true);
    case St::NumExpSign:
      return is_digit(c) && (st_ = St::NumExp, true);
    case St::NumExp:
      if (is_digit(c)) return true;
      end_value();
      return step(c);
    case St::Lit:
      if (c != (unsigned char)lit_[aux_]) return false;
      if (lit_[++aux_] == 0) end_value();
      return true;
    case St::Done:
      return false;
  }
  return false;
}

// ---- ReplyRule ----

std::string ReplyRule::check(const std::vector<ParsedToolCall>& calls, const std::string& content) const {
  if (kind == Kind::ToolCall) {
    const auto it = std::find_if(calls.begin(), calls.end(), [](const ParsedToolCall& c) { return c.complete; });
    if (it == calls.end()) return "the reply has no complete tool call";
    if (std::find(tools.begin(), tools.end(), it->name) == tools.end())
      return "the reply calls '" + it->name + "', which tool_choice does not allow";
    if (!it->json_ok())
      return "the arguments of the call to '" + it->name + "' are not a JSON object: " + it->arguments.substr(0, 200);
    return "";
  }
  if (kind == Kind::JsonObject) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(content);
    } catch (const nlohmann::json::exception&) {
      return "the reply is not JSON: " + content.substr(0, 200);
    }
    if (!j.is_object()) return "the reply is not a JSON object: " + content.substr(0, 200);
    for (const std::string& k : required)
      if (!j.contains(k)) return "the reply lacks the key '" + k + "' that the schema requires";
  }
  return "";
}

// ---- ReplyConstraint ----

namespace {
ReplyConstraint::Step step(ReplyConstraint::Step::Kind k, int id = -1, std::vector<std::string> alternatives = {},
                           std::vector<int> forbid = {}) {
  ReplyConstraint::Step s;
  s.kind = k;
  s.id = id;
  s.alternatives = std::move(alternatives);
  s.forbid = std::move(forbid);
  return s;
}
}  // namespace

ReplyConstraint::ReplyConstraint(const ChatFormat& fmt, const ReplyRule& rule, bool thinking, std::vector<int> stop_ids)
    : fmt_(fmt), stop_ids_(std::move(stop_ids)), parser_(std::make_unique<ReplyParser>(fmt, thinking)) {
  const Tokenizer& tok = fmt.tokenizer();
  known_.assign(size_t(tok.vocab_size()), 0);
  std::fill(known_.begin(), known_.begin() + tok.n_ranks(), 1);
  for (const SpecialToken& s : tok.specials()) known_[size_t(s.id)] = 1;
  if (rule.kind == ReplyRule::Kind::Free) return;
  check(rule.kind != ReplyRule::Kind::ToolCall || !rule.tools.empty(), "a tool-call constraint needs a tool name");
  auto json = [&] { steps_.push_back(step(Step::Kind::Json)); };
  if (fmt.dialect() == ChatDialect::K2) {
    const ChatFormat::K2Ids& k = fmt.k2();
    auto need = [](int id, const char* what) {
      check(id >= 0, std::string("the tokenizer has no special token ") + what + ": tool_choice needs it");
      return id;
    };
    if (rule.kind == ReplyRule::Kind::ToolCall) {
      add_special(need(k.section_begin, "<|tool_calls_section_begin|>"));
      add_special(need(k.call_begin, "<|tool_call_begin|>"));
      std::vector<std::string> heads;
      for (const std::string& n : rule.tools) heads.push_back("functions." + n + ":0");
      add_text(heads);
      add_special(need(k.argument_begin, "<|tool_call_argument_begin|>"));
      json();
      add_special(need(k.call_end, "<|tool_call_end|>"));
      add_special(need(k.section_end, "<|tool_calls_section_end|>"));
    } else {
      json();
    }
    add_special(fmt.end_of_msg());
    return;
  }
  std::vector<int> forbid = stop_ids_;
  forbid.push_back(fmt.end_of_msg());
  if (thinking) {  // think freely, but leave the channel only by closing it
    std::vector<int> f = forbid;  // <|sep|> too: outside a tag it would reach the reasoning text
    f.push_back(fmt.open_id());
    f.push_back(fmt.sep_id());
    steps_.push_back(step(Step::Kind::FreeUntil, fmt.close_id(), {}, f));
    add_text({"think"});
    add_special(fmt.sep_id());
    add_special(fmt.open_id());
    add_text({"response"});
    add_special(fmt.sep_id());
  }
  if (rule.kind == ReplyRule::Kind::ToolCall) {  // an empty response, then one call
    add_special(fmt.close_id());
    add_text({"response"});
    add_special(fmt.sep_id());
    add_special(fmt.open_id());
    add_text({"tools"});
    add_special(fmt.sep_id());
    add_special(fmt.open_id());
    std::vector<std::string> heads;
    for (const std::string& n : rule.tools) heads.push_back("call tool=\"" + ChatFormat::escape_attribute(n) + "\" index=\"1\"");
    add_text(heads);
    add_special(fmt.sep_id());
    steps_.push_back(step(Step::Kind::FreeCall, -1, {}, forbid));  // typed argument blocks: validated after
    add_special(fmt.close_id());
    add_text({"tools"});
    add_special(fmt.sep_id());
  } else {
    json();
    add_special(fmt.close_id());
    add_text({"response"});
    add_special(fmt.sep_id());
  }
  add_special(fmt.close_id());
  add_text({"message"});
  add_special(fmt.sep_id());
  add_special(fmt.end_of_msg());
}

ReplyConstraint::~ReplyConstraint() = default;

void ReplyConstraint::add_special(int id) { steps_.push_back(step(Step::Kind::Special, id)); }

void ReplyConstraint::add_text(std::vector<std::string> alternatives) {
  steps_.push_back(step(Step::Kind::Text, -1, std::move(alternatives)));
}

bool ReplyConstraint::allowed(const Step& s, int id) const {
  if (id < 0 || size_t(id) >= known_.size() || !known_[size_t(id)]) return false;
  const bool rank = id < fmt_.tokenizer().n_ranks();
  switch (s.kind) {
    case Step::Kind::Special:
      return id == s.id;
    case Step::Kind::Text: {
      if (!rank) return false;
      const std::string_view b = fmt_.tokenizer().token_bytes(id);
      for (const std::string& a : s.alternatives)
        if (a.size() >= s.got.size() + b.size() && a.compare(0, s.got.size(), s.got) == 0 &&
            a.compare(s.got.size(), b.size(), b) == 0)
          return true;
      return false;
    }
    case Step::Kind::Json: {
      if (!rank) return false;
      JsonPrefix j = s.json;
      return j.push(fmt_.tokenizer().token_bytes(id));
    }
    case Step::Kind::FreeUntil:
    case Step::Kind::FreeCall:
      return std::find(s.forbid.begin(), s.forbid.end(), id) == s.forbid.end();
  }
  return false;
}

void ReplyConstraint::mask(float* logits, int n) const {
  if (done()) return;
  const Step& s = steps_[at_];
  int ok = 0;
  for (int id = 0; id < n; ++id) {
    if (allowed(s, id)) ++ok;
    else logits[id] = -std::numeric_limits<float>::infinity();
  }
  check(ok > 0, "constrained decoding: no token of the vocabulary can continue the reply (step " +
                    std::to_string(at_) + " of " + std::to_string(steps_.size()) + ")");
}

void ReplyConstraint::accept(int id) {
  parser_->push(id);
  if (done()) return;
  Step& s = steps_[at_];
  switch (s.kind) {
    case Step::Kind::Special:
      ++at_;
      break;
    case Step::Kind::Text:
      s.got += fmt_.tokenizer().token_bytes(id);
      if (std::find(s.alternatives.begin(), s.alternatives.end(), s.got) != s.alternatives.end()) ++at_;
      break;
    case Step::Kind::Json:
      s.json.push(fmt_.tokenizer().token_bytes(id));
      if (s.json.complete()) ++at_;
      break;
    case Step::Kind::FreeUntil:
      if (id == s.id) ++at_;
      break;
    case Step::Kind::FreeCall:
      if (!parser_->calls().empty() && parser_->calls().back().complete) ++at_;
      break;
  }
}

}  // namespace wren
