// The ovex console: four pages (models, datasets, jobs, predict) over the public HTTP API.

import { api, ApiError, getKey, setKey, upload } from "/console/api.js";
import { drawChart } from "/console/chart.js";
import { buildForm } from "/console/schema_form.js";

const $ = (sel) => document.querySelector(sel);
const PK_COLORS = { "p@1": "#1f5fbf", "p@3": "#d9822b", "p@5": "#17773a" };

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

function flash(kind, text) {
  const box = $("#flash");
  box.replaceChildren(el("p", { class: `msg ${kind}` }, text));
  if (kind === "ok") setTimeout(() => box.firstChild && box.firstChild.textContent === text && box.replaceChildren(), 6000);
}

function fail(err) {
  flash("error", err instanceof ApiError || err instanceof Error ? err.message : String(err));
}

const num = (v, digits = 4) => (v === null || v === undefined ? "–" : Number(v).toFixed(digits));
const when = (iso) => (iso ? new Date(iso).toLocaleString() : "–");
const bytes = (n) =>
  n >= 1 << 20 ? `${(n / (1 << 20)).toFixed(1)} MiB` : n >= 1024 ? `${(n / 1024).toFixed(1)} KiB` : `${n} B`;

function table(headers, rows) {
  return el(
    "table",
    {},
    el("thead", {}, el("tr", {}, headers.map(([h, cls]) => el("th", { scope: "col", class: cls }, h)))),
    el("tbody", {}, rows),
  );
}

