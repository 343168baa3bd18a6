// Bounded load test for `wren serve` with the openai client: N requests, C at a time.
// Usage: node load.js PORT [N=200] [C=8] [MAX_TOKENS=16]
// Prints requests/s and p50/p99 latency (ms) as one JSON line.
'use strict';
const OpenAI = require('openai').default;

async function main() {
  const port = process.argv[2];
  const n = Number(process.argv[3] || 200), conc = Number(process.argv[4] || 8), maxTokens = Number(process.argv[5] || 16);
  const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'none', timeout: 300000, maxRetries: 0 });
  const prompts = ['Once upon a time', 'The capital of France is', 'def fib(n):', 'Hello, my name is'];
  const lat = [];
  let next = 0, failed = 0, tokens = 0;
  async function worker() {
    while (next < n) {
      const i = next++;
      const t0 = process.hrtime.bigint();
      try {
        const r = await client.completions.create({ prompt: prompts[i % prompts.length], max_tokens: maxTokens, temperature: 0 });
        tokens += r.usage.completion_tokens;
      } catch (e) {
        failed++;
      }
      lat.push(Number(process.hrtime.bigint() - t0) / 1e6);
    }
  }
  const t0 = process.hrtime.bigint();
  await Promise.all(Array.from({ length: conc }, worker));
  const wall = Number(process.hrtime.bigint() - t0) / 1e9;
  lat.sort((a, b) => a - b);
  const pct = (p) => lat[Math.min(lat.length - 1, Math.ceil((p / 100) * lat.length) - 1)];
  console.log(JSON.stringify({ requests: n, concurrency: conc, max_tokens: maxTokens, failed, wall_s: +wall.toFixed(3),
    requests_per_s: +(n / wall).toFixed(2), completion_tokens_per_s: +(tokens / wall).toFixed(1),
    p50_ms: +pct(50).toFixed(1), p99_ms: +pct(99).toFixed(1) }));
}

main().catch((e) => { console.error(e); process.exit(1); });
