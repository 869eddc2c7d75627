// Writes the tokenizer test corpus, deterministically (a seeded PRNG; same output every run):
//   tests/fixtures/text/tokenizer/corpus.txt              UTF-8, one case per line ('\n' only)
//   tests/fixtures/text/tokenizer/corpus_invalid_utf8.bin lines with ill-formed UTF-8 bytes
// corpus.txt starts with corpus_handwritten.txt, then generated lines of every category the
// tokenizer must get right (prose, code, whitespace, scripts, emoji, combining marks, numbers,
// contractions, URLs, special-token strings, long lines).
//
// Left out on purpose, because the JS reference (@lenml/tokenizers) and Hugging Face disagree
// on them for reasons unrelated to our code (JS regex \s vs Oniguruma's, and its ASCII-only
// rewrite of (?i:'s|...)): U+0085, U+FEFF, U+180E, and U+017F after an apostrophe. Characters
// newer than Unicode 14 are avoided so that every side's Unicode tables agree.
//
// Usage: node make_corpus.mjs   (from tests/tools)
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const outDir = path.join(here, "..", "fixtures", "text", "tokenizer");

// mulberry32: tiny, good enough, and the same in every JS engine.
function makeRng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
const rng = makeRng(20240517);
const int = (n) => Math.floor(rng() * n);
const pick = (xs) => xs[int(xs.length)];
const repeat = (n, f) => Array.from({ length: n }, (_, i) => f(i));

const words = (
  "the of and to in is was that for it with as his on be at by had are but from or have an " +
  "they which one you were her all she there would their we him been has when who will more " +
  "no if out so said what up its about into than them can only other new some could time " +
  "these two may then do first any my now such like our over man me even most made after " +
  "also did many before must through back years where much your way well down should because " +
  "each just those people how too little state good very make world still own see men work " +
  "long get here between both life being under never day same another know while last might " +
  "us great old year off come since against go came right used take three tokenizer model " +
  "expert memory bandwidth latency throughput pinned locked pageable kernel tensor matrix " +
  "attention router gradient inference quantization accelerator benchmark compiler runtime " +
  "unbelievable internationalization antidisestablishmentarianism floccinaucinihilipilification"
).split(" ");
const contractions = [
  "it's", "don't", "won't", "can't", "I'm", "you're", "we've", "they'll", "she'd", "he's",
  "isn't", "wasn't", "couldn't", "shouldn't", "we'd", "I'll", "you've", "they're", "that's",
  "IT'S", "DON'T", "I'M", "YOU'RE", "WE'VE", "THEY'LL", "SHE'D", "We'Re", "I'Ll", "Tom's",
  "the cat's", "James'", "o'clock", "'tis", "'em",
];
const punct = [".", ",", ";", ":", "!", "?", "...", " -", " —", "", "", "", ""];

function sentence() {
  const n = 3 + int(18);
  const parts = repeat(n, () => (rng() < 0.12 ? pick(contractions) : pick(words)));
  parts[0] = parts[0][0].toUpperCase() + parts[0].slice(1);
  let s = "";
  for (let i = 0; i < parts.length; ++i) {
    s += (i ? " " : "") + parts[i];
    if (i + 1 < parts.length && rng() < 0.08) s += pick([",", ";", ":", " -", " (see", ")"]);
  }
  return s + pick([".", ".", ".", "!", "?", "..."]);
}

function prose() {
  return repeat(1 + int(4), sentence).join(pick([" ", "  ", " "]));
}

const idents = ["x", "y", "i", "n", "buf", "count", "total_bytes", "nExperts", "d_model",
  "kv_cache", "self", "ctx", "userName", "HTTP_STATUS", "__init__", "_tmp", "value2", "err"];
const typeNames = ["int", "float", "double", "size_t", "uint8_t", "std::string", "Vec<u32>",
  "String", "bool", "char*", "const T&", "List[int]", "Optional[str]"];