// ---------------------------------------------------------------------------------------- routing
const loaders = {};
function show(page) {
  if (!loaders[page]) page = "models";
  for (const s of document.querySelectorAll("main > section")) s.hidden = s.dataset.page !== page;
  for (const a of document.querySelectorAll("nav a[data-page]")) {
    if (a.dataset.page === page) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  loaders[page]().catch(fail);
}
window.addEventListener("hashchange", () => {
  $("#flash").replaceChildren();
  show(location.hash.slice(1));
});

// -------------------------------------------------------------------------------------- the key
function initKey() {
  const input = $("#api-key");
  input.value = getKey();
  $("#key-form").addEventListener("submit", (e) => {
    e.preventDefault();
    setKey(input.value.trim());
    flash("ok", input.value.trim() ? "API key kept for this browser tab." : "API key cleared.");
  });
  $("#key-forget").addEventListener("click", () => {
    input.value = "";
    setKey("");
    flash("ok", "API key cleared.");
  });
}

async function readiness() {
  try {
    const r = await api("/readyz");
    const models = Object.entries(r.models || {}).map(([m, v]) => `${m} v${v}`);
    $("#readiness").textContent = r.ready ? `ready · ${models.join(", ")}` : "loading models…";
  } catch (err) {
    $("#readiness").textContent = err.status === 503 ? "loading models…" : "server unreachable";
  }
}

// ------------------------------------------------------------------------------------- models
const METRIC_KEYS = ["p@1", "p@3", "p@5", "ndcg@5", "psp@5"];

// Every model, a page at a time (the server bounds a page, and each model's versions to its newest);
// `versions`: how many of each model's newest versions to list (null: the server's default).
async function allModels(versions = null) {
  let cursor = null;
  const out = { default: null, models: [] };
  const shown = versions === null ? "" : `&versions=${versions}`;
  do {
    const page = await api(`/v1/models?limit=1000${shown}${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ""}`);
    out.default = page.default;
    out.models.push(...page.models);
    cursor = page.next_cursor ?? null;
  } while (cursor);
  return out;
}

function versionRow(m, v) {
  return el(
    "tr",
    { "data-version": v.version },
    el("td", {}, v.version),
    el("td", {}, v.active
      ? el("span", { class: "badge active" }, "active")
      : v.error ? el("span", { class: "badge failed", title: v.error }, "refused") : "available"),
    METRIC_KEYS.map((k) => el("td", { class: "num" }, num(v.metrics[k]))),
    el("td", { class: "actions" },
      v.active ? "" : el("button", {
        type: "button",
        class: "secondary",
        "aria-label": `Activate ${m.name} version ${v.version}`,
        onclick: (e) => activate(m.name, v.version, e.currentTarget),
      }, "Activate"),
      v.error ? "" : el("button", {
        type: "button",
        class: "secondary",
        "aria-label": `Grow ${m.name} version ${v.version} with new data`,
        title: "train its next version from this one, with new rows and labels",
        onclick: () => growFrom(m.name, v.version).catch(fail),
      }, "Grow")),
  );
}

// A model shows its newest versions; the older ones are fetched a page at a time, above them.
function olderVersions(m, tbody) {
  if (!m.versions_cursor) return "";
  let cursor = m.versions_cursor;
  let shown = m.versions.length;
  const note = el("span", { class: "muted" }, `newest ${shown} of ${m.n_versions} versions`);
  const button = el("button", {
    type: "button",
    class: "secondary",
    "aria-label": `Show older versions of ${m.name}`,
    onclick: async () => {
      button.disabled = true;
      try {
        const page = await api(`/v1/models/${encodeURIComponent(m.name)}/versions?limit=100&cursor=${encodeURIComponent(cursor)}`);
        tbody.prepend(...page.versions.slice().reverse().map((v) => versionRow(m, v)));
        shown += page.versions.length;
        cursor = page.next_cursor;
        note.textContent = cursor ? `newest ${shown} of ${m.n_versions} versions` : `all ${m.n_versions} versions`;
        button.hidden = !cursor;
      } catch (err) {
        fail(err);
      } finally {
        button.disabled = false;
      }
    },
  }, "Show older versions");
  return el("p", { class: "older-versions" }, note, " ", button);
}

async function loadModels() {
  const box = $("#models-list");
  const data = await allModels();
  if (data.models.length === 0) {
    box.replaceChildren(el("p", { class: "muted" }, "No model yet: train one on the Jobs page."));
    return;
  }
  box.replaceChildren(
    ...data.models.map((m) => {
      const versions = table(
        [["version"], ["state"], ...METRIC_KEYS.map((k) => [k, "num"]), [""]],
        m.versions.map((v) => versionRow(m, v)),
      );
      return el(
        "article",
        { class: "card", "aria-labelledby": `model-${m.name}` },
        el(
          "div",
          { class: "title-row" },
          el("h3", { id: `model-${m.name}` }, m.name, data.default === m.name ? " (default)" : ""),
          el("span", { class: "muted" },
            m.active_version ? `active: version ${m.active_version}` : "no active version",
            m.n_labels ? ` · ${m.n_labels.toLocaleString()} labels · ${m.n_features.toLocaleString()} features · dim ${m.dim}` : "",
            m.retrieval ? ` · ${m.retrieval}` : ""),
        ),
        olderVersions(m, versions.querySelector("tbody")),
        el("div", { class: "table-wrap" }, versions),
      );
    }),
  );
}

async function activate(name, version, button) {
  button.disabled = true;
  try {
    const r = await api(`/v1/models/${encodeURIComponent(name)}/versions/${encodeURIComponent(version)}/activate`,
      { method: "POST" });
    flash("ok", `${r.name}: version ${r.active_version} is active (was ${r.previous_version ?? "none"}).`);
    await loadModels();
    readiness();
  } catch (err) {
    button.disabled = false;
    fail(err);
  }
}

// ------------------------------------------------------------------------------------ datasets
let datasets = [];

function datasetStats(d) {
  return el(
    "dl",
    { class: "grid" },
    [["name", d.name], ["id", d.id], ["format", d.format], ["rows", d.rows.toLocaleString()],
      ["features", d.features === null ? "text (fixed at training)" : d.features.toLocaleString()],
      ["labels", d.labels.toLocaleString()], ["size", bytes(d.size_bytes)], ["SHA-256", d.checksum.slice(0, 16) + "…"]]
      .map(([k, v]) => el("div", {}, el("dt", { class: "muted" }, k), el("dd", {}, v))),
  );
}

async function loadDatasets() {
  datasets = (await api("/v1/datasets")).datasets;
  const box = $("#datasets-list");
  if (datasets.length === 0) {
    box.replaceChildren(el("p", { class: "muted" }, "Nothing uploaded yet."));
  } else {
    box.replaceChildren(
      table(
        [["name"], ["id"], ["format"], ["rows", "num"], ["features", "num"], ["labels", "num"], ["size", "num"], ["uploaded"]],
        datasets.map((d) =>
          el("tr", {},
            el("td", {}, d.name), el("td", {}, el("code", {}, d.id)), el("td", {}, d.format),
            el("td", { class: "num" }, d.rows.toLocaleString()),
            el("td", { class: "num" }, d.features === null ? "text" : d.features.toLocaleString()),
            el("td", { class: "num" }, d.labels.toLocaleString()),
            el("td", { class: "num" }, bytes(d.size_bytes)),
            el("td", {}, new Date(d.created_at * 1000).toLocaleString()))),
      ),
    );
  }
  fillDatasetSelects();
}

const DATASET_BLANK = {
  "#job-train": "choose a dataset",
  "#job-test": "none",
  "#job-replay": "default: its training data",
};

function fillDatasetSelects() {
  for (const [id, blank] of Object.entries(DATASET_BLANK)) {
    const select = $(id);
    const keep = select.value;
    select.replaceChildren(el("option", { value: "" }, blank));
    for (const d of datasets) {
      select.append(el("option", { value: d.id }, `${d.name} · ${d.rows.toLocaleString()} rows · ${d.labels} labels`));
    }
    select.value = keep;
  }
}

function initUpload() {
  $("#upload-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const file = $("#upload-file").files[0];
    if (!file) return flash("error", "choose a file to upload");
    const form = new FormData();
    form.append("file", file);
    if ($("#upload-name").value.trim()) form.append("name", $("#upload-name").value.trim());
    const bar = $("#upload-progress");
    bar.hidden = false;
    bar.value = 0;
    $("#upload-submit").disabled = true;
    try {
      const d = await upload("/v1/datasets", form, (f) => {
        bar.value = Math.round(f * 100);
        $("#upload-percent").textContent = f < 1 ? `${Math.round(f * 100)}%` : "validating…";
      });
      bar.value = 100;
      $("#upload-percent").textContent = "done";
      flash("ok", `Uploaded ${d.name}: ${d.rows.toLocaleString()} rows, ${d.labels} labels.`);
      $("#upload-result").replaceChildren(el("div", { class: "card", id: "upload-stats" },
        el("h3", {}, "Uploaded dataset"), datasetStats(d)));
      await loadDatasets();
    } catch (err) {
      $("#upload-percent").textContent = "";
      fail(err);
    } finally {
      $("#upload-submit").disabled = false;
    }
  });
}

