#!/usr/bin/env node
// Soak benchmark for an OpenAI-compatible chat server (moetier serve, llama-server, ...).
//
// N clients loop for D seconds against POST {url}/v1/chat/completions, each request drawn from a
// fixed mix: short and long prompts, streaming and not, and a tenth that are malformed (must be
// answered 400 with an OpenAI-shaped error) or cancelled mid-stream (aborted after the first
// chunks). Every valid answer is checked: status 200, a well-formed body or an SSE stream ending
// in [DONE], a finish_reason, usage consistent with the request and with itself, and greedy answers
// to the same prompt equal to each other. With --pid the server's VmRSS is sampled every second.
// Prints one JSON object on stdout and a readable summary on stderr; exits 1 when a valid request
// failed, a request hung or the connection broke, or the server process went away.
//
// Node 20, no packages: `node bench/server/soak.mjs --help`.

import { readFileSync } from 'node:fs';

const USAGE = `Usage: node bench/server/soak.mjs [options]
  --url URL            server base URL (default http://127.0.0.1:8080)
  --clients N          concurrent clients (default 64)
  --seconds D          how long new requests are started (default 600)
  --max-tokens N       max_tokens of every valid request (default 64)
  --model NAME         "model" sent in requests (default: the first id of GET /v1/models)
  --pid PID            the server's process id: sample /proc/PID/status VmRSS every second
  --label TEXT         a name for this run, copied into the JSON
  --warmup S           seconds excluded from the figures and the memory baseline
                       (default: a tenth of --seconds, at most 60)
  --long-words N       words in a long prompt (default 300: ~400 tokens, so a prompt and its
                       answer fit llama-server's per-slot context of -c 8192 / -np 16 = 512)
  --request-timeout S  a request not finished after S seconds counts as hung (default 300)
  --seed N             seed of the request mix (default 1)
  --api-key KEY        sent as Authorization: Bearer KEY
  --quiet              no progress lines on stderr`;

const OPTIONS = {
  url: 'http://127.0.0.1:8080', clients: 64, seconds: 600, 'max-tokens': 64, model: '',
  pid: 0, label: '', warmup: -1, 'long-words': 300, 'request-timeout': 300, seed: 1,
  'api-key': '',
};
const NUMERIC = new Set(['clients', 'seconds', 'max-tokens', 'pid', 'warmup', 'long-words',
  'request-timeout', 'seed']);

// Shares of the request mix, in percent. Malformed + cancelled = a tenth of all requests.
const MIX = { malformed: 5, cancelled: 5 };
const LONG_SHARE = 0.25;       // of valid requests, the share with a long prompt
const STREAM_SHARE = 0.5;      // of valid requests, the share streamed
const GREEDY_SHARE = 0.5;      // of valid requests, greedy on a prompt from a small fixed pool
// Distinct pooled prompts: repeats let the greedy answers be compared.
const POOL_SHORT = 8;
const POOL_LONG = 4;
const CANCEL_AFTER_MAX = 3;    // a cancelled stream is aborted after 1..this many chunks
const HEALTH_WAIT_S = 600;     // how long to wait for GET /health to answer 200 before starting
const DRAIN_GRACE_S = 30;      // after --seconds, in-flight requests get their timeout plus this
const PROGRESS_EVERY_S = 10;

function parseArgs(argv) {
  const o = { ...OPTIONS, quiet: false };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === '-h' || a === '--help') { console.log(USAGE); process.exit(0); }
    if (a === '--quiet') { o.quiet = true; continue; }
    const name = a.startsWith('--') ? a.slice(2) : '';
    if (!(name in OPTIONS)) die(`unknown option '${a}' (see --help)`);
    if (i + 1 >= argv.length) die(`${a} needs a value (see --help)`);
    const v = argv[++i];
    if (NUMERIC.has(name)) {
      const n = Number(v);
      if (!Number.isFinite(n) || n < 0) die(`${a} must be a number >= 0, got '${v}'`);
      o[name] = n;
    } else {
      o[name] = v;
    }
  }
  if (o.clients < 1 || o['max-tokens'] < 1 || o.seconds <= 0) {
    die('--clients, --max-tokens and --seconds must be at least 1');
  }
  if (o.warmup < 0) o.warmup = Math.min(60, o.seconds / 10);
  if (o.warmup >= o.seconds) {
    die(`--warmup ${o.warmup} must be shorter than --seconds ${o.seconds}`);
  }
  o.url = o.url.replace(/\/+$/, '');
  return o;
}