function codeLine() {
  const a = pick(idents), b = pick(idents), c = pick(idents), t = pick(typeNames);
  const num = int(1000);
  const indent = pick(["", "", "    ", "        ", "\t", "\t\t", "  ", "\t    ", "    \t"]);
  const lines = [
    `def ${a}(${b}, ${c}=None):`,
    `return ${a} + ${b} * ${num}`,
    `for ${a} in range(${num}):`,
    `if ${a} is not None and len(${b}) > ${num}:`,
    `print(f"{${a}=} {${b}!r:>10}")`,
    `${a} = [${b} for ${b} in ${c} if ${b} % 2 == 0]`,
    `class ${a[0].toUpperCase() + a.slice(1)}(object):`,
    `@property`,
    `lambda ${a}: ${a} ** 2`,
    `${t} ${a} = ${b}[${num}] >> 3;`,
    `for (size_t ${a} = 0; ${a} < ${b}.size(); ++${a}) {`,
    `std::vector<${t}> ${a}(${num}, 0);`,
    `#define MAX_${a.toUpperCase()} ${num}`,
    `if (${a} != nullptr && ${a}->${b} == ${num}) return -1;`,
    `} else if (${a} <= ${b} || !${c}) {`,
    `auto [${a}, ${b}] = std::make_pair(${num}, "${c}");`,
    `template <typename T> T ${a}(const T& ${b}) { return ${b}; }`,
    `const ${a} = (${b}) => ${b}.map((v) => v * ${num});`,
    `let ${a} = await fetch(\`/api/${b}/\${id}\`);`,
    `export default function ${a}({ ${b}, ${c} }) { return null; }`,
    `${a} ??= ${b} ?? ${c}; ${a} === ${b} !== ${c}`,
    `fn ${a}(${b}: &mut [u8]) -> Result<usize, Error> {`,
    `let ${a}: Option<&str> = ${b}.get(${num}).map(|s| s.as_str());`,
    `impl<'a> Iterator for ${a[0].toUpperCase()}${a.slice(1)}<'a> { type Item = &'a u8; }`,
    `match ${a} { Some(${b}) => ${b}, None => ${num} }`,
    `func (${a} *Server) ${b}(w http.ResponseWriter, r *http.Request) {`,
    `if err := ${a}.Close(); err != nil { log.Fatal(err) }`,
    `public static void main(String[] args) { System.out.println(${num}); }`,
    `SELECT ${a}, COUNT(*) AS n FROM ${b} GROUP BY ${a} HAVING n > ${num};`,
    `INSERT INTO ${a} (${b}, ${c}) VALUES ('it''s', ${num});`,
    `for f in *.txt; do wc -l "$f" | awk '{print $1}'; done`,
    `export PATH="$HOME/.local/bin:$PATH" && ${a} --flag=${num} 2>/dev/null`,
    `<a href="https://example.com/${a}?id=${num}">${b} &lt;${c}&gt;</a>`,
    `<script>document.getElementById("${a}").innerHTML = '${b}';</script>`,
    `{"${a}": ${num}, "${b}": ["${c}", null, true, ${num / 7}]}`,
    `${a}: [${b}, ${num}]  # yaml`,
    `// TODO(${a}): handle ${b} == ${num} /* edge case */`,
    `# ${a}: ${b} -> ${c} (${num}%)`,
    `x86: mov rax, [rbp-${num}] ; add rax, 0x${num.toString(16)}`,
    `\\begin{equation} ${a}_{${num}} = \\sum_{i=0}^{n} ${b}_i^2 \\end{equation}`,
  ];
  return indent + pick(lines);
}

const blanks = [" ", "  ", "   ", "    ", "\t", "\t\t", " \t", "\t ", "\u00a0", "\u2003",
  "\u3000", "\u2009", "\u202f", "\r", "\v", "\f", " \r", "\u2028"];
function whitespaceLine() {
  const pieces = repeat(1 + int(6), () =>
    rng() < 0.5 ? pick(words) : repeat(1 + int(4), () => pick(blanks)).join(""));
  let s = pieces.join(rng() < 0.5 ? "" : " ");
  if (rng() < 0.4) s = repeat(1 + int(6), () => pick([" ", "\t"])).join("") + s;
  if (rng() < 0.4) s += repeat(1 + int(6), () => pick([" ", "\t"])).join("");
  return s;
}

const scripts = {
  cjk: ["我们", "今天", "天气", "很好", "学习", "机器", "语言", "模型", "专家", "混合", "的", "了",
    "東京", "大阪", "日本語", "です", "ます", "ありがとう", "こんにちは", "カタカナ", "漢字", "学校",
    "한국", "서울", "감사합니다", "사랑해요", "컴퓨터", "，", "。", "、", "！", "？", "「", "」"],
  arabic: ["مرحبا", "العالم", "كتاب", "مدرسة", "السلام", "عليكم", "شكرا", "جزيلا", "الذكاء",
    "الاصطناعي", "،", "؟", "١٢٣", "٤٥٦", "لغة", "البرمجة"],
  devanagari: ["नमस्ते", "दुनिया", "भारत", "हिन्दी", "भाषा", "कृत्रिम", "बुद्धिमत्ता", "।", "१२३",
    "संस्कृत", "विज्ञान", "क्षत्रिय", "ज्ञान"],
  thai: ["สวัสดี", "ประเทศไทย", "ภาษา", "คอมพิวเตอร์", "ขอบคุณ", "ครับ", "ค่ะ", "๑๒๓", "กรุงเทพ"],
  hebrew: ["שלום", "עולם", "תודה", "רבה", "ספר", "מחשב", "שָׁלוֹם", "בְּרֵאשִׁית", "ירושלים"],
  cyrillic: ["Привет", "мир", "спасибо", "Москва", "язык", "модель", "Київ", "щастя", "Ёлка"],
  greek: ["Καλημέρα", "κόσμε", "ευχαριστώ", "Αθήνα", "γλώσσα", "ΣΟΦΙΑ", "σοφία", "ψυχή"],
  latin: ["naïve", "café", "résumé", "Zürich", "São Paulo", "Kraków", "Ørsted", "Þingvellir",
    "Đà Nẵng", "Ærø", "façade", "coöperate", "jalapeño", "İstanbul"],
};
function scriptLine() {
  const names = Object.keys(scripts);
  const main = pick(names);
  const n = 2 + int(12);
  const parts = repeat(n, () => {
    const r = rng();
    if (r < 0.7) return pick(scripts[main]);
    if (r < 0.8) return pick(scripts[pick(names)]);
    if (r < 0.9) return pick(words);
    return String(int(100000));
  });
  const sep = main === "cjk" || main === "thai" ? pick(["", "", " "]) : " ";
  return parts.join(sep);
}