// ---------------------------------------------------------------------------------------- jobs
let paramsForm = null;
let stream = null;
let currentJob = null;

async function loadParamsForm() {
  if (paramsForm) return;
  const spec = await api("/openapi.json");
  const jobCreate = spec.components.schemas.JobCreate || {};
  const params = (jobCreate.properties || {}).params || {};
  paramsForm = buildForm($("#job-params-fields"), params, spec);
}

async function loadJobs() {
  await Promise.all([loadParamsForm(), loadDatasets()]); // uploads from elsewhere show up too
  const jobs = (await api("/v1/jobs?limit=50")).jobs;
  const box = $("#jobs-list");
  if (jobs.length === 0) {
    box.replaceChildren(el("p", { class: "muted" }, "No job yet."));
    return;
  }
  box.replaceChildren(
    table(
      [["job"], ["model"], ["state"], ["progress"], ["version"], ["created"]],
      jobs.map((j) =>
        el("tr", {},
          el("td", {}, el("button", { type: "button", class: "secondary", onclick: () => openJob(j.id) }, j.id.slice(0, 8))),
          el("td", {}, j.model),
          el("td", {}, el("span", { class: `badge ${j.state}` }, j.state)),
          el("td", {}, j.progress.epochs ? `epoch ${j.progress.epoch ?? 0}/${j.progress.epochs}` : "–"),
          el("td", {}, j.model_version ?? "–"),
          el("td", {}, when(j.created_at)))),
    ),
  );
}

// The versions a job may continue: those of the model named in the form (by default the active one, else
// the newest, as the API picks).
async function loadBaseVersions() {
  const select = $("#job-base-version");
  const name = $("#job-model").value.trim();
  const keep = select.value;
  let info = null;
  if (name && $("#job-model").checkValidity()) {
    try {
      info = await api(`/v1/models/${encodeURIComponent(name)}`);
    } catch (err) {
      if (err.status !== 404) throw err;
    }
  }
  const usable = info ? info.versions.filter((v) => !v.error) : [];
  if (!usable.length) {
    select.replaceChildren(el("option", { value: "" }, name ? `${name} has no stored version` : "name the model first"));
    return;
  }
  select.replaceChildren(
    el("option", { value: "" }, info.active_version ? `the active version (${info.active_version})` : "the newest version"),
    ...usable.map((v) => el("option", { value: v.version },
      `version ${v.version}${v.metrics["p@1"] === undefined ? "" : ` · P@1 ${num(v.metrics["p@1"])}`}`)));
  select.value = usable.some((v) => v.version === keep) ? keep : "";
}

