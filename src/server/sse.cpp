// Streaming a job as server-sent events.
#include "server/sse.h"

namespace wren::server {

namespace {

nlohmann::json delta_chunk(const ResponseMeta& m, bool chat, const Piece& p) {
  if (!chat) return completion_chunk(m, p.text, "");
  return chat_chunk(m, {{p.reasoning ? "reasoning_content" : "content", p.text}}, "");
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
  for (bool done = false; !done;) {
    std::vector<Piece> pieces;
    done = job->take(pieces, std::chrono::milliseconds(1000));
    for (const Piece& p : pieces)
      if (!data(delta_chunk(meta, chat, p))) return false;
    if (pieces.empty() && !done && !send(": waiting\n\n")) return false;
  }
  const GenResult& r = job->result();
  if (!job->error().empty()) {
    if (!data(error_json("generation failed: " + job->error(), "server_error", "", ""))) return false;
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
