// Streaming a job as server-sent events.
#include "server/sse.h"

namespace wren::server {

namespace {

/// The chunk of one piece; `offset` is the completion text sent so far (for text_offset).
nlohmann::json delta_chunk(const ResponseMeta& m, const GenRequest& req, const Piece& p, size_t& offset) {
  using nlohmann::json;
  if (!req.chat) {
    const json lp = req.logprobs ? completion_logprobs_json(p.logprobs, offset) : json(nullptr);
    for (const LogprobEntry& e : p.logprobs) offset += e.token.size();  // as the non-streamed offsets
    return completion_chunk(m, p.text, "", lp);
  }
  if (p.kind == Piece::Kind::Reasoning) return chat_chunk(m, {{"reasoning_content", p.text}}, "");
  if (p.kind == Piece::Kind::Tool) {
    json call = {{"index", p.tool.index}, {"function", {{"arguments", p.tool.arguments}}}};
    if (!p.tool.name.empty()) {
      call["id"] = p.tool_id;
      call["type"] = "function";
      call["function"]["name"] = p.tool.name;
    }
    return chat_chunk(m, {{"tool_calls", json::array({call})}}, "");
  }
  return chat_chunk(m, {{"content", p.text}}, "", req.logprobs ? chat_logprobs_json(p.logprobs) : json(nullptr));
}

}  // namespace

bool write_sse(const std::shared_ptr<Job>& job, const ResponseMeta& meta, httplib::DataSink& sink) {
  const bool chat = job->req.chat;
  auto send = [&](const std::string& s) {
    if (sink.is_writable() && sink.write(s.data(), s.size())) return true;
    job->cancel();
    return false;
  };
  auto data = [&](const nlohmann::json& j) { return send("data: " + dump(j) + "\n\n"); };
  if (chat && !data(chat_chunk(meta, {{"role", "assistant"}, {"content", ""}}, ""))) return false;
  size_t offset = 0;
  for (bool done = false; !done;) {
    std::vector<Piece> pieces;
    done = job->take(pieces, std::chrono::milliseconds(1000));
    for (const Piece& p : pieces)
      if (!data(delta_chunk(meta, job->req, p, offset))) return false;
    if (pieces.empty() && !done && !send(": waiting\n\n")) return false;
  }
  const GenResult& r = job->result();
  if (!job->error().empty()) {
    if (!data(error_json("generation failed: " + job->error(), "server_error", "", ""))) return false;
  } else if (!r.invalid.empty()) {
    if (!data(error_json(r.invalid, "server_error", "", "invalid_model_output"))) return false;
  } else {
    if (!data(chat ? chat_chunk(meta, nlohmann::json::object(), r.finish_reason)
                   : completion_chunk(meta, "", r.finish_reason)))
      return false;
    if (job->req.include_usage && !data(usage_chunk(meta, chat, r))) return false;
  }
  if (!send("data: [DONE]\n\n")) return false;
  sink.done();
  return true;
}

}  // namespace wren::server
