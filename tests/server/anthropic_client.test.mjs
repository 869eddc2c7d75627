// The real @anthropic-ai/sdk client against `moetier serve` on the Qwen3 fixture (real
// tokenizer and chat template, tiny random weights: answers are gibberish but greedy sampling
// makes them repeatable): whole and streamed messages agree, the stream's events come in the
// order the SDK folds them, count_tokens agrees with usage, thinking and tool history reach the
// template, errors arrive in Anthropic's shape with the field named, an aborted stream leaves
// the server serving, and the API key is enforced.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';

import Anthropic from '@anthropic-ai/sdk';

import { startServer } from './harness.mjs';

const MODEL = 'qwen3_moe_tiny';
const API_KEY = 'anthropic-test-key';
// Enough tokens to see a few pieces stream, few enough that the tiny model answers at once.
const MAX_TOKENS = 12;

// The SDK appends /v1/messages itself: give it the server's root.
function clientFor(baseURL, apiKey = API_KEY) {
  return new Anthropic({ apiKey, baseURL: baseURL.replace(/\/v1\/?$/, ''), maxRetries: 0 });
}

function greedy(messages, extra = {}) {
  return { model: MODEL, max_tokens: MAX_TOKENS, temperature: 0, messages, ...extra };
}

const HELLO = [{ role: 'user', content: 'Say hello in three words.' }];

// The raw events in the order the SDK's MessageStream needs them: message_start, then blocks
// 0, 1, 2, … each started, filled with deltas of its own type and stopped, then message_delta
// and message_stop.
function checkEventOrder(events) {
  assert.equal(events[0].type, 'message_start');
  assert.equal(events.at(-1).type, 'message_stop');
  assert.equal(events.at(-2).type, 'message_delta');
  const deltaFor = { text: 'text_delta', thinking: 'thinking_delta', tool_use: 'input_json_delta' };
  let open = null;
  let next = 0;
  for (const e of events.slice(1, -2)) {
    if (e.type === 'content_block_start') {
      assert.equal(open, null, 'a block started while another is open');
      assert.equal(e.index, next++, 'block indexes ascend from 0');
      open = e;
    } else if (e.type === 'content_block_delta') {
      assert.ok(open && e.index === open.index, 'a delta to the open block');
      assert.equal(e.delta.type, deltaFor[open.content_block.type]);
    } else if (e.type === 'content_block_stop') {
      assert.ok(open && e.index === open.index, 'a stop of the open block');
      open = null;
    } else {
      assert.fail(`unexpected event ${e.type}`);
    }
  }
  assert.equal(open, null, 'every started block is stopped');
}

function textOf(message) {
  return message.content
    .filter((b) => b.type === 'text')
    .map((b) => b.text)
    .join('');
}