const emoji = ["😀", "😂", "🥲", "😍", "🤔", "🙃", "🔥", "✨", "🎉", "🚀", "💯", "🌍", "🌈",
  "🐍", "🦀", "☕", "⚡", "❤️", "✅", "❌", "⭐", "🍕", "🎵", "📈", "🧠", "🤖"];
const zwj = ["👨‍👩‍👧‍👦", "👩‍💻", "👨‍🍳", "🏳️‍🌈", "🏴‍☠️", "👁️‍🗨️", "🧑‍🤝‍🧑", "👩‍👩‍👦",
  "🐕‍🦺", "🧔‍♂️", "🏃‍♀️", "❤️‍🔥"];
const skin = ["\u{1F3FB}", "\u{1F3FC}", "\u{1F3FD}", "\u{1F3FE}", "\u{1F3FF}"];
const skinBases = ["👋", "👍", "✌️", "🤝", "👩", "🧑‍💻", "🙏", "💪", "👶"];
const flags = ["🇺🇸", "🇬🇧", "🇫🇷", "🇩🇪", "🇯🇵", "🇨🇳", "🇮🇳", "🇧🇷", "🇰🇷", "🇪🇺", "🇺🇳", "🇨🇦",
  "🏴󠁧󠁢󠁳󠁣󠁴󠁿"];
function emojiLine() {
  const n = 1 + int(10);
  const parts = repeat(n, () => {
    const r = rng();
    if (r < 0.3) return pick(emoji);
    if (r < 0.5) return pick(zwj);
    if (r < 0.65) {
      const base = pick(skinBases);
      // The tone goes after the first code point of a ZWJ sequence.
      const [first, ...rest] = Array.from(base);
      return first + pick(skin) + rest.join("");
    }
    if (r < 0.8) return pick(flags);
    return pick(words);
  });
  return parts.join(pick(["", " ", " ", "  "]));
}

// Each pair: precomposed and decomposed (or otherwise non-NFC) spellings.
const combining = [
  ["é", "e\u0301"], ["ñ", "n\u0303"], ["ü", "u\u0308"], ["Å", "A\u030a"], ["Å", "\u212b"],
  ["ệ", "e\u0323\u0302"], ["ệ", "e\u0302\u0323"], ["ǖ", "u\u0308\u0304"], ["한", "\u1112\u1161\u11ab"],
  ["가", "\u1100\u1161"], ["ḍ̇", "d\u0307\u0323"], ["q̣̇", "q\u0307\u0323"], ["Ω", "\u2126"],
  ["ﬁ", "fi"], ["x̄", "x\u0304"], ["ȫ", "o\u0308\u0304"], ["श्री", "श\u094d\u0930\u0940"],
  ["ô", "o\u0302"], ["ç", "c\u0327"], ["ǻ", "a\u030a\u0301"], ["e\u0301\u0301", "é\u0301"],
];
function combiningLine() {
  const n = 1 + int(6);
  return repeat(n, () => {
    const [pre, dec] = pick(combining);
    const w = pick(words);
    const r = rng();
    if (r < 0.4) return w + dec + w.slice(0, 2);
    if (r < 0.7) return pre + w;
    return dec;
  }).join(pick([" ", "", " "]));
}

function numberLine() {
  const forms = [
    () => String(int(10) ** int(5)),
    () => repeat(1 + int(40), () => String(int(10))).join(""),
    () => `${int(100000)}.${int(100000)}`,
    () => `${int(1000)},${String(int(1000)).padStart(3, "0")},${String(int(1000)).padStart(3, "0")}`,
    () => `-${int(1000)}e${int(30)}`,
    () => `${int(24)}:${String(int(60)).padStart(2, "0")}`,
    () => `v${int(10)}.${int(20)}.${int(100)}`,
    () => `0x${int(2 ** 31).toString(16).toUpperCase()}`,
    () => `${int(100)}%`,
    () => `#${int(1000000)}`,
    () => `١٢٣٤٥`,
    () => `१२३४`,
    () => `Ⅻ ² ³ ½ ¾`,
  ];
  return repeat(1 + int(8), () => (rng() < 0.7 ? pick(forms)() : pick(words))).join(
    pick([" ", " ", ", ", "", "; "]));
}

