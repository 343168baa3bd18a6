// Server-sent events for a streamed generation: the job's pieces as OpenAI chunks, then [DONE].
#pragma once
#include <httplib.h>

#include <memory>

#include "server/gen_queue.h"

namespace wren::server {

/// Writes the whole stream of `job` to `sink` (`data: {chunk}\n\n` ... `data: [DONE]\n\n`).
/// While the job waits in the queue, an SSE comment is written every second to notice a client
/// that has gone. Returns false (and cancels the job) when a write fails.
bool write_sse(const std::shared_ptr<Job>& job, const ResponseMeta& meta, httplib::DataSink& sink);

}  // namespace wren::server
