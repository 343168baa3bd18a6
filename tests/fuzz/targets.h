// The fuzz targets' bodies, shared by the libFuzzer executables (tests/fuzz/*_fuzz.cpp, built with
// -DWREN_FUZZ=ON) and by the regular test suite, which replays every seed and regression input
// through them (tests/fuzz_regressions_test.cpp). Each returns 0; bad input must end in
// wren::Error (request parsers: RequestError or an nlohmann exception); anything else escapes.
#pragma once
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "loader/config.h"
#include "model/tensor_table.h"
#include "ops/state.h"
#include "runtime/chat_format.h"
#include "server/openai_json.h"
#include "tokenizer/special_tokens.h"
#include "tokenizer/tiktoken_model.h"
#include "tokenizer/tokenizer.h"
#include "fuzz_util.h"

#ifndef WREN_FUZZ_TOKENIZER
#define WREN_FUZZ_TOKENIZER WREN_SOURCE_DIR "/tests/data/k3-tiny-a"
#endif
#ifndef WREN_FUZZ_CONFIG
#define WREN_FUZZ_CONFIG WREN_SOURCE_DIR "/tests/fuzz/corpus/config/golden-k3-tiny-a.json"
#endif

namespace wren::fuzz {

// libFuzzer target: a whole safetensors file (8-byte length, JSON header, data section), opened
// through SafetensorsFile exactly as a shard is; also the header text alone through
// parse_safetensors_header with a data-section size taken from the first input bytes.
inline int safetensors(const uint8_t* data, size_t size) {
  static const std::string path = fuzz::scratch_dir() + "/shard.safetensors";
  fuzz::write_file(path, data, size);
  try {
    SafetensorsFile f(path);
    for (const auto& [name, t] : f.tensors()) {
      const uint8_t* p = f.data(t);
      if (t.nbytes) (void)*(volatile const uint8_t*)(p + t.nbytes - 1);  // every tensor lies in the mapping
    }
  } catch (const Error&) {
  }
  if (size >= 8) {
    uint64_t data_size = 0;
    std::memcpy(&data_size, data, 8);
    try {
      parse_safetensors_header(std::string(reinterpret_cast<const char*>(data) + 8, size - 8), 8 + size,
                               data_size % (uint64_t(1) << 40), "fuzz.safetensors");
    } catch (const Error&) {
    }
  }
  return 0;
}

// libFuzzer target: config.json through parse_config (as load_config parses it), then every size
// derived from an accepted config: the tensor table's shapes, the state and workspace sizes, the
// expert bytes (signed overflow there is undefined behaviour UBSan reports).
inline int config(const uint8_t* data, size_t size) {
  const nlohmann::json doc = nlohmann::json::parse(data, data + size, nullptr, false);
  if (doc.is_discarded()) return 0;
  try {
    const Config c = parse_config(doc, "config.json");
    // The table walk visits 6 tensors per expert: bounded here so that a large (valid) config does
    // not run into libFuzzer's timeout; the shape arithmetic is the same at any size.
    if (int64_t(c.n_layers) * c.n_experts > 4096) return 0;
    ModelWeights w;
    uint64_t elems = 0;
    for_each_tensor(c, w, [&](const TensorSpec& s) {
      uint64_t n = 1;
      for (int64_t d : s.shape) n *= uint64_t(d);
      elems += n;
    });
    (void)elems;
    (void)SequenceState::bytes_for(c, 4096);
    (void)c.expert_bytes();
    (void)c.max_mix_entries();
  } catch (const Error&) {
  }
  return 0;
}

// libFuzzer target: model.safetensors.index.json, opened by Checkpoint next to a valid config.json
// (the seed corpus's golden config, copied in once), then every tensor the table asks for looked up.
inline int index(const uint8_t* data, size_t size) {
  static const std::string dir = [] {
    const std::string d = fuzz::scratch_dir() + "/ckpt";
    std::filesystem::create_directories(d);
    std::filesystem::copy_file(WREN_FUZZ_CONFIG, d + "/config.json",
                               std::filesystem::copy_options::overwrite_existing);
    return d;
  }();
  fuzz::write_file(dir + "/model.safetensors.index.json", data, size);
  try {
    Checkpoint ck(dir);
    ModelWeights w;  // the golden config: 10 layers x 16 experts
    for_each_tensor(ck.config(), w, [&](const TensorSpec& s) { (void)ck.find(s.name); });
  } catch (const Error&) {
  }
  return 0;
}

// libFuzzer target: tokenizer_config.json through load_special_tokens (file read, JSON parse, the
// added_tokens_decoder table) and a Tokenizer built from those specials over a small rank table.
inline int tokenizer_config(const uint8_t* data, size_t size) {
  static const std::string path = fuzz::scratch_dir() + "/tokenizer_config.json";
  fuzz::write_file(path, data, size);
  try {
    std::string ranks;  // 256 single-byte ranks, as tiktoken.model lines "base64 rank"
    static const char* b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int b = 0; b < 256; ++b) {
      const char c0 = b64[b >> 2], c1 = b64[(b & 3) << 4];
      ranks += std::string{c0, c1, '=', '='} + " " + std::to_string(b) + "\n";
    }
    std::vector<SpecialToken> sp = load_special_tokens(path, 256);
    Tokenizer tok(parse_tiktoken_model(ranks, "ranks"), std::move(sp));
    (void)tok.encode("hello <|im_end|> world", SpecialMode::Allowed);
  } catch (const Error&) {
  }
  return 0;
}