function urlLine() {
  const host = pick(["example.com", "www.example.org", "sub.domain.co.uk", "localhost:8080",
    "192.168.0.1", "[::1]:443", "xn--bcher-kva.example", "пример.испытание"]);
  const p = repeat(int(5), () => pick(idents)).join("/");
  const q = int(3) === 0 ? "" : `?${pick(idents)}=${int(1000)}&${pick(idents)}=${pick(words)}`;
  const url = `${pick(["https", "http", "ftp", "ws"])}://${host}/${p}${q}${
    rng() < 0.3 ? "#" + pick(words) : ""}`;
  return pick([
    () => url,
    () => `See ${url} for details.`,
    () => `(${url})`,
    () => `<${url}>`,
    () => `[link](${url})`,
    () => `${pick(idents)}@${host.replace(/:.*/, "")}`,
    () => `/home/${pick(idents)}/.config/${pick(idents)}.toml`,
  ])();
}

const specials = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<s>", "</s>", "<unk>",
  "<tool_call>", "</tool_call>", "<think>", "</think>", "<|vision_start|>", "<|fim_prefix|>",
  "<|im_start", "im_end|>", "<|", "|>", "< s>", "</ s>", "<S>", "<pad>"];
function specialLine() {
  const n = 1 + int(6);
  return repeat(n, () => (rng() < 0.5 ? pick(specials) : pick(words) + pick(punct))).join(
    pick(["", " ", " ", "  "]));
}

function longLine() {
  const kind = int(4);
  if (kind === 0) return repeat(60 + int(60), sentence).join(" ");
  if (kind === 1) return repeat(300 + int(400), () => pick(scripts.cjk)).join("");
  if (kind === 2) return repeat(200 + int(300), () => pick(["a", "b", "ab", "ba", " "])).join("");
  return repeat(100 + int(200), () => pick(emoji) + pick(words)).join("");
}

const generated = [
  ...repeat(520, prose),
  ...repeat(420, codeLine),
  ...repeat(260, whitespaceLine),
  ...repeat(400, scriptLine),
  ...repeat(200, emojiLine),
  ...repeat(160, combiningLine),
  ...repeat(150, numberLine),
  ...repeat(100, urlLine),
  ...repeat(110, specialLine),
  ...repeat(12, longLine),
];
for (const line of generated) {
  if (line.includes("\n")) throw new Error("a generated line contains a newline");
}
const handwritten = fs.readFileSync(path.join(outDir, "corpus_handwritten.txt"), "utf8");
const handLines = handwritten.split("\n");
if (handLines.at(-1) === "") handLines.pop();
const lines = [...handLines, ...generated];
fs.writeFileSync(path.join(outDir, "corpus.txt"), lines.join("\n") + "\n");

// Ill-formed UTF-8: valid corpus lines with bytes spliced in (possibly inside a character,
// which truncates it). Never 0x0A, so line breaks stay where they are.
const bad = [[0xff], [0xfe], [0xc0, 0xaf], [0xc3], [0xe4, 0xbd], [0xf0, 0x9f, 0x98], [0xed, 0xa0, 0x80],
  [0xf5, 0x80], [0x80], [0xbf, 0xbf], [0xf8, 0x88, 0x80, 0x80, 0x80], [0xe0, 0x80, 0x80],
  [0xf4, 0x90, 0x80, 0x80], [0xc2], [0xe2, 0x82]];
const badLines = [];
const enc = new TextEncoder();
for (let i = 0; i < 80; ++i) {
  const src = Array.from(enc.encode(pick(lines.filter((l) => l.length > 0 && l.length < 400))));
  const n = 1 + int(3);
  for (let k = 0; k < n; ++k) src.splice(int(src.length + 1), 0, ...pick(bad));
  badLines.push(Buffer.from(src));
}
badLines.push(Buffer.from([0xff, 0xfe, 0xfd]));
badLines.push(Buffer.from([0xe4, 0xbd, 0xa0, 0xe4, 0xbd]));
badLines.push(Buffer.from("<|im_start|>\xff<|im_end|>", "latin1"));
fs.writeFileSync(path.join(outDir, "corpus_invalid_utf8.bin"),
  Buffer.concat(badLines.flatMap((b) => [b, Buffer.from([0x0a])])));
console.log(`corpus.txt: ${lines.length} lines; corpus_invalid_utf8.bin: ${badLines.length} lines`);
