// The real `openai` npm client against `moetier serve` on the fixture model: what a user's script
// does works, and the server's errors reach it as the SDK's own error types.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { startServer, fixtureDir } from './harness.mjs';

const kKey = 'sk-moetier-test';
const kModelName = 'qwen3_moe_tiny'; // the fixture directory's name
const messages = [{ role: 'user', content: 'Write a haiku about experts.' }];

let server;
let client;

before(async () => {
  server = await startServer(['--api-key', kKey, '--parallel', '2']);
  client = new OpenAI({ baseURL: `${server.baseURL}/v1`, apiKey: kKey, maxRetries: 0 });
});

after(async () => {
  const code = await server.stop();
  assert.equal(code, 0, `moetier serve did not stop cleanly:\n${server.log()}`);
});

// The text of a streamed chat answer, and what came with it.
async function collect(stream) {
  const out = { text: '', roles: [], finish: null, usage: null, chunks: 0 };
  for await (const chunk of stream) {
    out.chunks += 1;
    if (chunk.usage) out.usage = chunk.usage;
    const choice = chunk.choices[0];
    if (!choice) continue;
    if (choice.delta.role) out.roles.push(choice.delta.role);
    out.text += (choice.delta.reasoning_content ?? '') + (choice.delta.content ?? '');
    if (choice.finish_reason) out.finish = choice.finish_reason;
  }
  return out;
}

test('chat completion', async () => {
  const r = await client.chat.completions.create({
    model: kModelName, messages, max_tokens: 8, temperature: 0,
  });
  assert.equal(r.object, 'chat.completion');
  assert.match(r.id, /^chatcmpl-/);
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason), r.choices[0].finish_reason);
  assert.ok(r.usage.prompt_tokens > 0);
  assert.ok(r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= 8);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
});

test('streaming with include_usage gives the same answer as a whole', async () => {
  const request = { model: kModelName, messages, max_tokens: 10, temperature: 0 };
  const whole = await client.chat.completions.create(request);
  const m = whole.choices[0].message;
  const expected = (m.reasoning_content ?? '') + (m.content ?? '');

  const s = await collect(await client.chat.completions.create({
    ...request, stream: true, stream_options: { include_usage: true },
  }));
  assert.deepEqual(s.roles, ['assistant']); // the first delta only
  assert.equal(s.text, expected);
  assert.equal(s.finish, whole.choices[0].finish_reason);
  assert.ok(s.usage, 'no usage chunk');
  assert.equal(s.usage.prompt_tokens, whole.usage.prompt_tokens);
  assert.equal(s.usage.completion_tokens, whole.usage.completion_tokens);
  // The same prompt again: its prefix comes from the prefix cache.
  assert.ok(s.usage.prompt_tokens_details.cached_tokens >= 0);
});

test('completions, streamed or not', async () => {
  const request = { model: kModelName, prompt: 'Once upon a time', max_tokens: 6, temperature: 0 };
  const whole = await client.completions.create(request);
  assert.equal(whole.object, 'text_completion');
  assert.equal(typeof whole.choices[0].text, 'string');
  let text = '';
  for await (const chunk of await client.completions.create({ ...request, stream: true })) {
    text += chunk.choices[0]?.text ?? '';
  }
  assert.equal(text, whole.choices[0].text);
});