// libFuzzer target: tiktoken.model text through parse_tiktoken_model, then a Tokenizer over the
// ranks it accepted encoding and decoding a short text.
inline int tiktoken(const uint8_t* data, size_t size) {
  try {
    RankTable r = parse_tiktoken_model(std::string_view(reinterpret_cast<const char*>(data), size), "tiktoken.model");
    Tokenizer tok(std::move(r), {});
    const std::vector<int> ids = tok.encode("Hello, world! 123 ab");
    (void)tok.decode(ids);
  } catch (const Error&) {
  }
  return 0;
}

// libFuzzer target: an HTTP request body through the OpenAI parsers of `wren serve` (chat and text
// completions). Allowed outcomes are a request, a RequestError (the 4xx the server sends), or an
// nlohmann exception (Server::generate answers those with 400 too); anything else is a crash.
inline int openai_request(const uint8_t* data, size_t size) {
  const std::string body(reinterpret_cast<const char*>(data), size);
  for (bool chat : {true, false}) {
    try {
      const server::GenRequest r = chat ? server::parse_chat_request(body, "k3-tiny-a")
                                        : server::parse_completion_request(body, "k3-tiny-a");
      (void)r;
    } catch (const server::RequestError&) {
    } catch (const nlohmann::json::exception&) {
    }
  }
  return 0;
}

// libFuzzer target: the chat renderer and the reply parser (k3-tiny-a's tokenizer: 4,096 ranks and
// the K3 specials). First byte even: the rest is an OpenAI chat request body; an accepted request
// is rendered as the server renders it (tool declarations, effort note, messages, tool calls and
// tool results). First byte odd: the rest is a reply, two bytes per id, fed to ReplyParser as the
// model's output; the streamed tool-call pieces must join to each call's final arguments. First
// byte 0xFF: the same for the K2 dialect (the k3-tiny-a ranks plus the K2 specials).
inline int chat_k2_reply(const uint8_t* data, size_t size) {
  static const Tokenizer tok = [] {
    RankTable ranks = load_tiktoken_model(std::string(WREN_FUZZ_TOKENIZER) + "/tiktoken.model");
    std::vector<SpecialToken> sp;
    int id = ranks.size();
    for (const char* s : {"<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>",
                          "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
                          "<|tool_call_argument_begin|>", "<|tool_call_end|>"})
      sp.push_back({id++, s});
    return Tokenizer(std::move(ranks), std::move(sp));
  }();
  static const ChatFormat fmt(tok);
  const int n_ranks = tok.n_ranks();
  ReplyParser p(fmt, true);
  std::vector<std::string> joined;
  for (size_t i = 1; i + 1 < size && !p.done(); i += 2) {
    const int v = data[i] | (data[i + 1] << 8);
    const int id = (v & 3) == 0 ? n_ranks + (v >> 2) % 10 : (v >> 2) % n_ranks;  // specials common
    p.push(id);
    for (const ToolCallDelta& d : p.take_deltas()) {
      if (d.index < 0 || d.index > int(joined.size())) __builtin_trap();
      if (d.index == int(joined.size())) joined.emplace_back();
      joined[d.index] += d.arguments;
    }
  }
  for (size_t k = 0; k < p.calls().size() && k < joined.size(); ++k)
    if (joined[k] != p.calls()[k].arguments) __builtin_trap();  // K2 arguments stream byte for byte
  return 0;
}

inline int chat(const uint8_t* data, size_t size) {
  static const Tokenizer tok = Tokenizer::load(WREN_FUZZ_TOKENIZER);
  static const ChatFormat fmt(tok);
  if (size == 0) return 0;
  if (data[0] == 0xFF) return chat_k2_reply(data, size);
  if (data[0] % 2 == 0) {
    const std::string body(reinterpret_cast<const char*>(data) + 1, size - 1);
    try {
      const server::GenRequest r = server::parse_chat_request(body, "k3-tiny-a");
      ChatOptions o;
      o.thinking = r.thinking, o.effort = r.effort, o.tools = r.tools, o.tool_choice = r.tool_choice;
      const std::vector<int> ids = fmt.prompt(r.messages, o);
      for (int id : ids)
        if (id < 0 || id >= tok.vocab_size()) __builtin_trap();  // an id outside the vocabulary
    } catch (const Error&) {  // RequestError included
    } catch (const nlohmann::json::exception&) {
    }
    return 0;
  }
  // Ids from pairs of bytes; values 0-3 of the low byte select the four structural specials so
  // that tags (think, response, tools, call, argument) are common, the rest spans the vocabulary.
  const int specials[4] = {fmt.open_id(), fmt.close_id(), fmt.sep_id(), fmt.end_of_msg()};
  ReplyParser p(fmt, (data[0] & 2) != 0);
  std::vector<std::string> joined;
  for (size_t i = 1; i + 1 < size && !p.done(); i += 2) {
    const int v = data[i] | (data[i + 1] << 8);
    const int id = (v & 7) < 4 ? specials[v & 3] : (v >> 3) % tok.vocab_size();
    p.push(id);
    for (const ToolCallDelta& d : p.take_deltas()) {
      if (d.index < 0 || d.index > int(joined.size())) __builtin_trap();  // calls come in order
      if (d.index == int(joined.size())) joined.emplace_back();
      joined[d.index] += d.arguments;
    }
  }
  for (size_t k = 0; k < p.calls().size() && k < joined.size(); ++k)
    if (p.calls()[k].complete && joined[k] != p.calls()[k].arguments) __builtin_trap();
  return 0;
}

}  // namespace wren::fuzz