function die(msg) {
  console.error(`soak.mjs: ${msg}`);
  process.exit(2);
}

// Small deterministic PRNG (mulberry32): the same --seed gives each client the same requests.
function rng(seed) {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const WORDS = ('the of and to in is that for it as was with be by on not he this are or his from ' +
  'at which but have an they you were their one all we can her has there been if more when will ' +
  'would who so no river market engine window garden number silver morning letter history paper ' +
  'station mountain program theory summer language machine island memory signal harbor kernel ' +
  'batch token expert layer cache thread buffer server request answer question').split(' ');

function words(rand, n) {
  const out = [];
  for (let i = 0; i < n; i++) out.push(WORDS[Math.floor(rand() * WORDS.length)]);
  return out.join(' ');
}

function makePool(opts) {
  const r = rng(0x5eed);
  const short = [];
  const long = [];
  for (let i = 0; i < POOL_SHORT; i++) short.push(`Question ${i}: ${words(r, 12)}?`);
  for (let i = 0; i < POOL_LONG; i++) {
    long.push(`Summarize document ${i}.\n${words(r, opts['long-words'])}`);
  }
  return { short, long };
}

// Malformed bodies: each must be answered 400 with {"error": {"message": ...}}. Each carries a
// small max_tokens, so that a lenient server which answers one anyway does not generate up to its
// context.
const BAD_TAIL = '"max_tokens": 4}';
const HI = '"messages": [{"role": "user", "content": "hi"}]';
const MALFORMED = [
  ['bad_json', () => `{${HI}, ${BAD_TAIL.slice(0, -1)}`],
  ['not_an_object', () => '[1, 2, 3]'],
  ['messages_wrong_type', (m) => JSON.stringify({ model: m, messages: 'hello', max_tokens: 4 })],
  ['content_wrong_type', (m) =>
    JSON.stringify({ model: m, messages: [{ role: 'user', content: 42 }], max_tokens: 4 })],
  ['unknown_role', (m) =>
    JSON.stringify({ model: m, messages: [{ role: 'wizard', content: 'hi' }], max_tokens: 4 })],
  ['max_tokens_wrong_type', (m) => `{"model": ${JSON.stringify(m)}, ${HI}, "max_tokens": "ten"}`],
  ['max_tokens_huge', (m) =>
    `{"model": ${JSON.stringify(m)}, ${HI}, "max_tokens": 99999999999999999999999}`],
  ['number_overflow', (m) =>
    `{"model": ${JSON.stringify(m)}, ${HI}, "temperature": 1e400, ${BAD_TAIL}`],
  ['temperature_out_of_range', (m) =>
    `{"model": ${JSON.stringify(m)}, ${HI}, "temperature": 1e300, ${BAD_TAIL}`],
  ['missing_messages', (m) => JSON.stringify({ model: m, max_tokens: 4 })],
];

function percentiles(xs) {
  if (xs.length === 0) return { n: 0, p50: null, p90: null, p99: null };
  const s = [...xs].sort((a, b) => a - b);
  const at = (q) => s[Math.min(s.length - 1, Math.max(0, Math.ceil(q * s.length) - 1))];
  const r3 = (x) => Math.round(x * 1000) / 1000;
  return { n: s.length, p50: r3(at(0.5)), p90: r3(at(0.9)), p99: r3(at(0.99)) };
}

class Stats {
  constructor() {
    this.errors = {};          // kind -> count (failures of the server)
    this.errorExamples = {};   // kind -> first message
    this.malformed = {};       // case -> {"400 openai": n, "400 other shape": n, "STATUS": n}
    this.counts = { valid_ok: 0, valid_failed: 0, malformed: 0, cancelled: 0,
      cancelled_finished_first: 0, started: 0 };
    // measured: valid_ok and completion_tokens finished within the window; requests: started in it.
    this.ttft = [];            // seconds, streamed valid requests started after warm-up
    this.decodeTps = [];       // per-request decode tokens/s, same requests
    this.latency = [];         // seconds, whole request, valid requests after warm-up
    this.measured = { valid_ok: 0, completion_tokens: 0, requests: 0 };
    this.window = [0, 0];      // [end of warm-up, end of --seconds], seconds since start
    this.greedy = new Map();   // prompt key -> {text, finish, n}
    this.promptTokens = new Map();  // prompt key -> prompt_tokens first seen
    this.greedyMismatch = 0;
    this.greedyMismatchExample = null;
  }

  error(kind, msg) {
    this.errors[kind] = (this.errors[kind] || 0) + 1;
    if (!(kind in this.errorExamples)) this.errorExamples[kind] = String(msg).slice(0, 300);
  }
}

function checkUsage(usage, req, stats, where) {
  const isInt = (x) => Number.isInteger(x) && x >= 0;
  if (!usage || typeof usage !== 'object') return 'no usage';
  const { prompt_tokens: p, completion_tokens: c, total_tokens: t } = usage;
  if (!isInt(p) || !isInt(c) || !isInt(t)) {
    return `usage fields not whole numbers: ${JSON.stringify(usage)}`;
  }
  if (p < 1) return `prompt_tokens ${p} < 1`;
  if (t !== p + c) return `total_tokens ${t} != ${p} + ${c}`;
  if (c > req.max_tokens) return `completion_tokens ${c} > max_tokens ${req.max_tokens}`;
  if (where.finish === 'length' && c !== req.max_tokens) {
    return `finish_reason length but completion_tokens ${c} != max_tokens ${req.max_tokens}`;
  }
  if (where.finish === 'stop' && c < 1) return 'finish_reason stop with 0 completion tokens';
  if (req.key) {
    const seen = stats.promptTokens.get(req.key);
    if (seen === undefined) stats.promptTokens.set(req.key, p);
    else if (seen !== p) return `prompt_tokens ${p} for a prompt answered before with ${seen}`;
  }
  return null;
}

const FINISH = new Set(['stop', 'length', 'tool_calls']);

function checkGreedy(req, text, finish, stats) {
  if (!req.greedy) return;
  const g = stats.greedy.get(req.key);
  if (!g) { stats.greedy.set(req.key, { text, finish, n: 1 }); return; }
  g.n++;
  if (g.text !== text || g.finish !== finish) {
    stats.greedyMismatch++;
    if (!stats.greedyMismatchExample) {
      stats.greedyMismatchExample =
        { prompt: req.key, first: g.text.slice(0, 120), now: text.slice(0, 120) };
    }
  }
}

async function postChat(opts, body, signal) {
  const headers = { 'content-type': 'application/json' };
  if (opts['api-key']) headers.authorization = `Bearer ${opts['api-key']}`;
  return fetch(`${opts.url}/v1/chat/completions`, { method: 'POST', headers, body, signal });
}

// Reads an SSE body, calling onEvent(dataString, tSeconds) per data line; comments are skipped.
async function readSse(res, onEvent) {
  const decoder = new TextDecoder();
  let buf = '';
  for await (const chunk of res.body) {
    buf += decoder.decode(chunk, { stream: true });
    let nl;
    while ((nl = buf.indexOf('\n')) >= 0) {
      const line = buf.slice(0, nl).replace(/\r$/, '');
      buf = buf.slice(nl + 1);
      if (line.startsWith('data:')) {
        if (onEvent(line.slice(5).trimStart(), now()) === false) return false;
      }
    }
  }
  return true;
}

const T0 = performance.now();
const now = () => (performance.now() - T0) / 1000;

async function runValid(opts, req, stats, measured) {
  const t0 = now();
  const body = JSON.stringify(req.body);
  const ctl = new AbortController();
  const timer = setTimeout(() => ctl.abort(), opts['request-timeout'] * 1000);
  try {
    const res = await postChat(opts, body, ctl.signal);
    if (res.status !== 200) {
      const text = await res.text();
      return fail(`status_${res.status}`, text);
    }
    return req.body.stream ? await checkStream(res) : await checkJson(res);
  } catch (e) {
    if (ctl.signal.aborted) return fail('hung', `no answer within ${opts['request-timeout']} s`);
    const why = e.cause ? `${e.message}: ${e.cause.code || e.cause.message}` : e.message;
    return fail('transport', why);
  } finally {
    clearTimeout(timer);
  }

  function fail(kind, msg) {
    stats.counts.valid_failed++;
    stats.error(kind, msg);
    return false;
  }

  function ok(completionTokens) {
    stats.counts.valid_ok++;
    const t = now();
    // Throughput counts completions inside the measured window; latencies, requests started in it.
    if (t >= stats.window[0] && t < stats.window[1]) {
      stats.measured.valid_ok++;
      stats.measured.completion_tokens += completionTokens;
    }
    if (measured) stats.latency.push(t - t0);
    return true;
  }

  async function checkJson(res) {
    const text = await res.text();
    let j;
    try {
      j = JSON.parse(text);
    } catch {
      return fail('bad_body', `not JSON: ${text.slice(0, 200)}`);
    }
    const ch = j && Array.isArray(j.choices) ? j.choices[0] : null;
    if (!j || j.object !== 'chat.completion' || !ch || !ch.message) {
      return fail('bad_body', `not a chat.completion: ${text.slice(0, 200)}`);
    }
    const m = ch.message;
    if (m.role !== 'assistant') return fail('bad_body', `message.role ${m.role}`);
    if (m.content !== null && typeof m.content !== 'string') {
      return fail('bad_body', 'content not a string');
    }
    if (!FINISH.has(ch.finish_reason)) {
      return fail('no_finish_reason', `finish_reason ${ch.finish_reason}`);
    }
    const u = checkUsage(j.usage, req, stats, { finish: ch.finish_reason });
    if (u) return fail('bad_usage', u);
    const answer = (m.reasoning_content || '') + '|' + (m.content || '');
    checkGreedy(req, answer, ch.finish_reason, stats);
    return ok(j.usage.completion_tokens);
  }

  async function checkStream(res) {
    const ct = res.headers.get('content-type') || '';
    if (!ct.startsWith('text/event-stream')) return fail('bad_stream', `content-type ${ct}`);
    let done = false;
    let afterDone = false;
    let firstRole = null;
    let chunks = 0;
    let contentChunks = 0;
    let finish = null;
    let usage = null;
    let tFirst = null;
    let tLast = null;
    let reasoning = '';
    let content = '';
    let problem = null;
    await readSse(res, (data, t) => {
      if (done) { afterDone = true; return false; }
      if (data === '[DONE]') { done = true; return true; }
      let j;
      try {
        j = JSON.parse(data);
      } catch {
        problem = `chunk not JSON: ${data.slice(0, 200)}`;
        return false;
      }
      if (!j || j.object !== 'chat.completion.chunk') {
        problem = `not a chunk: ${data.slice(0, 200)}`;
        return false;
      }
      chunks++;
      if (j.usage) usage = j.usage;
      const ch = Array.isArray(j.choices) ? j.choices[0] : null;
      if (!ch) return true;  // the usage chunk has no choices
      const d = ch.delta || {};
      if (chunks === 1) firstRole = d.role;
      const piece = (d.content || '') + (d.reasoning_content || '');
      if (piece.length > 0) {
        contentChunks++;
        if (tFirst === null) tFirst = t;
        tLast = t;
      }
      content += d.content || '';
      reasoning += d.reasoning_content || '';
      if (ch.finish_reason) {
        if (finish !== null) { problem = 'two finish_reasons'; return false; }
        finish = ch.finish_reason;
        tLast = t;
      }
      return true;
    });
    if (problem) return fail('bad_stream', problem);
    if (!done) return fail('stream_no_done', `stream ended without [DONE] after ${chunks} chunks`);
    if (afterDone) return fail('bad_stream', 'data after [DONE]');
    if (firstRole !== 'assistant') return fail('stream_no_role', `first delta role ${firstRole}`);
    if (!FINISH.has(finish)) return fail('no_finish_reason', `finish_reason ${finish}`);
    const u = checkUsage(usage, req, stats, { finish });
    if (u) return fail('bad_usage', u);
    if (contentChunks > usage.completion_tokens + 1) {
      const n = usage.completion_tokens;
      return fail('bad_usage', `${contentChunks} content chunks for ${n} tokens`);
    }
    checkGreedy(req, reasoning + '|' + content, finish, stats);
    if (measured && tFirst !== null) {
      stats.ttft.push(tFirst - t0);
      if (usage.completion_tokens >= 2 && tLast > tFirst) {
        stats.decodeTps.push((usage.completion_tokens - 1) / (tLast - tFirst));
      }
    }
    return ok(usage.completion_tokens);
  }
}

function isOpenAiError(text) {
  try {
    const j = JSON.parse(text);
    return j && typeof j.error === 'object' && j.error !== null &&
      typeof j.error.message === 'string' &&
      j.error.message.length > 0 && typeof j.error.type === 'string';
  } catch {
    return false;
  }
}

async function runMalformed(opts, name, body, stats) {
  stats.counts.malformed++;
  const outcome = (k) => {
    const m = (stats.malformed[name] ||= {});
    m[k] = (m[k] || 0) + 1;
  };
  const ctl = new AbortController();
  const timer = setTimeout(() => ctl.abort(), opts['request-timeout'] * 1000);
  try {
    const res = await postChat(opts, body, ctl.signal);
    const text = await res.text();
    if (res.status === 400 && isOpenAiError(text)) { outcome('400 openai'); return; }
    if (res.status === 400) {
      outcome('400 other shape');
      stats.error('malformed_400_not_openai_shape', `${name}: ${text.slice(0, 200)}`);
      return;
    }
    outcome(String(res.status));
    stats.error('malformed_not_400', `${name}: ${res.status} ${text.slice(0, 200)}`);
  } catch (e) {
    outcome('transport');
    stats.error(ctl.signal.aborted ? 'hung' : 'transport', `${name}: ${e.message}`);
  } finally {
    clearTimeout(timer);
  }
}

async function runCancelled(opts, req, after, stats) {
  stats.counts.cancelled++;
  const ctl = new AbortController();
  const timer = setTimeout(() => ctl.abort('timeout'), opts['request-timeout'] * 1000);
  let chunks = 0;
  try {
    const res = await postChat(opts, JSON.stringify(req.body), ctl.signal);
    if (res.status !== 200) {
      stats.error(`status_${res.status}`, `cancelled request: ${(await res.text()).slice(0, 200)}`);
      return;
    }
    const finished = await readSse(res, (data) => {
      if (data === '[DONE]') return true;
      if (++chunks >= after) { ctl.abort('cancel'); return false; }
      return true;
    });
    if (finished) stats.counts.cancelled_finished_first++;
  } catch (e) {
    if (ctl.signal.reason === 'cancel') return;  // aborting the body may throw: that is the point
    const kind = ctl.signal.reason === 'timeout' ? 'hung' : 'transport';
    stats.error(kind, `cancelled request: ${e.message}`);
  } finally {
    clearTimeout(timer);
  }
}

function makeRequest(opts, r, pool, model, stream) {
  const long = r() < LONG_SHARE;
  const greedy = r() < GREEDY_SHARE;
  let prompt;
  let key = null;
  if (greedy) {
    const list = long ? pool.long : pool.short;
    const i = Math.floor(r() * list.length);
    prompt = list[i];
    key = `${long ? 'long' : 'short'}${i}`;
  } else {
    // A unique prompt: new prefill work, nothing for the prefix cache beyond the template.
    prompt = long ? `Summarize this.\n${words(r, opts['long-words'])}` : `${words(r, 12)}?`;
  }
  const body = {
    model, messages: [{ role: 'user', content: prompt }], max_tokens: opts['max-tokens'],
    temperature: greedy ? 0 : 0.8, stream,
  };
  if (!greedy) body.seed = Math.floor(r() * 1e6);
  if (stream) body.stream_options = { include_usage: true };
  return { body, key, greedy, max_tokens: opts['max-tokens'], long };
}

async function client(id, opts, pool, model, stats, until, warmupEnd) {
  const r = rng(opts.seed * 1000003 + id);
  while (now() < until) {
    const t = now();
    const measured = t >= warmupEnd;
    stats.counts.started++;
    if (measured) stats.measured.requests++;
    const dice = r() * 100;
    if (dice < MIX.malformed) {
      const [name, make] = MALFORMED[Math.floor(r() * MALFORMED.length)];
      await runMalformed(opts, name, make(model), stats);
    } else if (dice < MIX.malformed + MIX.cancelled) {
      const req = makeRequest(opts, r, pool, model, true);
      await runCancelled(opts, req, 1 + Math.floor(r() * CANCEL_AFTER_MAX), stats);
    } else {
      const req = makeRequest(opts, r, pool, model, r() < STREAM_SHARE);
      await runValid(opts, req, stats, measured);
    }
  }
}

function readRssKb(pid) {
  try {
    const m = /VmRSS:\s+(\d+)\s+kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) : null;
  } catch {
    return null;
  }
}

