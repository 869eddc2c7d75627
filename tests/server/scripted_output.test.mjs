// Tool calls and reasoning through the real `openai` and `@anthropic-ai/sdk` clients. The fixture
// model is random, so the server is started with MOETIER_TEST_FORCED_OUTPUT: every answer begins
// with that text's tokens (the model still runs each step). Everything after the model — the
// stream decoder, the output parser, the API writers, SSE — is the real path.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { startServer } from './harness.mjs';

const kKey = 'sk-scripted';
const kModel = 'qwen3_moe_tiny';
const kEnd = '<|im_end|>'; // the chat's end-of-turn: generation stops there
const tools = [{
  type: 'function',
  function: {
    name: 'get_weather', description: 'The weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  },
}];
const anthropicTools = [{
  name: 'get_weather', description: 'The weather in a city',
  input_schema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
}];
const ask = [{ role: 'user', content: 'Weather in Paris?' }];

function clients(server) {
  return {
    openai: new OpenAI({ baseURL: `${server.baseURL}/v1`, apiKey: kKey, maxRetries: 0 }),
    anthropic: new Anthropic({ baseURL: server.baseURL, apiKey: kKey, maxRetries: 0 }),
  };
}

describe('a tool call', () => {
  let server;
  let c;
  before(async () => {
    const call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>';
    server = await startServer(['--api-key', kKey], { MOETIER_TEST_FORCED_OUTPUT: call + kEnd });
    c = clients(server);
  });
  after(async () => { assert.equal(await server.stop(), 0, server.log()); });

  test('openai: message.tool_calls, finish_reason tool_calls', async () => {
    const r = await c.openai.chat.completions.create({
      model: kModel, messages: ask, tools, max_tokens: 64, temperature: 0,
    });
    const choice = r.choices[0];
    assert.equal(choice.finish_reason, 'tool_calls');
    assert.equal(choice.message.tool_calls.length, 1);
    const call = choice.message.tool_calls[0];
    assert.equal(call.type, 'function');
    assert.equal(call.function.name, 'get_weather');
    assert.deepEqual(JSON.parse(call.function.arguments), { city: 'Paris' });
    assert.ok(call.id.length > 0);
    assert.ok(!choice.message.content, `no content beside the call: ${choice.message.content}`);
  });

  test('openai streamed: delta.tool_calls fragments add up to the call', async () => {
    const stream = await c.openai.chat.completions.create({
      model: kModel, messages: ask, tools, max_tokens: 64, temperature: 0, stream: true,
    });
    let name = '';
    let args = '';
    let id = '';
    let finish = null;
    for await (const chunk of stream) {
      const choice = chunk.choices[0];
      if (!choice) continue;
      for (const t of choice.delta.tool_calls ?? []) {
        assert.equal(t.index, 0);
        if (t.id) id = t.id;
        name += t.function?.name ?? '';
        args += t.function?.arguments ?? '';
      }
      if (choice.finish_reason) finish = choice.finish_reason;
    }
    assert.equal(finish, 'tool_calls');
    assert.equal(name, 'get_weather');
    assert.deepEqual(JSON.parse(args), { city: 'Paris' });
    assert.ok(id.length > 0);
  });

  test('anthropic: a tool_use block, stop_reason tool_use', async () => {
    const m = await c.anthropic.messages.create({
      model: kModel, max_tokens: 64, messages: ask, tools: anthropicTools,
    });
    assert.equal(m.stop_reason, 'tool_use');
    const uses = m.content.filter((b) => b.type === 'tool_use');
    assert.equal(uses.length, 1);
    assert.equal(uses[0].name, 'get_weather');
    assert.deepEqual(uses[0].input, { city: 'Paris' });
  });

  test('anthropic streamed: the final message holds the same tool_use', async () => {
    const stream = c.anthropic.messages.stream({
      model: kModel, max_tokens: 64, messages: ask, tools: anthropicTools,
    });
    const m = await stream.finalMessage();
    assert.equal(m.stop_reason, 'tool_use');
    const use = m.content.find((b) => b.type === 'tool_use');
    assert.equal(use.name, 'get_weather');
    assert.deepEqual(use.input, { city: 'Paris' });
  });
});

describe('reasoning', () => {
  let server;
  let c;
  before(async () => {
    server = await startServer(['--api-key', kKey], {
      MOETIER_TEST_FORCED_OUTPUT: '<think>\nParis is in France.\n</think>\n\nSunny.' + kEnd,
    });
    c = clients(server);
  });
  after(async () => { assert.equal(await server.stop(), 0, server.log()); });

  test('openai: reasoning_content apart from content', async () => {
    const r = await c.openai.chat.completions.create({
      model: kModel, messages: ask, max_tokens: 64, temperature: 0,
    });
    const m = r.choices[0].message;
    assert.equal(r.choices[0].finish_reason, 'stop');
    assert.equal(m.reasoning_content, 'Paris is in France.');
    assert.equal(m.content, 'Sunny.');
  });

  test('anthropic with thinking enabled: a thinking block, then the text', async () => {
    const m = await c.anthropic.messages.create({
      model: kModel, max_tokens: 64, messages: ask,
      thinking: { type: 'enabled', budget_tokens: 1024 },
    });
    assert.equal(m.stop_reason, 'end_turn');
    assert.deepEqual(m.content.map((b) => b.type), ['thinking', 'text']);
    assert.equal(m.content[0].thinking, 'Paris is in France.');
    assert.equal(m.content[1].text, 'Sunny.');
  });
});