test('logprobs: chat whole and streamed, and completions', async () => {
  const request = {
    model: kModelName, messages, max_tokens: 8, temperature: 0, logprobs: true, top_logprobs: 3,
  };
  const whole = await client.chat.completions.create(request);
  const entries = whole.choices[0].logprobs.content;
  assert.equal(entries.length, whole.usage.completion_tokens);
  const bytes = [];
  for (const e of entries) {
    assert.ok(e.logprob <= 0, `${e.logprob}`);
    assert.equal(e.top_logprobs.length, 3);
    assert.equal(e.top_logprobs[0].token, e.token, 'greedy: the most likely token');
    assert.equal(e.top_logprobs[0].logprob, e.logprob);
    const mass = e.top_logprobs.reduce((sum, t) => sum + Math.exp(t.logprob), 0);
    assert.ok(mass <= 1 + 1e-6, `the alternatives' probabilities sum to ${mass}`);
    bytes.push(...e.bytes);
  }
  const m = whole.choices[0].message;
  const answer = (m.reasoning_content ?? '') + (m.content ?? '');
  if (whole.choices[0].finish_reason === 'length') {
    assert.equal(new TextDecoder().decode(new Uint8Array(bytes)).includes(answer), true);
  }

  const streamed = [];
  for await (const chunk of await client.chat.completions.create({ ...request, stream: true })) {
    streamed.push(...(chunk.choices[0]?.logprobs?.content ?? []));
  }
  assert.deepEqual(streamed, entries);

  const plain = await client.chat.completions.create({ ...request, logprobs: false, top_logprobs: undefined });
  assert.equal(plain.choices[0].logprobs, null);

  const c = await client.completions.create({
    model: kModelName, prompt: 'Once upon a time', max_tokens: 5, temperature: 0, logprobs: 2,
  });
  const lp = c.choices[0].logprobs;
  assert.equal(lp.tokens.length, c.usage.completion_tokens);
  assert.equal(lp.token_logprobs.length, lp.tokens.length);
  assert.equal(lp.top_logprobs.length, lp.tokens.length);
  assert.equal(lp.text_offset[0], 0);
  if (c.choices[0].finish_reason === 'length') assert.equal(lp.tokens.join(''), c.choices[0].text);
  await assert.rejects(
    client.completions.create({ model: kModelName, prompt: 'x', suffix: 'y' }),
    (e) => e instanceof OpenAI.BadRequestError && /suffix/.test(e.message));
});

test('models list', async () => {
  const ids = [];
  for await (const model of client.models.list()) ids.push(model.id);
  assert.deepEqual(ids, [kModelName]);
});

test('a refused request surfaces as BadRequestError', async () => {
  await assert.rejects(
    client.chat.completions.create({ model: kModelName, messages, n: 2 }),
    (e) => {
      assert.ok(e instanceof OpenAI.BadRequestError, `${e.constructor.name}: ${e.message}`);
      assert.equal(e.status, 400);
      assert.match(e.message, /\bn\b/);
      return true;
    });
  await assert.rejects(
    client.chat.completions.create({ model: kModelName, messages: [{ role: 'wizard', content: 'x' }] }),
    OpenAI.BadRequestError);
});

