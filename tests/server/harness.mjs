// Starts `moetier serve` ($MOETIER_CLI; ctest sets it) on the realvocab Qwen3 fixture (real
// tokenizer and chat template, tiny random weights: greedy answers are gibberish but
// deterministic) on a free port, for the npm client tests.
//
//   const server = await startServer(['--api-key', 'k']);
//   server.baseURL   // the server's root, "http://127.0.0.1:PORT" (no /v1: the OpenAI client
//                    // wants `${baseURL}/v1`, the Anthropic client the root itself)
//   server.log()     // what the server wrote to stderr so far
//   await server.stop()  // SIGTERM; resolves to the exit code once the process has ended
import { spawn } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
export const fixtureDir = path.join(here, '..', 'fixtures', 'hf', 'realvocab', 'qwen3_moe_tiny');

// Loading the fixture takes well under a second; a loaded CI machine may take far longer.
const kStartTimeoutMs = 120_000;
// How long stop() waits after SIGTERM before SIGKILL (a clean stop cancels what is in flight
// and ends within an engine step).
const kStopTimeoutMs = 20_000;
const kHealthPollMs = 50;

// Small settings that keep the fixture light: one compute thread, a modest KV cache.
const kDefaultArgs = ['--threads', '1', '--ctx-size', '16384'];

// `env`: variables added to the server's environment (e.g. MOETIER_TEST_FORCED_OUTPUT).
export async function startServer(extraArgs = [], env = {}) {
  const cli = process.env.MOETIER_CLI;
  if (!cli) {
    throw new Error('MOETIER_CLI is not set: point it at the built moetier binary ' +
                    '(ctest sets it)');
  }
  const args = ['serve', '--model', fixtureDir, '--host', '127.0.0.1', '--port', '0',
                ...kDefaultArgs, ...extraArgs];
  const child = spawn(cli, args, {
    stdio: ['ignore', 'ignore', 'pipe'], env: { ...process.env, ...env },
  });
  let stderr = '';
  const exited = new Promise((resolve) => {
    child.on('exit', (code, signal) => resolve(code ?? 128 + (signal === 'SIGKILL' ? 9 : 15)));
  });
  // The pipe is drained for the server's whole life, or a chatty server would block on it.
  child.stderr.setEncoding('utf8');
  child.stderr.on('data', (text) => { stderr += text; });

  const kill = () => { if (child.exitCode === null) child.kill('SIGKILL'); };
  try {
    const baseURL = await waitListening(child, () => stderr, exited);
    await waitHealthy(baseURL, () => stderr, exited);
    return {
      baseURL,
      log: () => stderr,
      stop: async () => {
        if (child.exitCode === null) child.kill('SIGTERM');
        const timer = setTimeout(kill, kStopTimeoutMs);
        const code = await exited;
        clearTimeout(timer);
        return code;
      },
    };
  } catch (e) {
    kill();
    throw e;
  }
}

// The address from "listening on http://HOST:PORT" on stderr (PORT the real one for --port 0).
function waitListening(child, log, exited) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      reject(new Error(`moetier serve did not print "listening on" within ${kStartTimeoutMs} ms:\n` +
                       log()));
    }, kStartTimeoutMs);
    const check = () => {
      const m = /listening on (http:\/\/\S+)/.exec(log());
      if (!m) return;
      clearTimeout(timer);
      resolve(m[1]);
    };
    child.stderr.on('data', check);
    child.on('error', (e) => { clearTimeout(timer); reject(e); });
    exited.then((code) => {
      clearTimeout(timer);
      reject(new Error(`moetier serve exited with ${code} before listening:\n${log()}`));
    });
  });
}

// The port answers before the model has loaded (/health 503 "loading"); waits for 200.
async function waitHealthy(baseURL, log, exited) {
  let ended = null;
  exited.then((code) => { ended = code; });
  const deadline = Date.now() + kStartTimeoutMs;
  while (Date.now() < deadline) {
    if (ended !== null) throw new Error(`moetier serve exited with ${ended} while loading:\n${log()}`);
    try {
      const res = await fetch(`${baseURL}/health`);
      await res.text();
      if (res.status === 200) return;
    } catch {
      // Not answering yet.
    }
    await new Promise((r) => setTimeout(r, kHealthPollMs));
  }
  throw new Error(`moetier serve did not become healthy within ${kStartTimeoutMs} ms:\n${log()}`);
}
