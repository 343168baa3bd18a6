// Drives `wren serve` with the official openai npm client (tests/serve_test.cpp).
// Usage: node client.js PORT 'JSON list of requests' [--parallel]
// Each request: {"kind": "chat"|"completion", "stream": bool, "params": {...OpenAI body...}}.
// Prints one JSON list: per request {content, reasoning, finish_reason, usage, chunks, tool_calls,
// logprobs} or {error}. Streamed tool_calls are assembled from delta.tool_calls by index; streamed
// logprobs are the concatenation of the chunks' logprobs (chat: content entries; completions: the
// parallel lists).
'use strict';
let OpenAI;
try {
  OpenAI = require('openai').default;
} catch (e) {
  console.error('tests/serve: the openai package is missing; run: npm ci --prefix tests/serve');
  process.exit(3);
}

async function one(client, r) {
  const body = { ...r.params, stream: !!r.stream };
  if (r.stream) body.stream_options = { include_usage: true };
  const api = r.kind === 'chat' ? client.chat.completions : client.completions;
  if (!r.stream) {
    const res = await api.create(body);
    const c = res.choices[0];
    return r.kind === 'chat'
      ? { content: c.message.content, reasoning: c.message.reasoning_content || '', finish_reason: c.finish_reason, usage: res.usage, chunks: 0,
          tool_calls: c.message.tool_calls || [], logprobs: c.logprobs }
      : { content: c.text, reasoning: '', finish_reason: c.finish_reason, usage: res.usage, chunks: 0, logprobs: c.logprobs };
  }
  const out = { content: '', reasoning: '', finish_reason: null, usage: null, chunks: 0, tool_calls: [], logprobs: null,
                tool_call_chunks: 0 };
  const addLogprobs = (lp) => {
    if (!lp) return;
    if (r.kind === 'chat') {
      out.logprobs = out.logprobs || { content: [] };
      out.logprobs.content.push(...(lp.content || []));
    } else {
      out.logprobs = out.logprobs || { tokens: [], token_logprobs: [], top_logprobs: [], text_offset: [] };
      for (const k of Object.keys(out.logprobs)) out.logprobs[k].push(...(lp[k] || []));
    }
  };
  for await (const chunk of await api.create(body)) {
    out.chunks++;
    if (chunk.usage) out.usage = chunk.usage;
    const c = chunk.choices[0];
    if (!c) continue;
    addLogprobs(c.logprobs);
    if (r.kind === 'chat') {
      out.content += c.delta.content || '';
      out.reasoning += c.delta.reasoning_content || '';
      for (const t of c.delta.tool_calls || []) {
        out.tool_call_chunks++;
        const slot = (out.tool_calls[t.index] = out.tool_calls[t.index] || { id: '', type: '', function: { name: '', arguments: '' } });
        if (t.id) slot.id = t.id;
        if (t.type) slot.type = t.type;
        if (t.function && t.function.name) slot.function.name += t.function.name;
        if (t.function && t.function.arguments) slot.function.arguments += t.function.arguments;
      }
    } else {
      out.content += c.text || '';
    }
    if (c.finish_reason) out.finish_reason = c.finish_reason;
  }
  return out;
}

async function main() {
  const [port, spec, mode] = process.argv.slice(2);
  const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: process.env.WREN_TEST_API_KEY || 'none', timeout: 120000, maxRetries: 0 });
  const reqs = JSON.parse(spec);
  const run = (r) => one(client, r).catch((e) => ({ error: String(e && e.message ? e.message : e), status: e.status }));
  let results;
  if (mode === '--parallel') {
    results = await Promise.all(reqs.map(run));
  } else {
    results = [];
    for (const r of reqs) results.push(await run(r));
  }
  console.log(JSON.stringify(results));
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
