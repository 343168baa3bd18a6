// Kimi pre-tokenizer regex on PCRE2 (see pretokenizer.h).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/pretokenizer.h"

#include <pcre2.h>

#include "core/error.h"
#include "tokenizer/unicode_patch.h"

namespace wren {

namespace {

/// Unicode White_Space (what Rust regex's `\s` matches), as class items without brackets.
constexpr const char* kWs =
    "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";

/// The Kimi pattern with every class spelled for PCRE2 and topped up to Unicode 16 (see .h).
std::string build_pattern() {
  namespace up = unicode_patch;
  const std::string ws = kWs;
  const std::string han = std::string("[\\p{sc:Han}") + up::kHan + "]";
  const std::string upper =
      "(?:(?!" + han + ")[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}" + up::kUpper + "])";
  const std::string lower = "(?:(?!" + han + ")[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}" + up::kLower + "])";
  const std::string letter_number = std::string("\\p{L}\\p{N}") + up::kLetter + up::kNumber;
  const std::string lead = "[^\\r\\n" + letter_number + "]?";
  const std::string tail = "(?i:'s|'t|'re|'ve|'m|'ll|'d)?";
  return han + "+"
         "|" + lead + upper + "*" + lower + "+" + tail +
         "|" + lead + upper + "+" + lower + "*" + tail +
         "|[\\p{N}" + up::kNumber + "]{1,3}"
         "| ?[^" + ws + letter_number + "]+[\\r\\n]*"
         "|[" + ws + "]*[\\r\\n]+"
         "|[" + ws + "]+(?![^" + ws + "])"
         "|[" + ws + "]+";
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof buf);
  return reinterpret_cast<const char*>(buf);
}

/// Per-thread match data and JIT stack (deep backtracking on long letter runs needs more than
/// PCRE2's 32 KiB default machine stack).
struct ThreadState {
  pcre2_match_data* md = nullptr;
  pcre2_jit_stack* stack = nullptr;
  pcre2_match_context* ctx = nullptr;
  ThreadState() {
    md = pcre2_match_data_create(1, nullptr);
    stack = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, nullptr);
    ctx = pcre2_match_context_create(nullptr);
    check(md && stack && ctx, "pre-tokenizer: out of memory creating PCRE2 match state");
    pcre2_jit_stack_assign(ctx, nullptr, stack);
  }
  ~ThreadState() {
    pcre2_match_context_free(ctx);
    pcre2_jit_stack_free(stack);
    pcre2_match_data_free(md);
  }
};

ThreadState& thread_state() {
  thread_local ThreadState st;
  return st;
}

}  // namespace

struct Pretokenizer::Impl {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Impl() { pcre2_code_free(code); }
};

const std::string& Pretokenizer::pcre2_pattern() {
  static const std::string p = build_pattern();
  return p;
}

std::string Pretokenizer::pcre2_unicode_version() {
  char buf[32] = {};
  pcre2_config(PCRE2_CONFIG_UNICODE_VERSION, buf);
  return buf;
}

const std::string& Pretokenizer::tiktoken_pattern() {
  static const std::string p =
      "[\\p{Han}]+|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]*"
      "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}"
      "\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&"
      "[^\\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
      "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  return p;
}

Pretokenizer::Pretokenizer() : impl_(std::make_unique<Impl>()) {
  const std::string& pat = pcre2_pattern();
  int err = 0;
  PCRE2_SIZE off = 0;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pat.data()), pat.size(),
                              PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &err, &off, nullptr);
  check(impl_->code != nullptr, "pre-tokenizer: PCRE2 rejected the Kimi pattern at offset " +
                                    std::to_string(off) + ": " + pcre2_message(err));
  impl_->jit = pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE) == 0;
}

Pretokenizer::~Pretokenizer() = default;
Pretokenizer::Pretokenizer(Pretokenizer&&) noexcept = default;
Pretokenizer& Pretokenizer::operator=(Pretokenizer&&) noexcept = default;

void Pretokenizer::split(std::string_view text,
                         const std::function<void(std::string_view)>& piece) const {
  ThreadState& st = thread_state();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  for (size_t pos = 0; pos < text.size();) {
    const int rc = impl_->jit
                       ? pcre2_jit_match(impl_->code, subject, text.size(), pos, 0, st.md, st.ctx)
                       : pcre2_match(impl_->code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK,
                                     st.md, st.ctx);
    if (rc == PCRE2_ERROR_NOMATCH) return;  // tiktoken drops unmatched text (never happens here)
    check(rc > 0, "pre-tokenizer: PCRE2 match failed at byte " + std::to_string(pos) + ": " +
                      pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.md);
    check(ov[1] > ov[0], "pre-tokenizer: empty match at byte " + std::to_string(ov[0]));
    piece(text.substr(ov[0], ov[1] - ov[0]));
    pos = ov[1];
  }
}

std::vector<std::string_view> Pretokenizer::pieces(std::string_view text) const {
  std::vector<std::string_view> out;
  split(text, [&](std::string_view p) { out.push_back(p); });
  return out;
}

}  // namespace wren