describe('@anthropic-ai/sdk against moetier serve', () => {
  let server;
  let client;

  before(async () => {
    server = await startServer(['--api-key', API_KEY]);
    client = clientFor(server.baseURL);
  });
  after(async () => {
    await server?.stop();
  });

  test('a whole message has the Messages API shape', async () => {
    const m = await client.messages.create(greedy(HELLO));
    assert.equal(m.type, 'message');
    assert.equal(m.role, 'assistant');
    assert.match(m.id, /^msg_/);
    assert.equal(m.model, MODEL);
    assert.ok(Array.isArray(m.content));
    assert.ok(['end_turn', 'max_tokens'].includes(m.stop_reason), m.stop_reason);
    assert.equal(m.stop_sequence, null);
    assert.ok(m.usage.input_tokens > 0);
    assert.ok(m.usage.output_tokens >= 1 && m.usage.output_tokens <= MAX_TOKENS);
    if (m.stop_reason === 'max_tokens') assert.equal(m.usage.output_tokens, MAX_TOKENS);
  });

  test('a streamed message equals the whole one, its events in order', async () => {
    const whole = await client.messages.create(greedy(HELLO));
    const events = [];
    const stream = await client.messages.create({ ...greedy(HELLO), stream: true });
    for await (const e of stream) events.push(e);
    checkEventOrder(events);
    assert.equal(events[0].message.usage.input_tokens, whole.usage.input_tokens);
    assert.equal(events.at(-2).delta.stop_reason, whole.stop_reason);
    assert.equal(events.at(-2).usage.output_tokens, whole.usage.output_tokens);

    const folded = await client.messages.stream(greedy(HELLO)).finalMessage();
    assert.deepEqual(folded.content, whole.content);
    assert.equal(folded.stop_reason, whole.stop_reason);
    assert.equal(folded.usage.output_tokens, whole.usage.output_tokens);
  });

  test('max_tokens bounds the answer and says so', async () => {
    const m = await client.messages.create(greedy(HELLO, { max_tokens: 2 }));
    assert.ok(m.usage.output_tokens <= 2);
    if (m.stop_reason === 'max_tokens') assert.equal(m.usage.output_tokens, 2);
    else assert.equal(m.stop_reason, 'end_turn');
  });

  test('a stop sequence taken from the greedy answer ends it there', async () => {
    const whole = await client.messages.create(greedy(HELLO, { max_tokens: 24 }));
    const text = textOf(whole);
    // A few characters (code points, never half a surrogate pair) from the middle of the
    // answer: the same greedy run meets them again.
    const chars = Array.from(text);
    const at = Math.floor(chars.length / 2);
    const stop = chars.slice(at, at + 3).join('');
    if (stop.trim().length === 0) return;  // nothing printable to stop on
    const cut = await client.messages.create(
      greedy(HELLO, { max_tokens: 24, stop_sequences: [stop] }),
    );
    assert.equal(cut.stop_reason, 'stop_sequence');
    assert.equal(cut.stop_sequence, stop);
    assert.ok(!textOf(cut).includes(stop), 'the stop sequence is not in the text');
    assert.ok(text.startsWith(textOf(cut)));
  });

  test('count_tokens agrees with usage.input_tokens', async () => {
    const system = 'You answer briefly.';
    const counted = await client.messages.countTokens({ model: MODEL, system, messages: HELLO });
    const m = await client.messages.create(greedy(HELLO, { system, max_tokens: 1 }));
    assert.ok(counted.input_tokens > 0);
    assert.equal(counted.input_tokens, m.usage.input_tokens);
  });

  test('thinking reaches the template as enable_thinking', async () => {
    // Qwen3's template closes an empty <think></think> in the prompt when thinking is off.
    const on = await client.messages.countTokens({
      model: MODEL,
      messages: HELLO,
      thinking: { type: 'enabled', budget_tokens: 1024 },
    });
    const off = await client.messages.countTokens({
      model: MODEL,
      messages: HELLO,
      thinking: { type: 'disabled' },
    });
    assert.ok(off.input_tokens > on.input_tokens, `${off.input_tokens} vs ${on.input_tokens}`);
  });

  test('tools and a tool-use history are rendered and answered', async () => {
    const tools = [
      {
        name: 'get_weather',
        description: 'Current weather for a city',
        input_schema: {
          type: 'object',
          properties: { city: { type: 'string' } },
          required: ['city'],
        },
      },
    ];
    const history = [
      { role: 'user', content: 'Weather in Paris?' },
      {
        role: 'assistant',
        content: [
          { type: 'thinking', thinking: 'I should call the tool.', signature: '' },
          { type: 'tool_use', id: 'toolu_01', name: 'get_weather', input: { city: 'Paris' } },
        ],
      },
      {
        role: 'user',
        content: [
          { type: 'tool_result', tool_use_id: 'toolu_01', content: '18C and sunny' },
          { type: 'text', text: 'Thanks!' },
        ],
      },
    ];
    const bare = await client.messages.countTokens({ model: MODEL, messages: HELLO });
    const withTools = await client.messages.countTokens({ model: MODEL, messages: HELLO, tools });
    assert.ok(withTools.input_tokens > bare.input_tokens + 10, 'the tool schema is in the prompt');

    const m = await client.messages.create(greedy(history, { tools }));
    assert.ok(['end_turn', 'max_tokens', 'tool_use'].includes(m.stop_reason), m.stop_reason);
    for (const block of m.content) {
      if (block.type !== 'tool_use') continue;
      assert.match(block.id, /^toolu_/);
      assert.equal(typeof block.input, 'object');
    }
  });

  test('a bad request is a 400 in Anthropic shape naming the field', async () => {
    const image = {
      type: 'image',
      source: { type: 'base64', media_type: 'image/png', data: 'iVBORw0K' },
    };
    const cases = [
      [[{ role: 'user', content: [image] }], 'messages.0.content.0.type'],
      [[{ role: 'system', content: 'x' }], 'messages.0.role'],
      [[], 'messages'],
    ];
    for (const [messages, field] of cases) {
      await assert.rejects(client.messages.create(greedy(messages)), (err) => {
        assert.ok(err instanceof Anthropic.BadRequestError, String(err));
        assert.equal(err.status, 400);
        assert.equal(err.error.type, 'error');
        assert.equal(err.error.error.type, 'invalid_request_error');
        assert.ok(err.error.error.message.includes(field), err.error.error.message);
        return true;
      });
    }
    await assert.rejects(
      client.messages.create({ model: MODEL, messages: HELLO }),
      (err) => err.status === 400 && err.error.error.message.includes('max_tokens'),
    );
  });

  test('an aborted stream leaves the server serving', async () => {
    const stream = client.messages.stream(greedy(HELLO, { max_tokens: 64 }));
    let seen = 0;
    for await (const e of stream) {
      if (e.type === 'content_block_delta' && ++seen === 2) {
        stream.abort();
        break;
      }
    }
    const m = await client.messages.create(greedy(HELLO, { max_tokens: 2 }));
    assert.ok(m.usage.output_tokens >= 1);
  });

  test('the API key is required and checked', async () => {
    await assert.rejects(
      clientFor(server.baseURL, 'wrong-key').messages.create(greedy(HELLO)),
      (err) => {
        assert.ok(err instanceof Anthropic.AuthenticationError, String(err));
        assert.equal(err.status, 401);
        return true;
      },
    );
  });
});
