// Encodes the tokenizer corpus with @lenml/tokenizers (an independent JS port of Hugging Face's
// tokenizers) and writes what the gtest suite compares against, so CI needs no npm:
//   expected_<name>.txt               ids of corpus.txt line i on line i ("1,2,3"; "" for none)
//   expected_<name>_decoded.jsonl     Decode(ids) of line i as a JSON string (special tokens kept)
//   expected_<name>_invalid_utf8.txt  ids of corpus_invalid_utf8.bin line i
// for <name> in qwen3 and mixtral. No special tokens are added (add_special_tokens: false).
//
// How each side is fed: corpus.txt is read as UTF-8 and split on "\n" only (a final empty line
// after the trailing "\n" is not a case). corpus_invalid_utf8.bin is split on byte 0x0A and
// each line is decoded with TextDecoder (fatal: false), which replaces every maximal ill-formed
// subsequence with U+FFFD, exactly as Rust's String::from_utf8_lossy does; the C++ side is
// given the raw bytes and must do the same replacement itself.
//
// Usage: npm install && node make_expected_tokens.mjs   (from tests/tools)
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { TokenizerLoader } from "@lenml/tokenizers";

const here = path.dirname(fileURLToPath(import.meta.url));
const fixtures = path.join(here, "..", "fixtures");
const outDir = path.join(fixtures, "text", "tokenizer");

function loadTokenizer(dir) {
  const read = (f) => JSON.parse(fs.readFileSync(path.join(fixtures, dir, f), "utf8"));
  return TokenizerLoader.fromPreTrained({
    tokenizerJSON: read("tokenizer.json"),
    tokenizerConfig: read("tokenizer_config.json"),
  });
}

function splitLines(text) {
  const lines = text.split("\n");
  if (lines.at(-1) === "") lines.pop();
  return lines;
}

function splitByteLines(buf) {
  const lines = [];
  let start = 0;
  for (let i = 0; i < buf.length; ++i) {
    if (buf[i] === 0x0a) {
      lines.push(buf.subarray(start, i));
      start = i + 1;
    }
  }
  if (start < buf.length) lines.push(buf.subarray(start));
  return lines;
}

const corpus = splitLines(fs.readFileSync(path.join(outDir, "corpus.txt"), "utf8"));
const lossy = new TextDecoder("utf-8", { fatal: false });
const invalid = splitByteLines(fs.readFileSync(path.join(outDir, "corpus_invalid_utf8.bin"))).map(
  (b) => lossy.decode(b));

for (const [name, dir] of [["qwen3", "hf/realvocab/qwen3_moe_tiny"],
                           ["mixtral", "hf/realvocab/mixtral_tiny"]]) {
  const tok = loadTokenizer(dir);
  const encode = (s) => (s.length === 0 ? [] : tok.encode(s, { add_special_tokens: false }));
  const ids = corpus.map(encode);
  const decoded = ids.map((x) => (x.length === 0 ? "" : tok.decode(x)));
  fs.writeFileSync(path.join(outDir, `expected_${name}.txt`),
    ids.map((x) => x.join(",")).join("\n") + "\n");
  fs.writeFileSync(path.join(outDir, `expected_${name}_decoded.jsonl`),
    decoded.map((s) => JSON.stringify(s)).join("\n") + "\n");
  fs.writeFileSync(path.join(outDir, `expected_${name}_invalid_utf8.txt`),
    invalid.map((s) => encode(s).join(",")).join("\n") + "\n");
  const n = ids.reduce((a, x) => a + x.length, 0);
  console.log(`${name}: ${corpus.length} lines, ${n} tokens; ${invalid.length} invalid-UTF-8 lines`);
}