// moetier's KV pool gauges from GET /metrics (null from a server without them): a host pool's
// resident memory grows until every block has been touched once, which separates that growth
// from a leak.
async function readKvBlocks(opts) {
  try {
    const headers = opts['api-key'] ? { authorization: `Bearer ${opts['api-key']}` } : {};
    const res = await fetch(`${opts.url}/metrics`, { headers, signal: AbortSignal.timeout(2000) });
    if (!res.ok) return null;
    const text = await res.text();
    const gauge = (name) => {
      const m = new RegExp(`^${name} (\\d+)$`, 'm').exec(text);
      return m ? Number(m[1]) : null;
    };
    const touched = gauge('moetier_kv_blocks_touched');
    const total = gauge('moetier_kv_blocks_total');
    return touched === null || total === null ? null : { touched, total };
  } catch {
    return null;
  }
}

function kvReport(samples, warmupEnd) {
  const after = samples.filter((s) => s.t >= warmupEnd);
  if (after.length === 0) return null;
  return {
    total_blocks: after[0].total, touched_after_warmup: after[0].touched,
    touched_at_end: after[after.length - 1].touched,
  };
}

function rssReport(samples, warmupEnd, start) {
  const after = samples.filter((s) => s.t >= warmupEnd);
  if (after.length === 0) return null;
  const mb = (kb) => Math.round(kb / 1024 * 10) / 10;
  const kbs = after.map((s) => s.kb);
  // Least-squares slope over the samples after warm-up: growth that a noisy start/end pair hides.
  const n = after.length;
  const mt = after.reduce((a, s) => a + s.t, 0) / n;
  const mk = kbs.reduce((a, k) => a + k, 0) / n;
  let num = 0;
  let den = 0;
  for (const s of after) { num += (s.t - mt) * (s.kb - mk); den += (s.t - mt) ** 2; }
  const slope = den > 0 ? num / den : 0;
  const series = [];
  const step = Math.max(1, Math.ceil(samples.length / 60));
  for (let i = 0; i < samples.length; i += step) {
    series.push([Math.round(samples[i].t - start), mb(samples[i].kb)]);
  }
  return {
    samples: samples.length, at_start_mb: mb(samples[0].kb), after_warmup_mb: mb(kbs[0]),
    at_end_mb: mb(kbs[kbs.length - 1]), min_after_warmup_mb: mb(Math.min(...kbs)),
    max_after_warmup_mb: mb(Math.max(...kbs)),
    slope_mb_per_min: Math.round(slope * 60 / 1024 * 100) / 100, series_s_mb: series,
  };
}