function syncBaseFields() {
  $("#job-base-fields").hidden = !$("#job-continue").checked;
  if ($("#job-continue").checked) loadBaseVersions().catch(fail);
}

// From the models page: the jobs page, set to continue that version.
async function growFrom(name, version) {
  $("#job-model").value = name;
  $("#job-continue").checked = true;
  $("#job-base-fields").hidden = false;
  await loadBaseVersions();
  $("#job-base-version").value = version;
  location.hash = "jobs";
  $("#job-train").focus();
}

function jobBase() {
  if (!$("#job-continue").checked) return undefined;
  const base = {};
  if ($("#job-base-version").value) base.version = $("#job-base-version").value;
  if ($("#job-replay").value) base.replay_dataset = $("#job-replay").value;
  return base;
}

function initJobForm() {
  $("#job-continue").addEventListener("change", syncBaseFields);
  $("#job-model").addEventListener("change", () => $("#job-continue").checked && loadBaseVersions().catch(fail));
  syncBaseFields(); // the browser may restore a checked box on reload
  $("#job-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    let params;
    try {
      params = paramsForm ? paramsForm.read() : {};
    } catch (err) {
      return fail(err);
    }
    const body = {
      model: $("#job-model").value.trim(),
      train_dataset: $("#job-train").value,
      params,
      activate: $("#job-activate").checked,
    };
    if ($("#job-test").value) body.test_dataset = $("#job-test").value;
    const base = jobBase();
    if (base) body.base = base;
    if (!body.train_dataset) return flash("error", "train_dataset: choose a training dataset (upload one on the Datasets page)");
    $("#job-submit").disabled = true;
    try {
      const r = await api("/v1/jobs", { method: "POST", json: body });
      flash("ok", `Job ${r.id} queued.`);
      await openJob(r.id);
      loadJobs().catch(fail);
    } catch (err) {
      fail(err);
    } finally {
      $("#job-submit").disabled = false;
    }
  });
  $("#job-cancel").addEventListener("click", async () => {
    if (!currentJob) return;
    try {
      await api(`/v1/jobs/${currentJob.id}/cancel`, { method: "POST" });
      flash("ok", `Cancel requested for job ${currentJob.id}.`);
    } catch (err) {
      fail(err);
    }
  });
  $("#job-logs-refresh").addEventListener("click", () => loadLogs().catch(fail));
  $("#job-logs-box").addEventListener("toggle", (e) => e.target.open && loadLogs().catch(fail));
}

async function loadLogs() {
  if (!currentJob) return;
  const text = await api(`/v1/jobs/${currentJob.id}/logs`);
  $("#job-logs").textContent = text || "(empty)";
}

function renderJob() {
  const j = currentJob;
  $("#job-detail-title").textContent = `Job ${j.id} · ${j.model}`;
  const state = $("#job-state");
  state.textContent = j.state;
  state.className = `badge ${j.state}`;
  const p = j.progress;
  const parts = [];
  if (p.epochs) parts.push(`epoch ${p.epoch ?? 0}/${p.epochs}`);
  if (p.steps_total) parts.push(`step ${p.step ?? 0}/${p.steps_total}`);
  if (p.loss !== null && p.loss !== undefined) parts.push(`loss ${num(p.loss)}`);
  if (p.examples_per_s) parts.push(`${Math.round(p.examples_per_s).toLocaleString()} rows/s`);
  if (j.base) parts.push(`continues ${j.base.model} version ${j.base.version}`);
  if (j.model_version) parts.push(`→ version ${j.model_version}`);
  if (j.error) parts.push(`error: ${j.error}`);
  $("#job-summary").textContent = parts.join(" · ");
  const bar = $("#job-progress");
  bar.max = p.steps_total || 1;
  bar.value = j.state === "succeeded" ? bar.max : p.step || 0;
  $("#job-cancel").disabled = ["succeeded", "failed", "cancelled"].includes(j.state);
  drawChart($("#chart-loss"), [{ name: "loss", color: "#b3261e", points: j.lossPoints }]);
  const keys = Object.keys(PK_COLORS).filter((k) => j.pkPoints[k] && j.pkPoints[k].length);
  drawChart($("#chart-pk"), keys.map((k) => ({ name: k, color: PK_COLORS[k], points: j.pkPoints[k] })), { yMin: 0 });
  $("#chart-pk-legend").replaceChildren(...keys.map((k) => el("span", { style: `--c:${PK_COLORS[k]}` }, k)));
  renderJobMetrics(p.metrics, datasets.find((d) => d.id === j.test_dataset));
}

