// GET /residency in headless Chromium against `moetier serve` on the fixture model: the page
// shows one row per MoE layer with its tier, and its live figures change while a long streaming
// chat completion runs.
//
// Chromium is driven through the DevTools protocol over a pipe (--remote-debugging-pipe: JSON
// messages ended by a NUL byte, Chromium reading fd 3 and writing fd 4), so the test needs no npm
// package. It is skipped, saying why, when Chromium is not installed ($CHROMIUM or
// /usr/bin/chromium; scripts/setup.sh installs Debian's `chromium`).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, fixtureDir } from './harness.mjs';

const chromiumPath = process.env.CHROMIUM ?? '/usr/bin/chromium';
const skip = fs.existsSync(chromiumPath)
  ? false
  : `Chromium is not installed at ${chromiumPath} (apt-get install chromium, or set $CHROMIUM)`;

// The page refreshes once a second; a loaded CI machine may be slow to start Chromium and to
// render, so waits are generous.
const kWaitMs = 60_000;
const kPollMs = 100;
// Enough tokens that the answer is still streaming after several of the page's refreshes.
const kLongAnswerTokens = 12000;

// The MoE layers of a Qwen3-MoE config.json: every layer not in mlp_only_layers whose number
// (from 1) is a multiple of decoder_sparse_step.
function qwen3MoeLayers(config) {
  const layers = [];
  const step = config.decoder_sparse_step ?? 1;
  for (let i = 0; i < config.num_hidden_layers; i++) {
    if (!(config.mlp_only_layers ?? []).includes(i) && (i + 1) % step === 0) layers.push(i);
  }
  return layers;
}

// A DevTools-protocol connection over Chromium's pipe.
class Browser {
  constructor() {
    this.profile = fs.mkdtempSync(path.join(os.tmpdir(), 'moetier-chromium-'));
    this.child = spawn(chromiumPath, [
      '--headless', '--remote-debugging-pipe', '--no-sandbox', '--disable-gpu',
      '--no-first-run', '--no-default-browser-check', `--user-data-dir=${this.profile}`,
      'about:blank',
    ], { stdio: ['ignore', 'ignore', 'pipe', 'pipe', 'pipe'], detached: true });
    // detached: Chromium and its helper processes form their own process group, which close()
    // ends as a whole.
    this.stderr = '';
    this.child.stderr.setEncoding('utf8');
    this.child.stderr.on('data', (t) => { this.stderr += t; });
    this.nextId = 1;
    this.pending = new Map();
    this.exited = new Promise((resolve) => this.child.on('exit', resolve));
    this.exited.then(() => {
      for (const { reject } of this.pending.values()) {
        reject(new Error(`chromium exited:\n${this.stderr}`));
      }
      this.pending.clear();
    });
    let buffered = Buffer.alloc(0);
    this.child.stdio[4].on('data', (chunk) => {
      buffered = Buffer.concat([buffered, chunk]);
      for (let end = buffered.indexOf(0); end >= 0; end = buffered.indexOf(0)) {
        this.dispatch(JSON.parse(buffered.subarray(0, end).toString('utf8')));
        buffered = buffered.subarray(end + 1);
      }
    });
  }

  dispatch(message) {
    const waiting = this.pending.get(message.id);
    if (!waiting) return; // an event: none is needed here
    this.pending.delete(message.id);
    if (message.error) waiting.reject(new Error(`${waiting.method}: ${message.error.message}`));
    else waiting.resolve(message.result);
  }

  send(method, params = {}, sessionId = undefined) {
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject, method });
      this.child.stdio[3].write(JSON.stringify({ id, method, params, sessionId }) + '\0');
    });
  }

  // A new tab showing `url`; returns a function that evaluates an expression in it.
  async open(url) {
    const { targetId } = await this.send('Target.createTarget', { url });
    const { sessionId } = await this.send('Target.attachToTarget', { targetId, flatten: true });
    return async (expression) => {
      const r = await this.send('Runtime.evaluate', { expression, returnByValue: true },
                                sessionId);
      if (r.exceptionDetails) {
        const d = r.exceptionDetails;
        throw new Error(`${expression}: ${d.exception?.description ?? d.text}`);
      }
      return r.result.value;
    };
  }

  async close() {
    // The profile is thrown away, so nothing needs a graceful shutdown: kill the whole group at
    // once (a SIGTERM'd browser on a busy machine took most of a minute to exit, and its helpers
    // went on writing the profile after it had).
    killGroup(this.child.pid);
    await this.exited;
    await waitUntilGroupGone(this.child.pid);
    try {
      fs.rmSync(this.profile, { recursive: true, force: true, maxRetries: 20, retryDelay: 250 });
    } catch (e) {
      // A leftover temporary profile is untidy, not a failure of what this file tests.
      console.error(`# could not remove ${this.profile}: ${e.message}`);
    }
  }
}

function killGroup(pid) {
  try {
    process.kill(-pid, 'SIGKILL');
  } catch (e) {
    if (e.code !== 'ESRCH') throw e;
  }
}