test('a wrong key surfaces as AuthenticationError', async () => {
  const stranger = new OpenAI({ baseURL: `${server.baseURL}/v1`, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(stranger.models.list(), OpenAI.AuthenticationError);
});

test('aborting a stream cancels it and the server goes on', async () => {
  const stream = await client.chat.completions.create({
    model: kModelName, messages, max_tokens: 2000, temperature: 0, stream: true,
  });
  let chunks = 0;
  for await (const chunk of stream) {
    void chunk;
    chunks += 1;
    if (chunks === 3) {
      stream.controller.abort(); // closes the connection: the server cancels the request
      break;
    }
  }
  assert.equal(chunks, 3);
  const next = await client.chat.completions.create({
    model: kModelName, messages, max_tokens: 2, temperature: 0,
  });
  assert.equal(next.choices.length, 1);
  assert.equal(next.usage.completion_tokens, 2);
});

// The server renders, tokenizes and samples as the CLI does: greedy answers through the API equal
// `moetier generate --chat` for the same message. The CLI runs without blocking the event loop:
// a loop blocked past the server's keep-alive (5 s) would send the next request on a connection
// the server has closed.
test('greedy answer equals moetier generate --chat', async () => {
  const kTokens = 12;
  const prompt = messages[0].content;
  const { stdout } = await promisify(execFile)(process.env.MOETIER_CLI, [
    'generate', '--model', fixtureDir, '--prompt', prompt, '--chat', '-n', String(kTokens),
    '--threads', '1',
  ], { encoding: 'utf8' });
  const cli = stdout.replace(/\n$/, '');
  const r = await client.chat.completions.create({
    model: kModelName, messages, max_tokens: kTokens, temperature: 0,
  });
  const m = r.choices[0].message;
  assert.equal(r.usage.completion_tokens, kTokens);
  assert.equal((m.reasoning_content ?? '') + (m.content ?? ''), cli);
});

// `moetier logits` of `ids` from another process: every position's row, [ids.length, vocab].
async function moetierLogits(ids) {
  const dir = await mkdtemp(path.join(tmpdir(), 'moetier-logits-'));
  const out = path.join(dir, 'logits.bin');
  await promisify(execFile)(process.env.MOETIER_CLI, [
    'logits', '--model', fixtureDir, '--tokens', ids.join(','), '--out', out, '--threads', '1',
  ]);
  const raw = await readFile(out);
  await rm(dir, { recursive: true });
  const logits = new Float32Array(raw.buffer, raw.byteOffset, raw.byteLength / 4);
  const vocab = logits.length / ids.length;
  assert.equal(vocab, Math.round(vocab));
  return { logits, vocab };
}

// What an evaluation harness (lm-eval's local-completions) sends to score a continuation: the
// prompt as token ids, echo, logprobs 1, one token. Each prompt token's log-probability is the
// log-softmax of `moetier logits` at the position before it, written by another process.
test('echoed token prompt: log-probabilities equal moetier logits', async () => {
  const ids = [9707, 11, 1879, 0, 576, 374, 264, 1273, 13];
  const { logits, vocab } = await moetierLogits(ids);

  const r = await client.completions.create({
    model: kModelName, prompt: ids, max_tokens: 1, logprobs: 1, echo: true, temperature: 0,
  });
  const lp = r.choices[0].logprobs;
  assert.equal(lp.tokens.length, ids.length + 1);
  assert.equal(lp.token_logprobs[0], null);
  assert.equal(lp.top_logprobs[0], null);
  assert.equal(r.choices[0].text.startsWith(lp.tokens.slice(0, ids.length).join('')), true);
  for (let i = 1; i <= ids.length; ++i) {
    const row = logits.subarray((i - 1) * vocab, i * vocab);
    let max = -Infinity;
    for (const v of row) max = Math.max(max, v);
    let sum = 0;
    for (const v of row) sum += Math.exp(v - max);
    const logZ = max + Math.log(sum);
    const alternatives = Object.values(lp.top_logprobs[i]);
    assert.equal(alternatives.length, 1);
    assert.ok(Math.abs(alternatives[0] - (max - logZ)) < 1e-3, `top at ${i}`);
    if (i < ids.length) {
      const expected = row[ids[i]] - logZ;
      assert.ok(Math.abs(lp.token_logprobs[i] - expected) < 1e-3,
        `prompt token ${i}: ${lp.token_logprobs[i]} against ${expected}`);
    } else {
      assert.equal(lp.token_logprobs[i], alternatives[0], 'greedy: the generated token is the top');
    }
  }
});

// logit_bias through the client: banning the greedy token gives the next most likely (by
// `moetier logits` from another process; log-probabilities stay those of the model's logits),
// +100 forces a token, and a token outside the vocabulary is a 400 naming logit_bias.
test('logit_bias bans and forces tokens', async () => {
  const ids = [9707, 11, 1879, 0, 576, 374];
  const { logits, vocab } = await moetierLogits(ids);
  const row = Array.from(logits.subarray((ids.length - 1) * vocab));
  const order = row.map((v, i) => i).sort((a, b) => row[b] - row[a] || a - b);
  const max = row[order[0]];
  const logZ = max + Math.log(row.reduce((sum, v) => sum + Math.exp(v - max), 0));

  const banned = await client.completions.create({
    model: kModelName, prompt: ids, max_tokens: 1, temperature: 0, logprobs: 1,
    logit_bias: { [order[0]]: -100 },
  });
  const got = banned.choices[0].logprobs.token_logprobs[0];
  assert.ok(Math.abs(got - (row[order[1]] - logZ)) < 1e-3,
    `banned the greedy token ${order[0]}: ${got} against the next ${row[order[1]] - logZ}`);

  // The text of token ids[2], as the echoed prompt shows it; forced three times.
  const echo = await client.completions.create({
    model: kModelName, prompt: ids, max_tokens: 1, temperature: 0, logprobs: 0, echo: true,
  });
  const text = echo.choices[0].logprobs.tokens[2];
  const forced = await client.completions.create({
    model: kModelName, prompt: ids, max_tokens: 3, temperature: 0.8, seed: 5,
    logit_bias: { [ids[2]]: 100 },
  });
  assert.equal(forced.choices[0].text, text.repeat(3));

  await assert.rejects(
    client.completions.create({
      model: kModelName, prompt: ids, max_tokens: 1, logit_bias: { [vocab]: 5 },
    }),
    (e) => e instanceof OpenAI.BadRequestError && /logit_bias/.test(e.message));
});