// The last evaluated epoch's P@k on every test row, and for a continued model on the rows with a new
// label and on the others (`new.*`, `old.*`): whether it learned the new labels and kept the old ones.
function renderJobMetrics(metrics, test) {
  const box = $("#job-metrics");
  const ks = Object.keys(PK_COLORS);
  const parts = [["all test rows", ""], ["rows with a new label", "new."], ["rows with old labels only", "old."]]
    .filter(([, pre]) => metrics && ks.some((k) => metrics[pre + k] !== undefined));
  box.hidden = parts.length === 0;
  if (box.hidden) return;
  box.replaceChildren(table([["test rows"], ["rows", "num"], ...ks.map((k) => [k, "num"])],
    parts.map(([name, pre]) => el("tr", { "data-part": pre.replace(".", "") || "all" },
      el("td", {}, name),
      el("td", { class: "num" }, (pre ? metrics[`${pre}rows`] : test?.rows)?.toLocaleString() ?? "–"),
      ks.map((k) => el("td", { class: "num" }, num(metrics[pre + k])))))));
}

async function openJob(id) {
  if (stream) stream.close();
  const job = await api(`/v1/jobs/${encodeURIComponent(id)}`);
  currentJob = { ...job, lossPoints: [], pkPoints: {}, lastEpoch: null };
  $("#job-detail").hidden = false;
  $("#job-logs").textContent = "";
  renderJob();
  // The event stream replays every state and progress event from the start, then follows live.
  stream = new EventSource(`/v1/jobs/${encodeURIComponent(id)}/events`);
  const mine = stream;
  stream.addEventListener("progress", (e) => {
    if (mine !== stream) return;
    const p = JSON.parse(e.data);
    const j = currentJob;
    Object.assign(j.progress, Object.fromEntries(Object.entries(p).filter(([, v]) => v !== null)));
    if (p.loss !== null && p.loss !== undefined && p.step !== null && p.step !== undefined) j.lossPoints.push([p.step, p.loss]);
    if (p.metrics && p.epoch !== null && p.epoch !== j.lastEpoch) {
      j.lastEpoch = p.epoch;
      for (const k of Object.keys(PK_COLORS)) {
        if (p.metrics[k] !== undefined) (j.pkPoints[k] = j.pkPoints[k] || []).push([p.epoch, p.metrics[k]]);
      }
    }
    renderJob();
  });
  stream.addEventListener("state", async (e) => {
    if (mine !== stream) return;
    const s = JSON.parse(e.data);
    currentJob.state = s.state;
    if (s.model_version) currentJob.model_version = s.model_version;
    if (s.error) currentJob.error = s.error;
    renderJob();
    if (["succeeded", "failed", "cancelled"].includes(s.state)) {
      stream.close();
      if ($("#job-logs-box").open) loadLogs().catch(fail);
      loadJobs().catch(fail);
    }
  });
  stream.onerror = () => {
    // the server closes the stream after the final event; reconnecting would replay it
    if (["succeeded", "failed", "cancelled"].includes(currentJob.state)) stream.close();
  };
}

// ------------------------------------------------------------------------------------- predict
async function loadPredict() {
  const data = await allModels(0);  // the active versions only: no version list to read
  const select = $("#predict-model");
  const keep = select.value;
  select.replaceChildren(...data.models.filter((m) => m.active_version).map((m) =>
    el("option", { value: m.name }, `${m.name} (v${m.active_version}, ${m.n_labels?.toLocaleString() ?? "?"} labels)`)));
  select.value = keep || data.default || (data.models[0] && data.models[0].name) || "";
}