// Resolves once no process of the group is left (signal 0 probes without sending anything).
async function waitUntilGroupGone(pid) {
  const deadline = Date.now() + kWaitMs;
  while (Date.now() < deadline) {
    try {
      process.kill(-pid, 0);
    } catch (e) {
      if (e.code === 'ESRCH') return;
      throw e;
    }
    await new Promise((r) => setTimeout(r, kPollMs));
  }
}

// Polls `probe` until it returns something truthy; fails saying what it waited for.
async function waitFor(what, probe) {
  const deadline = Date.now() + kWaitMs;
  let last;
  while (Date.now() < deadline) {
    last = await probe();
    if (last) return last;
    await new Promise((r) => setTimeout(r, kPollMs));
  }
  throw new Error(`timed out after ${kWaitMs} ms waiting for ${what} (last: ${JSON.stringify(last)})`);
}

// What the page shows, read from its cells' data-value attributes (the raw figures).
const kReadPage = `(() => {
  if (!document.getElementById('layers')) return null; // still loading
  const value = (el) => (el ? el.dataset.value : undefined);
  const rows = [...document.querySelectorAll('#layers tbody tr')].map((tr) => ({
    layer: Number(tr.dataset.layer),
    planned: value(tr.querySelector('[data-field=planned]')),
    settled: value(tr.querySelector('[data-field=settled]')),
    calls: Number(value(tr.querySelector('[data-field=calls]'))),
  }));
  return {
    state: document.getElementById('status').dataset.state,
    status: document.getElementById('status').textContent,
    rows,
    calls: Number(value(document.querySelector('#layers tfoot [data-field=calls]'))),
    generated: Number(value(document.getElementById('tokens-generated'))),
    forwarded: Number(value(document.getElementById('tokens-forwarded'))),
    forwardedPerSecond: Number(value(document.getElementById('forwarded-per-second')) || 0),
    statsOff: !document.getElementById('stats-off').hidden,
  };
})()`;

let server;
let browser;

before(async () => {
  if (skip) return;
  server = await startServer();
  browser = new Browser();
});

after(async () => {
  // The server stops even when closing the browser fails: a server left running keeps the test
  // process alive until ctest's timeout.
  try {
    if (browser) await browser.close();
  } finally {
    if (server) {
      const code = await server.stop();
      assert.equal(code, 0, `moetier serve did not stop cleanly:\n${server.log()}`);
    }
  }
});

test('the page shows each MoE layer and its live figures change during a request', { skip },
  async () => {
    const config = JSON.parse(fs.readFileSync(path.join(fixtureDir, 'config.json'), 'utf8'));
    const moeLayers = qwen3MoeLayers(config);
    const res = await fetch(`${server.baseURL}/v1/residency`);
    const body = await res.text();
    assert.equal(res.status, 200, `GET /v1/residency answered ${res.status}: ${body}`);
    const json = JSON.parse(body);

    const evaluate = await browser.open(`${server.baseURL}/residency`);
    const first = await waitFor('the page to show its first update', async () => {
      const p = await evaluate(kReadPage);
      return p && p.state === 'live' && p.rows.length > 0 ? p : null;
    });
    assert.equal(first.statsOff, false, 'the server should collect expert statistics');
    assert.deepEqual(first.rows.map((r) => r.layer), moeLayers);
    for (const [i, row] of first.rows.entries()) {
      // No GPU in the test: every layer is in host memory that the CPU executor reads.
      assert.ok(['locked', 'pageable'].includes(row.settled), JSON.stringify(row));
      assert.equal(row.planned, json.layers[i].planned);
      assert.equal(row.settled, json.layers[i].settled);
    }

    const request = new AbortController();
    let streaming = true;
    const answer = fetch(`${server.baseURL}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({
        messages: [{ role: 'user', content: 'Tell me a very long story.' }],
        max_tokens: kLongAnswerTokens, temperature: 0, stream: true,
      }),
      signal: request.signal,
    }).then(async (res) => {
      assert.equal(res.status, 200);
      for await (const chunk of res.body) void chunk; // drained until the answer ends
    }).catch((e) => {
      if (e.name !== 'AbortError') throw e;
    }).finally(() => { streaming = false; });

    const live = await waitFor('the page to show the request\'s progress', async () => {
      const p = await evaluate(kReadPage);
      return p.calls > first.calls && p.forwarded > first.forwarded && p.forwardedPerSecond > 0
        ? { ...p, streaming } : null;
    });
    assert.ok(live.streaming, 'the page should change while the answer streams, not only after');
    assert.ok(live.rows.every((r) => r.calls > 0), JSON.stringify(live.rows));
    assert.equal(live.state, 'live', live.status);

    // A cancelled answer's tokens count as generated too, once the service has counted them.
    request.abort();
    await answer;
    await waitFor('the page to count the generated tokens', async () => {
      const p = await evaluate(kReadPage);
      return p.generated > first.generated ? p : null;
    });
  });