async function waitHealthy(opts) {
  const deadline = now() + HEALTH_WAIT_S;
  let last = '';
  while (now() < deadline) {
    try {
      const res = await fetch(`${opts.url}/health`);
      last = `${res.status} ${(await res.text()).slice(0, 100)}`;
      if (res.status === 200) return;
    } catch (e) {
      last = e.cause ? e.cause.code || e.message : e.message;
    }
    await new Promise((r) => setTimeout(r, 500));
  }
  die(`${opts.url}/health did not answer 200 within ${HEALTH_WAIT_S} s (last: ${last})`);
}

async function pickModel(opts) {
  if (opts.model) return opts.model;
  try {
    const headers = opts['api-key'] ? { authorization: `Bearer ${opts['api-key']}` } : {};
    const j = await (await fetch(`${opts.url}/v1/models`, { headers })).json();
    const first = j && Array.isArray(j.data) ? j.data[0] : null;
    if (first && typeof first.id === 'string') return first.id;
  } catch { /* fall through: servers that ignore the name accept any */ }
  return 'default';
}

function summary(out) {
  const f = (p, unit) =>
    (p.n ? `p50 ${p.p50} / p90 ${p.p90} / p99 ${p.p99} ${unit} (n=${p.n})` : 'none');
  const lines = [
    `soak ${out.label || ''}: ${out.url}, ${out.clients} clients, ${out.seconds} s (+ drain ` +
      `${out.drain_s} s), warm-up ${out.warmup_s} s, max_tokens ${out.max_tokens}, ` +
      `model ${out.model}`,
    `requests started: ${out.counts.started} (valid ok ${out.counts.valid_ok}, valid failed ` +
      `${out.counts.valid_failed}, malformed ${out.counts.malformed}, ` +
      `cancelled ${out.counts.cancelled})`,
    `after warm-up: ${out.requests_per_s} valid requests/s, ` +
      `${out.generated_tokens_per_s} generated tokens/s`,
    `time to first token: ${f(out.ttft_s, 's')}`,
    `decode tokens/s per request: ${f(out.decode_tokens_per_s, 'tok/s')}`,
    `request latency: ${f(out.latency_s, 's')}`,
    `errors: ${Object.keys(out.errors).length ? JSON.stringify(out.errors) : 'none'}`,
  ];
  for (const [k, v] of Object.entries(out.error_examples)) lines.push(`  first ${k}: ${v}`);
  lines.push(`malformed answers: ${JSON.stringify(out.malformed)}`);
  lines.push(`greedy repeats: ${out.greedy.compared} compared, ${out.greedy.mismatched} differed` +
    (out.greedy.example ? ` (e.g. ${JSON.stringify(out.greedy.example)})` : ''));
  if (out.rss) {
    const r = out.rss;
    lines.push(`VmRSS: start ${r.at_start_mb} MB, after warm-up ${r.after_warmup_mb} MB, end ` +
      `${r.at_end_mb} MB (min ${r.min_after_warmup_mb}, max ${r.max_after_warmup_mb}, ` +
      `slope ${r.slope_mb_per_min} MB/min)`);
  }
  if (out.kv_blocks) {
    const k = out.kv_blocks;
    lines.push(`KV blocks touched: ${k.touched_after_warmup} after warm-up, ${k.touched_at_end} at ` +
      `the end, of ${k.total_blocks} (a host pool's RAM grows until all have been)`);
  }
  if (out.server_gone) lines.push(`SERVER PROCESS ${out.pid} WENT AWAY`);
  lines.push(out.ok ? 'OK' : 'FAILED');
  return lines.join('\n');
}

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  if (opts.pid && readRssKb(opts.pid) === null) {
    die(`--pid ${opts.pid}: no /proc/${opts.pid}/status with VmRSS`);
  }
  await waitHealthy(opts);
  const model = await pickModel(opts);
  const pool = makePool(opts);
  const stats = new Stats();
  const start = now();
  const until = start + opts.seconds;
  const warmupEnd = start + opts.warmup;
  stats.window = [warmupEnd, until];

  const rss = [];
  let serverGone = false;
  const sampler = opts.pid ? setInterval(() => {
    const kb = readRssKb(opts.pid);
    if (kb === null) serverGone = true; else rss.push({ t: now(), kb });
  }, 1000) : null;
  if (opts.pid) rss.push({ t: now(), kb: readRssKb(opts.pid) });
  const kv = [];
  const kvSampler = setInterval(async () => {
    const k = await readKvBlocks(opts);
    if (k) kv.push({ t: now(), ...k });
  }, 1000);
  const progress = opts.quiet ? null : setInterval(() => {
    console.error(`[${Math.round(now() - start)} s] started ${stats.counts.started}, ok ` +
      `${stats.counts.valid_ok}, failed ${stats.counts.valid_failed}` +
      (rss.length ? `, VmRSS ${Math.round(rss[rss.length - 1].kb / 1024)} MB` : ''));
  }, PROGRESS_EVERY_S * 1000);

  const clients = [];
  for (let i = 0; i < opts.clients; i++) {
    clients.push(client(i, opts, pool, model, stats, until, warmupEnd));
  }
  await Promise.all(clients);
  const end = now();
  if (sampler) clearInterval(sampler);
  if (progress) clearInterval(progress);
  clearInterval(kvSampler);
  if (opts.pid && readRssKb(opts.pid) === null) serverGone = true;

  const measuredS = Math.max(1e-9, until - warmupEnd);
  const out = {
    label: opts.label, url: opts.url, model, clients: opts.clients, seconds: opts.seconds,
    warmup_s: opts.warmup, drain_s: Math.round((end - until) * 10) / 10,
    max_tokens: opts['max-tokens'], long_words: opts['long-words'], seed: opts.seed,
    counts: stats.counts, measured: stats.measured,
    requests_per_s: Math.round(stats.measured.valid_ok / measuredS * 100) / 100,
    all_requests_per_s: Math.round(stats.measured.requests / measuredS * 100) / 100,
    generated_tokens_per_s: Math.round(stats.measured.completion_tokens / measuredS * 10) / 10,
    ttft_s: percentiles(stats.ttft), decode_tokens_per_s: percentiles(stats.decodeTps),
    latency_s: percentiles(stats.latency),
    errors: stats.errors, error_examples: stats.errorExamples, malformed: stats.malformed,
    greedy: {
      prompts: stats.greedy.size,
      compared: [...stats.greedy.values()].reduce((a, g) => a + g.n - 1, 0),
      mismatched: stats.greedyMismatch, example: stats.greedyMismatchExample,
    },
    pid: opts.pid || null, rss: opts.pid ? rssReport(rss, warmupEnd, start) : null,
    kv_blocks: kvReport(kv, warmupEnd),
    server_gone: serverGone,
  };
  // Failures of the server: a valid request answered wrongly, a hang, a broken connection, or
  // the process gone. Malformed-request answers of another shape are counted, not failed (other
  // servers shape errors their own way); greedy mismatches are reported (batching may change
  // low bits of the logits on servers that do not promise otherwise).
  const fatal = ['hung', 'transport'];
  out.ok = stats.counts.valid_failed === 0 && !serverGone && !fatal.some((k) => stats.errors[k]);
  console.log(JSON.stringify(out));
  console.error(summary(out));
  process.exit(out.ok ? 0 : 1);
}

main().catch((e) => { console.error(`soak.mjs: ${e.stack || e}`); process.exit(2); });