function parseFeatures(text) {
  const indices = [];
  const values = [];
  for (const tok of text.trim().split(/[\s,]+/).filter(Boolean)) {
    const m = tok.match(/^(\d+)(?::(-?[\d.eE+-]+))?$/);
    if (!m) throw new Error(`features: "${tok}" is not index:value`);
    indices.push(Number(m[1]));
    values.push(m[2] === undefined ? 1 : Number(m[2]));
  }
  if (indices.length === 0) throw new Error("features: give at least one index:value pair");
  return { indices, values };
}

function renderAnswer(r, norm) {
  const p = r.predictions[0];
  const head = el("div", { class: "answer-head" },
    el("span", {}, `answered by `, el("strong", { id: "answer-model" }, r.model), ` version `,
      el("strong", { id: "answer-version" }, r.version)),
    el("span", { class: `badge ${p.exact ? "exact" : "approx"}`, id: "answer-exact" },
      p.exact ? "exact: equals scoring every label" : "approximate: from the index"),
    el("span", { class: "muted" }, `${p.labels.length} label${p.labels.length === 1 ? "" : "s"}`,
      ["sparsemax", "evsoftmax"].includes(norm) ? " with non-zero probability (the rest have exactly 0)" : ""));
  const parts = [head];
  if (p.known_features === 0) {
    parts.push(el("p", { class: "msg warn", id: "answer-unknown" },
      "No feature of this input is known to the model (no word of it was in the training vocabulary): " +
      "the answer reflects only the label biases."));
  }
  const useProb = norm !== "none";
  const maxScore = Math.max(...p.labels.map((l) => Math.abs(l.score)), 1e-9);
  parts.push(el("ol", { class: "bars", id: "answer-bars", "aria-label": "labels, best first" },
    p.labels.map((l) => {
      const frac = useProb ? l.prob : Math.abs(l.score) / maxScore;
      const shown = useProb ? l.prob.toFixed(3) : l.score.toFixed(3);
      return el("li", {},
        el("span", { class: "label-name" }, l.name, " ", el("span", { class: "label-id" }, `#${l.id}`)),
        el("div", { class: "bar-track", role: "img", "aria-label": `${l.name}: ${useProb ? "probability" : "score"} ${shown}` },
          el("div", { class: "bar", style: `width:${(Math.max(0, frac) * 100).toFixed(1)}%` })),
        el("span", { class: "num" }, shown));
    })));
  $("#predict-result").replaceChildren(el("div", { class: "card" }, parts));
}

function initPredict() {
  const syncKind = () => {
    const text = document.querySelector('input[name="kind"]:checked').value === "text";
    $("#predict-text-field").hidden = !text;
    $("#predict-features-field").hidden = text;
  };
  for (const radio of document.querySelectorAll('input[name="kind"]')) radio.addEventListener("change", syncKind);
  syncKind(); // the browser may restore a checked radio on reload
  $("#predict-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const model = $("#predict-model").value;
    if (!model) return flash("error", "no model is loaded yet");
    const kind = document.querySelector('input[name="kind"]:checked').value;
    let input;
    try {
      if (kind === "text") {
        const text = $("#predict-text").value.trim();
        if (!text) throw new Error("text: type something to classify");
        input = { text };
      } else input = { features: parseFeatures($("#predict-features").value) };
    } catch (err) {
      return fail(err);
    }
    const norm = $("#predict-norm").value;
    const body = { inputs: [input], top_k: Number($("#predict-topk").value) || 10, normalization: norm,
      exact: $("#predict-exact").checked };
    try {
      renderAnswer(await api(`/v1/models/${encodeURIComponent(model)}/predict`, { method: "POST", json: body }), norm);
      $("#flash").replaceChildren();
    } catch (err) {
      fail(err);
    }
  });
}

// ---------------------------------------------------------------------------------------- start
Object.assign(loaders, { models: loadModels, datasets: loadDatasets, jobs: loadJobs, predict: loadPredict });
$("#models-refresh").addEventListener("click", () => loadModels().catch(fail));
$("#datasets-refresh").addEventListener("click", () => loadDatasets().catch(fail));
$("#jobs-refresh").addEventListener("click", () => loadJobs().catch(fail));
initKey();
initUpload();
initJobForm();
initPredict();
readiness();
setInterval(readiness, 15000);
show(location.hash.slice(1) || "models");
