#include "server/residency_page.h"

#include <filesystem>
#include <optional>
#include <vector>

#include "experts/expert_stats.h"
#include "experts/memory_limits.h"
#include "experts/residency_report.h"
#include "experts/tier.h"

namespace moetier::server {

namespace {

using nlohmann::ordered_json;

// The name /v1/models gives the model: its directory's.
std::string ModelName(const CausalLM& model) {
  const std::string name =
      std::filesystem::path(model.config().source).parent_path().filename().string();
  return name.empty() ? "moetier" : name;
}

const LayerResidency* FindLayer(const std::vector<LayerResidency>& layers, int64_t layer) {
  for (const LayerResidency& l : layers)
    if (l.layer == layer) return &l;
  return nullptr;
}

const LayerExpertStats* FindStats(const std::vector<LayerExpertStats>& stats, int64_t layer) {
  for (const LayerExpertStats& s : stats)
    if (s.layer == layer) return &s;
  return nullptr;
}

// The counters of one layer, or nulls when they are not collected (a page shows "—", not 0).
void AddCounters(const LayerExpertStats* s, ordered_json& j) {
  const auto value = [s](int64_t LayerExpertStats::*field) {
    return s != nullptr ? ordered_json(s->*field) : ordered_json(nullptr);
  };
  j["calls"] = value(&LayerExpertStats::calls);
  j["active_experts"] = value(&LayerExpertStats::active_experts);
  j["assignments"] = value(&LayerExpertStats::assignments);
  j["gpu_experts"] = value(&LayerExpertStats::gpu_experts);
  j["cpu_experts"] = value(&LayerExpertStats::cpu_experts);
  j["cache_hits"] = value(&LayerExpertStats::cache_hits);
  j["cache_misses"] = value(&LayerExpertStats::cache_misses);
  j["bytes_h2d"] = value(&LayerExpertStats::bytes_h2d);
}

// One row per planned MoE layer: the tier planned and settled, what it holds, its counters.
ordered_json LayersJson(const ResidencyReport& report,
                        const std::optional<std::vector<LayerExpertStats>>& stats) {
  ordered_json layers = ordered_json::array();
  for (const LayerResidency& planned : report.plan.layers) {
    const LayerResidency* settled =
        report.settled ? FindLayer(*report.settled, planned.layer) : nullptr;
    const LayerResidency& held = settled != nullptr ? *settled : planned;
    ordered_json j;
    j["layer"] = planned.layer;
    j["planned"] = std::string(TierName(planned.tier));
    j["settled"] =
        settled != nullptr ? ordered_json(std::string(TierName(settled->tier))) : ordered_json();
    j["bytes"] = held.bytes;
    j["dtype"] = std::string(DTypeName(held.dtype));
    j["cpu_copy_bytes"] = held.cpu_copy_bytes;  // hybrid: a pinned layer's copy for the CPU
    AddCounters(stats ? FindStats(*stats, planned.layer) : nullptr, j);
    layers.push_back(std::move(j));
  }
  return layers;
}

// Tokens the model has run, prompt and generated: every token passes through every MoE layer
// and picks exactly top-k experts there, so the first layer's (token, expert) pairs over top-k
// count them as each step runs.
ordered_json ForwardedTokens(const CausalLM& model,
                             const std::optional<std::vector<LayerExpertStats>>& stats) {
  const int64_t top_k = model.config().n_experts_per_token;
  if (!stats || stats->empty() || top_k <= 0) return nullptr;
  return stats->front().assignments / top_k;
}

void AddServiceJson(const ServiceMetrics& m, ordered_json forwarded, ordered_json& j) {
  j["requests"] = {{"running", m.requests_running},
                   {"waiting", m.requests_waiting},
                   {"total", m.requests_total}};
  j["tokens"] = {{"prompt_total", m.prompt_tokens_total},
                 {"cached_prompt_total", m.cached_prompt_tokens_total},
                 {"generated_total", m.generated_tokens_total},
                 {"forwarded_total", std::move(forwarded)}};
  j["kv_blocks"] = {{"used", m.kv_blocks_used}, {"total", m.kv_blocks_total}};
}

}  // namespace

ordered_json ResidencyJson(const CausalLM& model, const ServiceMetrics& metrics, double uptime_s) {
  const ResidencyReport& report = model.residency();
  // The report's own JSON gives the backend, budgets, bytes per tier, dtype, dense holding and
  // warnings; its per-layer arrays are merged into "layers" below.
  ordered_json summary = ResidencyReportJson(report);
  summary.erase("plan");
  summary.erase("settled");

  std::optional<std::vector<LayerExpertStats>> stats;
  if (const ExpertStats* collected = model.expert_stats(); collected != nullptr)
    stats = collected->Snapshot();

  ordered_json j;
  j["model"] = ModelName(model);
  j["uptime_s"] = uptime_s;
  for (auto& [key, value] : summary.items()) j[key] = value;
  j["vmlck_settled_bytes"] = report.vmlck_bytes;
  j["vmlck_bytes"] = ReadVmLckBytes();
  j["expert_stats"] = stats.has_value();
  j["layers"] = LayersJson(report, stats);
  j["totals"] = stats ? ExpertStatsJson(*stats)["totals"] : ordered_json();
  AddServiceJson(metrics, ForwardedTokens(model, stats), j);
  return j;
}

// The page is one document with its style and script inline: the binary serves it with no file
// on disk and it loads nothing from elsewhere, so it works offline and behind any firewall. The
// script builds every cell with textContent (never HTML from the server's data), keeps each
// figure's raw value in a data-value attribute (what scripts and tests read), and marks the
// live figures with "↻" in their labels and a highlight when they change.
const std::string& ResidencyPageHtml() {
  static const std::string page = R"page(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>moetier residency</title>
<style>
:root { color-scheme: light dark; --live: #2e7d32; --stale: #c62828; --rule: #8886; }
body { font: 14px/1.45 system-ui, sans-serif; margin: 1.5rem; max-width: 80rem; }
h1 { font-size: 1.35rem; margin: 0 0 .25rem; }
h2 { font-size: 1.05rem; margin: 1.25rem 0 .4rem; }
#status { font-weight: 600; }
#status[data-state=live]::before { content: "\25CF  "; color: var(--live); }
#status[data-state=stale]::before { content: "\25CB  "; color: var(--stale); }
#status[data-state=stale] { color: var(--stale); }
.panels { display: flex; flex-wrap: wrap; gap: 0 3rem; }
dl { display: grid; grid-template-columns: max-content auto; gap: .15rem 1rem; margin: 0; }
dt { font-weight: 600; }
dd { margin: 0; font-variant-numeric: tabular-nums; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; }
caption { text-align: left; padding-bottom: .4rem; }
th, td { padding: .25rem .6rem; border-bottom: 1px solid var(--rule); text-align: right; }
td { white-space: nowrap; }
thead th { vertical-align: bottom; }
tfoot th, tfoot td { font-weight: 600; border-top: 2px solid var(--rule); }
td.tier { text-align: left; }
td.tier span { padding: 0 .45rem; border-radius: .3rem; border: 1px solid var(--rule); }
.tier-gpu span { background: #8e24aa33; }
.tier-pinned span { background: #1e88e533; }
.tier-locked span { background: #43a04733; }
.tier-pageable span { background: #fb8c0033; }
td.degraded span { font-weight: 700; border-color: var(--stale); }
.changed { background: #fdd83566; }
.note { border-left: 4px solid #fb8c00; padding-left: .6rem; }
</style>
</head>
<body>
<header>
<h1>Expert residency: <span id="model">loading</span></h1>
<p><span id="status" role="status" data-state="loading">Waiting for the first update</span>
 <span id="updated"></span></p>
<p>Figures marked &#x21BB; are live: read from the server every second and highlighted when
 they change.</p>
</header>
<div class="panels">
<section aria-labelledby="memory-heading">
<h2 id="memory-heading">Memory</h2>
<dl>
<dt>Backend</dt><dd id="backend">&mdash;</dd>
<dt>Experts stored as</dt><dd id="stored-dtype">&mdash;</dd>
<dt>Bytes per tier (settled)</dt><dd id="tier-bytes">&mdash;</dd>
<dt>Pin budget</dt><dd id="pin-budget">&mdash;</dd>
<dt>Lock budget</dt><dd id="lock-budget">&mdash;</dd>
<dt>VmLck &#x21BB;</dt><dd id="vmlck">&mdash;</dd>
<dt>VmLck after loading</dt><dd id="vmlck-settled">&mdash;</dd>
<dt>Dense weights</dt><dd id="dense">&mdash;</dd>
</dl>
</section>
<section aria-labelledby="serving-heading">
<h2 id="serving-heading">Serving</h2>
<dl>
<dt>Tokens/s generated &#x21BB;</dt><dd id="tokens-per-second">&mdash;</dd>
<dt>Tokens/s through the model, prompts included &#x21BB;</dt>
<dd id="forwarded-per-second">&mdash;</dd>
<dt>Tokens generated &#x21BB;</dt><dd id="tokens-generated">&mdash;</dd>
<dt>Tokens through the model &#x21BB;</dt><dd id="tokens-forwarded">&mdash;</dd>
<dt>Prompt tokens (from the prefix cache) &#x21BB;</dt><dd id="prompt-tokens">&mdash;</dd>
<dt>Requests running / waiting / total &#x21BB;</dt><dd id="requests">&mdash;</dd>
<dt>KV blocks used &#x21BB;</dt><dd id="kv-blocks">&mdash;</dd>
<dt>Expert-cache hit rate &#x21BB;</dt><dd id="hit-rate">&mdash;</dd>
<dt>Uptime &#x21BB;</dt><dd id="uptime">&mdash;</dd>
</dl>
</section>
</div>
<section aria-labelledby="layers-heading">
<h2 id="layers-heading">MoE layers</h2>
<p id="stats-off" class="note" hidden>This server does not collect expert statistics, so the
 per-layer counters are blank; the tiers are still exact.</p>
<ul id="warnings"></ul>
<table id="layers">
<caption>One row per MoE layer: where its experts live (the tier planned, then the one settled
 after loading; a layer that could not be pinned or locked as planned is marked &#x26A0;) and,
 in the columns marked &#x21BB;, what the expert executors did since the server started.</caption>
<thead><tr>
<th scope="col">Layer</th><th scope="col">Planned tier</th><th scope="col">Settled tier</th>
<th scope="col">Held</th><th scope="col">Dtype</th><th scope="col">Calls &#x21BB;</th>
<th scope="col">Active experts a call &#x21BB;</th><th scope="col">Experts on the CPU &#x21BB;</th>
<th scope="col">Experts on the GPU &#x21BB;</th><th scope="col">Cache hits &#x21BB;</th>
<th scope="col">Cache misses &#x21BB;</th><th scope="col">Copied to the GPU &#x21BB;</th>
</tr></thead>
<tbody></tbody>
<tfoot><tr><th scope="row">All</th><td></td><td></td><td data-field="bytes"></td><td></td>
<td data-field="calls"></td><td data-field="active_per_call"></td>
<td data-field="cpu_experts"></td><td data-field="gpu_experts"></td>
<td data-field="cache_hits"></td><td data-field="cache_misses"></td>
<td data-field="bytes_h2d"></td></tr></tfoot>
</table>
</section>
<script>
'use strict';
// Once a second is live enough to watch a request and costs the server one small JSON answer.
const kPollMs = 1000;
// How long a changed figure stays highlighted: visible, yet gone before the next update.
const kFlashMs = 700;
const kEndpoint = '/v1/residency';
// The API key, from the page address's fragment (#key=KEY), which browsers never send.
const apiKey = new URLSearchParams(location.hash.slice(1)).get('key');

const $ = (id) => document.getElementById(id);
const dash = '\u2014';
const fmtInt = (n) => (n == null ? dash : Math.round(n).toLocaleString('en'));
const fmtRatio = (n) => (n == null ? dash : n.toFixed(2));
const fmtPercent = (n) => (n == null ? dash : (100 * n).toFixed(1) + ' %');
function fmtBytes(n) {
  if (n == null) return dash;
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i === 0 ? String(n) : n.toFixed(n < 10 ? 2 : 1)) + ' ' + units[i];
}
function fmtDuration(s) {
  const whole = Math.floor(s);
  const h = Math.floor(whole / 3600), m = Math.floor((whole % 3600) / 60), sec = whole % 60;
  return (h ? h + ' h ' : '') + (h || m ? m + ' min ' : '') + sec + ' s';
}

// Per-layer counters: the field of /v1/residency (or one derived here) and its format.
const kCounters = [
  ['calls', fmtInt], ['active_per_call', fmtRatio], ['cpu_experts', fmtInt],
  ['gpu_experts', fmtInt], ['cache_hits', fmtInt], ['cache_misses', fmtInt],
  ['bytes_h2d', fmtBytes],
];
function counter(c, key) {
  if (key !== 'active_per_call') return c[key];
  return c.calls ? c.active_experts / c.calls : null;
}

// Writes a figure: its text, its raw value in data-value, and a highlight when it changed.
function show(el, text, value) {
  const v = value == null ? '' : String(value);
  if (el.dataset.value !== undefined && el.dataset.value !== v) {
    el.classList.add('changed');
    clearTimeout(el.flashTimer);
    el.flashTimer = setTimeout(() => el.classList.remove('changed'), kFlashMs);
  }
  el.dataset.value = v;
  el.textContent = text;
}
const cell = (row, field) => row.querySelector(`[data-field="${field}"]`);

function showTier(td, tier, planned) {
  const degraded = tier != null && planned != null && tier !== planned;
  td.className = 'tier' + (tier ? ' tier-' + tier : '') + (degraded ? ' degraded' : '');
  td.dataset.value = tier ?? '';
  const span = document.createElement('span');
  span.textContent = tier == null ? 'not settled' : (degraded ? '\u26A0 ' : '') + tier;
  if (degraded) span.title = 'planned ' + planned + '; settled ' + tier;
  td.replaceChildren(span);
}

function newRow(layer) {
  const tr = document.createElement('tr');
  tr.dataset.layer = layer;
  const th = document.createElement('th');
  th.scope = 'row';
  th.textContent = layer;
  tr.append(th);
  for (const field of ['planned', 'settled', 'bytes', 'dtype', ...kCounters.map((c) => c[0])]) {
    const td = document.createElement('td');
    td.dataset.field = field;
    tr.append(td);
  }
  return tr;
}

function showCounters(row, c) {
  for (const [key, fmt] of kCounters) show(cell(row, key), fmt(counter(c, key)), counter(c, key));
}

function showLayers(d) {
  const body = document.querySelector('#layers tbody');
  const ids = d.layers.map((l) => l.layer).join(',');
  if (body.dataset.layers !== ids) {
    body.replaceChildren(...d.layers.map((l) => newRow(l.layer)));
    body.dataset.layers = ids;
  }
  d.layers.forEach((l, i) => {
    const row = body.rows[i];
    showTier(cell(row, 'planned'), l.planned, null);
    showTier(cell(row, 'settled'), l.settled, l.planned);
    show(cell(row, 'bytes'), fmtBytes(l.bytes), l.bytes);
    show(cell(row, 'dtype'), l.dtype, l.dtype);
    showCounters(row, l);
  });
  const foot = document.querySelector('#layers tfoot tr');
  const held = d.layers.reduce((sum, l) => sum + l.bytes, 0);
  show(cell(foot, 'bytes'), fmtBytes(held), held);
  showCounters(foot, d.totals ?? {});
  $('stats-off').hidden = d.expert_stats;
}

// Rates between this update and the previous one, on the server's monotonic clock: null on the
// first update and for a count the server does not give.
let previous = null;
function rates(d) {
  const now = { t: d.uptime_s, generated: d.tokens.generated_total,
                forwarded: d.tokens.forwarded_total };
  const rate = (key) => (previous && now.t > previous.t && now[key] != null &&
                         previous[key] != null
    ? (now[key] - previous[key]) / (now.t - previous.t) : null);
  const r = { generated: rate('generated'), forwarded: rate('forwarded') };
  previous = now;
  return r;
}

function showSummary(d) {
  $('model').textContent = d.model;
  document.title = d.model + ' \u2014 moetier residency';
  show($('backend'), d.backend, d.backend);
  show($('stored-dtype'), d.stored_dtype, d.stored_dtype);
  const tiers = Object.entries(d.bytes).filter(([, n]) => n > 0);
  show($('tier-bytes'), tiers.map(([t, n]) => t + ' ' + fmtBytes(n)).join(', ') || 'none',
       JSON.stringify(d.bytes));
  const budget = (n) => (n == null ? 'none' : fmtBytes(n));
  show($('pin-budget'), budget(d.pin_budget_bytes), d.pin_budget_bytes);
  show($('lock-budget'), budget(d.lock_budget_bytes), d.lock_budget_bytes);
  show($('vmlck'), fmtBytes(d.vmlck_bytes), d.vmlck_bytes);
  show($('vmlck-settled'), fmtBytes(d.vmlck_settled_bytes), d.vmlck_settled_bytes);
  const dense = d.dense;
  show($('dense'), dense ? `${fmtBytes(dense.held_bytes)} (${dense.memory}, ` +
       `${dense.packed_matrices} packed, ${dense.copied_matrices} copied)` : dash,
       dense ? dense.held_bytes : null);
  const perSecond = rates(d);
  const fmtRate = (n) => (n == null ? dash : n.toFixed(1));
  show($('tokens-per-second'), fmtRate(perSecond.generated), perSecond.generated);
  show($('forwarded-per-second'), fmtRate(perSecond.forwarded), perSecond.forwarded);
  show($('tokens-generated'), fmtInt(d.tokens.generated_total), d.tokens.generated_total);
  show($('tokens-forwarded'), fmtInt(d.tokens.forwarded_total), d.tokens.forwarded_total);
  show($('prompt-tokens'), `${fmtInt(d.tokens.prompt_total)} ` +
       `(${fmtInt(d.tokens.cached_prompt_total)})`, d.tokens.prompt_total);
  const r = d.requests;
  show($('requests'), `${r.running} / ${r.waiting} / ${r.total}`, `${r.running}/${r.waiting}/${r.total}`);
  show($('kv-blocks'), `${fmtInt(d.kv_blocks.used)} of ${fmtInt(d.kv_blocks.total)}`,
       d.kv_blocks.used);
  const hitRate = d.totals && d.totals.cache_hits + d.totals.cache_misses > 0
      ? d.totals.cache_hit_rate : null;
  show($('hit-rate'), hitRate == null ? 'no expert cache lookups' : fmtPercent(hitRate), hitRate);
  show($('uptime'), fmtDuration(d.uptime_s), d.uptime_s);
  $('warnings').replaceChildren(...d.warnings.map((w) => {
    const li = document.createElement('li');
    li.textContent = '\u26A0 ' + w;
    return li;
  }));
}

// The status line is the one live region: it changes only when the state does, so a screen
// reader is not told of every update.
function setStatus(state, text) {
  const el = $('status');
  el.dataset.state = state;
  if (el.textContent !== text) el.textContent = text;
}

async function failure(res) {
  if (res.status === 401) {
    return 'this server needs its API key: open this page as /residency#key=YOUR_KEY';
  }
  let detail = '';
  try { detail = (await res.json()).error.message; } catch { /* not an API error body */ }
  return `${kEndpoint} answered ${res.status}` + (detail ? ': ' + detail : '');
}

// One update: the figures, or an error that says why there are none.
async function update() {
  const headers = apiKey ? { Authorization: 'Bearer ' + apiKey } : {};
  let res;
  try {
    res = await fetch(kEndpoint, { headers, cache: 'no-store' });
  } catch {
    throw new Error('the server does not answer');
  }
  if (!res.ok) throw new Error(await failure(res));
  const d = await res.json();
  showSummary(d);
  showLayers(d);
}

async function poll() {
  try {
    await update();
    setStatus('live', 'Live');
    $('updated').textContent = '(updated ' + new Date().toLocaleTimeString() + ')';
  } catch (e) {
    setStatus('stale', 'Not updating: ' + e.message + '; retrying every second');
  } finally {
    setTimeout(poll, kPollMs);
  }
}
poll();
</script>
</body>
</html>
)page";
  return page;
}

}  // namespace moetier::server
