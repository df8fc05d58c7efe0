// The ovex console: home, models, datasets, jobs and predict pages over the public HTTP API. Every job,
// model, version and dataset has its own address (#jobs/<id>, #models/<name>/<version>, #datasets/<id>).

import { api, ApiError, fieldErrors, getKey, setKey, upload } from "/console/api.js";
import { drawChart, duration } from "/console/chart.js";
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

// ------------------------------------------------------------------ errors next to their control
function clearErrors(scope) {
  for (const n of scope.querySelectorAll(".inline-error")) n.remove();
  for (const n of scope.querySelectorAll("[aria-invalid]")) n.removeAttribute("aria-invalid");
}

// Show `err` where the user is looking: each field it names under that field's control (opening a
// collapsed section around it), the rest beside `anchor` (the button that was pressed); the first message
// is scrolled into the viewport. `controlFor(path, name)` finds a field's control, or null.
function showError(anchor, err, controlFor = () => null) {
  const scope = anchor.closest("form, article, .card, section") || document.body;
  clearErrors(scope);
  const shown = [];
  const loose = [];
  for (const f of fieldErrors(err)) {
    const control = controlFor(f.path, f.name);
    if (!control) {
      loose.push(f);
      continue;
    }
    for (let d = control.closest("details"); d; d = d.parentElement.closest("details")) d.open = true;
    control.setAttribute("aria-invalid", "true");
    const box = control.closest(".field") || control;
    const msg = el("p", { class: "msg error inline-error", role: "alert", "data-field": f.name }, `${f.path}: ${f.msg.replace(/^[\w.]+:\s*/, "")}`);
    box.after(msg);
    shown.push(msg);
  }
  const text = err instanceof Error ? err.message : String(err);
  const named = shown.map((m) => m.dataset.field);
  const summary = shown.length && !loose.length
    ? `Not accepted: fix ${named.join(", ")} (${shown.length === 1 ? "marked" : "each marked"} above).`
    : text;
  const near = el("p", { class: "msg error inline-error", role: "alert", "data-field": named.concat(loose.map((f) => f.name)).join(" ") }, summary);
  const cell = anchor.closest("td");
  if (cell) cell.append(near);
  else anchor.after(near);
  const first = shown[0] || near;
  const r = first.getBoundingClientRect();
  if (r.top < 0 || r.bottom > window.innerHeight) first.scrollIntoView({ block: "center" });
  return first;
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
let currentPage = null;
// "#jobs/<id>" -> page "jobs", argument "<id>" (each part URL-decoded)
function show(hash) {
  let [page, ...rest] = hash.split("/").map((p) => decodeURIComponent(p));
  if (!loaders[page]) [page, rest] = ["home", []];
  currentPage = page;
  for (const s of document.querySelectorAll("main > section")) s.hidden = s.dataset.page !== page;
  for (const a of document.querySelectorAll("nav a[data-page]")) {
    if (a.dataset.page === page) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  loaders[page](...rest).catch(fail);
}
window.addEventListener("hashchange", () => {
  $("#flash").replaceChildren();
  show(location.hash.slice(1));
});
const link = (...parts) => `#${parts.map(encodeURIComponent).join("/")}`;
// Record where the user is without reloading the page (a later reload reopens it).
function remember(...parts) {
  if (location.hash !== link(...parts)) history.replaceState(null, "", link(...parts));
}
// Scroll to and mark the element a link points at.
function highlight(node) {
  if (!node) return;
  for (const n of document.querySelectorAll(".target")) n.classList.remove("target");
  node.classList.add("target");
  node.scrollIntoView({ block: "center" });
}

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
    el("td", {}, el("a", { href: link("models", m.name, v.version) }, v.version)),
    el("td", {}, v.active
      ? el("span", { class: "badge active" }, "active")
      : v.error ? el("span", { class: "badge failed", title: v.error }, "refused") : "available"),
    METRIC_KEYS.map((k) => el("td", { class: "num" }, num(v.metrics[k]))),
    el("td", { class: "test-set" }, v.test_dataset ? datasetName(v.test_dataset) : METRIC_KEYS.some((k) => v.metrics[k] !== undefined) ? "not recorded" : "–"),
    el("td", { class: "origin" },
      v.created_at ? el("span", { class: "muted" }, new Date(v.created_at * 1000).toLocaleString()) : "",
      v.lineage ? el("div", { class: "lineage" }, v.lineage) : "",
      v.job ? el("div", {}, "by ", el("a", { href: link("jobs", v.job) }, `job ${v.job.slice(4, 12)}`),
        v.dataset ? [" on ", datasetName(v.dataset)] : "") : ""),
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
      }, "Grow"),
      v.active ? "" : el("button", {
        type: "button",
        class: "danger",
        "aria-label": `Delete ${m.name} version ${v.version}`,
        onclick: (e) => deleteVersion(m.name, v.version, e.currentTarget),
      }, "Delete")),
  );
}

async function deleteVersion(name, version, button) {
  if (!window.confirm(`Delete version ${version} of ${name}? Its files are removed; this cannot be undone.`)) return;
  button.disabled = true;
  try {
    await api(`/v1/models/${encodeURIComponent(name)}/versions/${encodeURIComponent(version)}`, { method: "DELETE" });
    flash("ok", `${name}: version ${version} deleted.`);
    await loadModels();
  } catch (err) {
    button.disabled = false;
    showError(button, err);
  }
}

// Whether the server can delete a whole model (an endpoint newer than the console may be talking to).
let modelDeletes = null;
async function canDeleteModels() {
  if (modelDeletes === null) {
    const spec = await openapi();
    modelDeletes = Boolean(((spec.paths || {})["/v1/models/{name}"] || {}).delete);
  }
  return modelDeletes;
}

async function deactivate(name, button) {
  if (!window.confirm(`Stop serving ${name}? Its versions stay; activating one serves it again.`)) return;
  button.disabled = true;
  try {
    await api(`/v1/models/${encodeURIComponent(name)}/deactivate`, { method: "POST" });
    flash("ok", `${name} is deactivated: it answers no prediction until a version is activated.`);
    await loadModels();
    readiness();
  } catch (err) {
    button.disabled = false;
    showError(button, err);
  }
}

async function makeDefault(name, button) {
  button.disabled = true;
  try {
    const r = await api("/v1/default-model", { method: "PUT", json: { model: name } });
    flash("ok", `POST /v1/predict now answers with ${r.default}.`);
    await loadModels();
  } catch (err) {
    button.disabled = false;
    showError(button, err);
  }
}

async function deleteModel(name, button) {
  if (!window.confirm(`Delete the model ${name} with all its versions? This cannot be undone.`)) return;
  button.disabled = true;
  try {
    await api(`/v1/models/${encodeURIComponent(name)}`, { method: "DELETE" });
    flash("ok", `Model ${name} deleted.`);
    remember("models");
    await loadModels();
    readiness();
  } catch (err) {
    button.disabled = false;
    showError(button, err);
  }
}

// A dataset by its name, linked (its id where this page does not know it: no key, or deleted).
function datasetName(id) {
  const d = datasets.find((x) => x.id === id);
  return el("a", { href: link("datasets", id), title: id }, d ? d.name : id);
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

let modelsShown = 0;
async function loadModels(target, version) {
  const box = $("#models-list");
  const mine = ++modelsShown; // a later call's answer wins over one still on its way
  const [data, deletable] = await Promise.all([allModels(), canDeleteModels(),
    api("/v1/datasets").then((r) => { datasets = r.datasets; }).catch(() => {})]);
  const dflt = await api("/v1/default-model").catch(() => null);
  if (mine !== modelsShown) return;
  if (data.models.length === 0) {
    box.replaceChildren(el("p", { class: "muted" }, "No model yet: train one on the Jobs page."));
    return;
  }
  box.replaceChildren(
    ...data.models.map((m) => {
      const versions = table(
        [["version"], ["state"], ...METRIC_KEYS.map((k) => [k, "num"]), ["measured on"], ["made"], [""]],
        m.versions.map((v) => versionRow(m, v)),
      );
      return el(
        "article",
        { class: "card", "aria-labelledby": `model-${m.name}` },
        el(
          "div",
          { class: "title-row" },
          el("h3", { id: `model-${m.name}` }, el("a", { href: link("models", m.name) }, m.name),
            data.default === m.name ? " (default)" : ""),
          el("span", { class: "muted" },
            m.deactivated ? "deactivated: not served (activate a version to serve it)"
              : m.active_version ? `active: version ${m.active_version}` : "no active version",
            m.n_labels ? ` · ${m.n_labels.toLocaleString()} labels · ${m.n_features.toLocaleString()} features · dim ${m.dim}` : "",
            m.retrieval ? ` · ${m.retrieval}` : ""),
          m.active_version && !m.deactivated ? el("button", {
            type: "button", class: "secondary", "aria-label": `Deactivate ${m.name}`,
            title: "stop serving it; its versions stay, activating one serves it again",
            onclick: (e) => deactivate(m.name, e.currentTarget),
          }, "Deactivate") : "",
          dflt && data.default !== m.name && m.active_version ? el("button", {
            type: "button", class: "secondary", "aria-label": `Make ${m.name} the default model`,
            disabled: dflt.source === "setting",
            title: dflt.source === "setting" ? "OVEX_DEFAULT_MODEL sets the default on this server" : "answer POST /v1/predict with it",
            onclick: (e) => makeDefault(m.name, e.currentTarget),
          }, "Make default") : "",
          deletable ? el("button", {
            type: "button", class: "danger", "aria-label": `Delete model ${m.name}`,
            onclick: (e) => deleteModel(m.name, e.currentTarget),
          }, "Delete model") : "",
        ),
        olderVersions(m, versions.querySelector("tbody")),
        el("div", { class: "table-wrap" }, versions),
        m.label_texts && !m.deactivated ? addLabelsForm(m) : "",
      );
    }),
  );
  if (target) {
    const card = document.getElementById(`model-${target}`)?.closest("article");
    if (!card) return flash("error", `no model named ${target}`);
    highlight(version ? card.querySelector(`tr[data-version="${CSS.escape(version)}"]`) || card : card);
  }
}

// Labels added by their texts to a model trained with label texts: its next version, answering at once.
function addLabelsForm(m) {
  const id = `add-labels-${m.name}`;
  const area = el("textarea", { id, name: "labels", rows: 4, spellcheck: "false",
    placeholder: "giravu: a small striped antelope of the dry forests\nanother-label: what it is, in words" });
  const activate = el("input", { type: "checkbox", id: `${id}-activate`, name: "activate", checked: true });
  const button = el("button", { type: "submit" }, "Add labels");
  const form = el("form", { class: "add-labels", "data-model": m.name,
    onsubmit: (e) => { e.preventDefault(); addLabels(m.name, area, activate, button); } },
  el("div", { class: "field" },
    el("label", { for: id }, "One label a line: its name, a colon, then the text that says what it is"), area),
  el("div", { class: "field" }, el("label", { for: `${id}-activate` }, activate, " serve the new version at once")),
  button);
  return el("details", { class: "add-labels" },
    el("summary", {}, "Add labels by their texts"),
    el("p", { class: "muted" }, `Writes the next version of ${m.name}: its active version's labels, then these, ` +
      "each answered from its text until a training job with rows for it refines it (answers mark them " +
      "\u201cfrom its text\u201d). The active version itself stays as it is."),
    form);
}

// The form's lines as the request's labels; an Error naming the field for a line it cannot read.
function newLabels(text) {
  const labels = [];
  text.split("\n").forEach((line, i) => {
    if (!line.trim()) return;
    const at = line.indexOf(":");
    if (at <= 0 || !line.slice(0, at).trim()) {
      throw Object.assign(new Error(`line ${i + 1}: write the label's name, a colon, then its text`), { field: "labels" });
    }
    labels.push({ name: line.slice(0, at).trim(), text: line.slice(at + 1).trim() });
  });
  if (!labels.length) throw Object.assign(new Error("give at least one line: a name, a colon, its text"), { field: "labels" });
  return labels;
}

async function addLabels(name, area, activate, button) {
  button.disabled = true;
  try {
    const r = await api(`/v1/models/${encodeURIComponent(name)}/labels`,
      { method: "POST", json: { labels: newLabels(area.value), activate: activate.checked } });
    flash("ok", `${r.name}: version ${r.version} adds ${r.added} label${r.added === 1 ? "" : "s"} ` +
      `(ids ${r.first_label_id}\u2013${r.n_labels - 1}) to version ${r.base_version}` +
      `${r.activated ? " and answers now" : "; activate it to serve it"} (${r.seconds.toFixed(2)} s).`);
    await loadModels(name, r.version);
    readiness();
  } catch (err) {
    button.disabled = false;
    showError(button, err, (path) => (path.startsWith("labels") ? area : null));
  }
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
    showError(button, err);
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

async function deleteDataset(d, button) {
  if (!window.confirm(`Delete the dataset ${d.name} (${d.id})? Jobs that used it keep their records.`)) return;
  button.disabled = true;
  try {
    await api(`/v1/datasets/${encodeURIComponent(d.id)}`, { method: "DELETE" });
    flash("ok", `Dataset ${d.name} deleted.`);
    await loadDatasets();
  } catch (err) {
    button.disabled = false;
    showError(button, err);
  }
}

async function loadDatasets(target) {
  datasets = (await api("/v1/datasets")).datasets;
  const box = $("#datasets-list");
  if (datasets.length === 0) {
    box.replaceChildren(el("p", { class: "muted" }, "Nothing uploaded yet."));
  } else {
    box.replaceChildren(
      table(
        [["name"], ["id"], ["format"], ["rows", "num"], ["features", "num"], ["labels", "num"], ["size", "num"], ["uploaded"], [""]],
        datasets.map((d) =>
          el("tr", { "data-dataset": d.id },
            el("td", {}, el("a", { href: link("datasets", d.id) }, d.name)), el("td", {}, el("code", {}, d.id)), el("td", {}, d.format),
            el("td", { class: "num" }, d.rows.toLocaleString()),
            el("td", { class: "num" }, d.features === null ? "text" : d.features.toLocaleString()),
            el("td", { class: "num" }, d.labels.toLocaleString()),
            el("td", { class: "num" }, bytes(d.size_bytes)),
            el("td", {}, new Date(d.created_at * 1000).toLocaleString()),
            el("td", { class: "actions" }, el("button", {
              type: "button", class: "danger", "aria-label": `Delete dataset ${d.name}`,
              onclick: (e) => deleteDataset(d, e.currentTarget),
            }, "Delete")))),
      ),
    );
  }
  fillDatasetSelects();
  if (target && currentPage === "datasets") {
    const d = datasets.find((x) => x.id === target || x.name === target);
    if (!d) return flash("error", `no dataset ${target}`);
    $("#upload-result").replaceChildren(el("div", { class: "card", id: "dataset-detail" }, el("h3", {}, `Dataset ${d.name}`), datasetStats(d)));
    highlight(document.querySelector(`tr[data-dataset="${CSS.escape(d.id)}"]`));
  }
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
    clearErrors($("#upload-form"));
    if (!file) return showError($("#upload-submit"), Object.assign(new Error("file: choose a file to upload"), { field: "file" }), () => $("#upload-file"));
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
      if (d.name !== ($("#upload-name").value.trim() || file.name) && $("#upload-name").value.trim()) {
        flash("warn", `This file was uploaded before as ${d.name}: the stored copy is kept under that name.`);
      }
      await loadDatasets();
    } catch (err) {
      $("#upload-percent").textContent = "";
      showError($("#upload-submit"), err, (path) => (path === "file" ? $("#upload-file") : path === "name" ? $("#upload-name") : null));
    } finally {
      $("#upload-submit").disabled = false;
    }
  });
}

// ---------------------------------------------------------------------------------------- jobs
const ENDED = ["succeeded", "failed", "cancelled"];
// the options a first job needs; the rest sit under "Advanced options"
const PRIMARY_PARAMS = ["epochs"];
let paramsForm = null;
let stream = null;
let currentJob = null;
let spec = null;

async function openapi() {
  if (!spec) spec = await api("/openapi.json");
  return spec;
}

async function loadParamsForm() {
  if (paramsForm) return;
  const doc = await openapi();
  const jobCreate = doc.components.schemas.JobCreate || {};
  const params = (jobCreate.properties || {}).params || {};
  paramsForm = buildForm($("#job-params-fields"), params, doc,
    { primary: PRIMARY_PARAMS, primaryContainer: $("#job-primary-fields") });
  const n = $("#job-params-fields").querySelectorAll(".field").length;
  $("#job-params summary").textContent = `Advanced options (${n})`;
}

// A job's control for an error's field: the form's own fields, then the generated options.
function jobControl(path, name) {
  const own = { model: "#job-model", train_dataset: "#job-train", test_dataset: "#job-test",
    "base.version": "#job-base-version", "base.replay_dataset": "#job-replay", base: "#job-base-version",
    label_texts: "#job-train", activate: "#job-activate" };
  if (own[path]) return $(own[path]);
  if (path.startsWith("params.") || path === name) return paramsForm ? paramsForm.field(path.replace(/^params\./, "").split(".")[0]) : null;
  return null;
}

function jobRow(j) {
  return el("tr", { "data-job": j.id },
    el("td", {}, el("a", { href: link("jobs", j.id), "aria-label": `job ${j.id}` }, j.id.slice(0, 8))),
    el("td", {}, el("a", { href: link("models", j.model) }, j.model)),
    el("td", {}, el("span", { class: `badge ${j.state}` }, j.state), j.activated ? el("span", { class: "badge active" }, "activated") : ""),
    el("td", {}, j.progress.epochs ? `epoch ${j.progress.epoch ?? 0}/${j.progress.epochs}` : "–"),
    el("td", {}, j.model_version ? el("a", { href: link("models", j.model, j.model_version) }, j.model_version) : "–"),
    el("td", {}, when(j.created_at)));
}

function jobsTable(jobs) {
  return table([["job"], ["model"], ["state"], ["progress"], ["version"], ["created"]], jobs.map(jobRow));
}

async function refreshJobList() {
  const jobs = (await api("/v1/jobs?limit=50")).jobs;
  const box = $("#jobs-list");
  box.replaceChildren(jobs.length === 0 ? el("p", { class: "muted" }, "No job yet.") : jobsTable(jobs));
  box.dataset.updated = String(Date.now());
}

async function loadJobs(id) {
  await Promise.all([loadParamsForm(), loadDatasets()]); // uploads from elsewhere show up too
  await refreshJobList();
  if (id) {
    await openJob(id);
    $("#job-detail").scrollIntoView({ block: "start" });
  }
}

// The params a blank field takes when continuing `version` of `name`: the params of the job that made it,
// where a job did (a version from the command line shows the global defaults).
async function baseParams(name, version) {
  const jobs = (await api("/v1/jobs?limit=200")).jobs;
  const made = jobs.find((j) => j.model === name && j.model_version === version && j.state === "succeeded");
  return made ? made.params : null;
}

async function syncPlaceholders() {
  if (!paramsForm) return;
  const note = $("#job-params-note");
  if (!$("#job-continue").checked) {
    paramsForm.showDefaults({});
    note.textContent = "Generated from the server's schema; a blank field takes the value shown in it.";
    return;
  }
  const select = $("#job-base-version");
  const version = select.value || select.dataset.implied || "";
  const name = $("#job-model").value.trim();
  const params = version ? await baseParams(name, version) : null;
  paramsForm.showDefaults(params || {});
  note.textContent = params
    ? `A blank field takes ${name} version ${version}'s value, shown in it.`
    : "A blank field takes the base version's value (not known here: the global defaults are shown).";
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
    select.dataset.implied = "";
    return syncPlaceholders();
  }
  select.dataset.implied = info.active_version || usable[usable.length - 1].version;
  select.replaceChildren(
    el("option", { value: "" }, info.active_version ? `the active version (${info.active_version})` : "the newest version"),
    ...usable.map((v) => el("option", { value: v.version },
      `version ${v.version}${v.metrics["p@1"] === undefined ? "" : ` · P@1 ${num(v.metrics["p@1"])}`}`)));
  select.value = usable.some((v) => v.version === keep) ? keep : "";
  return syncPlaceholders();
}

function syncBaseFields() {
  $("#job-base-fields").hidden = !$("#job-continue").checked;
  if ($("#job-continue").checked) loadBaseVersions().catch(fail);
  else syncPlaceholders().catch(fail);
}

// From the models page: the jobs page, set to continue that version.
async function growFrom(name, version) {
  $("#job-model").value = name;
  $("#job-continue").checked = true;
  $("#job-base-fields").hidden = false;
  location.hash = "jobs";
  await loadParamsForm();
  await loadBaseVersions();
  $("#job-base-version").value = version;
  await syncPlaceholders();
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
  $("#job-base-version").addEventListener("change", () => syncPlaceholders().catch(fail));
  syncBaseFields(); // the browser may restore a checked box on reload
  $("#job-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const submit = $("#job-submit");
    clearErrors($("#job-form"));
    let params;
    try {
      params = paramsForm ? paramsForm.read() : {};
    } catch (err) {
      return showError(submit, err, jobControl);
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
    if (!body.train_dataset) {
      return showError(submit, Object.assign(new Error("choose a training dataset (upload one on the Datasets page)"),
        { field: "train_dataset" }), jobControl);
    }
    submit.disabled = true;
    try {
      const r = await api("/v1/jobs", { method: "POST", json: body });
      flash("ok", `Job ${r.id} queued.`);
      await openJob(r.id);
      refreshJobList().catch(fail);
    } catch (err) {
      showError(submit, err, jobControl);
    } finally {
      submit.disabled = false;
    }
  });
  $("#job-cancel").addEventListener("click", async (e) => {
    if (!currentJob) return;
    clearErrors($("#job-detail"));
    try {
      await api(`/v1/jobs/${currentJob.id}/cancel`, { method: "POST" });
      flash("ok", `Cancel requested for job ${currentJob.id}.`);
    } catch (err) {
      showError(e.currentTarget, err);
    }
  });
  $("#job-logs-refresh").addEventListener("click", () => loadLogs().catch(fail));
  $("#job-logs-box").addEventListener("toggle", (e) => e.target.open && loadLogs().catch(fail));
  // the recent jobs follow the server while the page is in sight
  setInterval(() => {
    if (currentPage === "jobs" && !document.hidden) refreshJobList().catch(() => {});
  }, 3000);
}

async function loadLogs() {
  if (!currentJob) return;
  const text = await api(`/v1/jobs/${currentJob.id}/logs`);
  $("#job-logs").textContent = text || "(empty)";
}

// Seconds per step so far, from the job's start to its end (or now): the time axis and the ETA.
function pace(j) {
  const start = j.started_at ? Date.parse(j.started_at) : null;
  const step = j.progress.step || 0;
  if (!start || !step) return null;
  const end = j.finished_at ? Date.parse(j.finished_at) : Date.now();
  return Math.max(end - start, 0) / 1000 / step;
}

function renderJob() {
  const j = currentJob;
  $("#job-detail-title").textContent = `Job ${j.id} · ${j.model}`;
  const state = $("#job-state");
  state.textContent = j.state;
  state.className = `badge ${j.state}`;
  const act = $("#job-activated");
  if (j.activated) act.replaceChildren(el("span", { class: "badge active", id: "job-activated-badge" }, `version ${j.model_version} is active: it answers predictions`));
  else if (j.activationError) act.replaceChildren(el("span", { class: "badge failed" }, `not activated: ${j.activationError}`));
  else if (j.activate && j.state === "succeeded") act.replaceChildren(el("span", { class: "badge queued" }, "activating…"));
  else act.replaceChildren();
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
  const perStep = pace(j);
  const start = j.started_at ? Date.parse(j.started_at) : null;
  const elapsed = start ? ((j.finished_at ? Date.parse(j.finished_at) : Date.now()) - start) / 1000 : null;
  const timing = [];
  if (elapsed !== null) timing.push(`elapsed ${duration(elapsed)}`);
  if (!ENDED.includes(j.state) && perStep && p.steps_total) timing.push(`about ${duration((p.steps_total - (p.step || 0)) * perStep)} left`);
  if (j.state === "queued") timing.push("waiting for a worker");
  $("#job-timing").textContent = timing.join(" · ");
  const bar = $("#job-progress");
  bar.max = p.steps_total || 1;
  bar.value = j.state === "succeeded" ? bar.max : p.step || 0;
  $("#job-cancel").disabled = ENDED.includes(j.state);

  const ended = ENDED.includes(j.state);
  const lossSeries = [{ name: "loss", color: "#b3261e", points: j.lossPoints },
    { name: "epoch mean", color: "#5b6475", points: j.epochLoss }];
  drawChart($("#chart-loss"), lossSeries, {
    log: "auto", xName: "step", timeOf: perStep ? (x) => x * perStep : null,
    marks: j.epochLoss.map(([x], i) => ({ x, label: `e${i + 1}` })),
    empty: ended ? "no loss was reported" : j.state === "queued" ? "waiting for a worker to start the job" : "the first loss comes after a few steps",
  });
  $("#chart-loss-legend").replaceChildren(
    el("span", { style: "--c:#b3261e" }, "loss (moving average over steps)"),
    el("span", { style: "--c:#5b6475" }, "epoch mean (at each epoch's end)"));
  const test = datasets.find((d) => d.id === j.test_dataset);
  $("#chart-pk-caption").textContent = j.test_dataset
    ? `Test P@k by epoch, on ${test ? `${test.name} (${test.rows.toLocaleString()} rows)` : j.test_dataset}`
    : "Test P@k by epoch";
  const keys = Object.keys(PK_COLORS).filter((k) => j.pkPoints[k] && j.pkPoints[k].length);
  drawChart($("#chart-pk"), keys.map((k) => ({ name: k, color: PK_COLORS[k], points: j.pkPoints[k] })), {
    yMin: 0, xName: "epoch",
    empty: !j.test_dataset ? "no test set: this job measures no P@k (choose a test dataset to see it)"
      : ended ? "no epoch was evaluated" : "the first point comes at the end of epoch 1",
  });
  $("#chart-pk-legend").replaceChildren(...keys.map((k) => el("span", { style: `--c:${PK_COLORS[k]}` }, k)));
  renderJobMetrics(p.metrics, test);
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

// An epoch's last report carries the epoch's mean loss at the step the epoch ends on; it is drawn as its
// own series, not among the moving averages of the steps.
function isEpochEnd(p) {
  if (!p.epochs || !p.steps_total || p.epoch === null || p.epoch === undefined) return false;
  return p.metrics !== undefined && p.metrics !== null ? true : p.step === Math.round((p.epoch * p.steps_total) / p.epochs);
}

async function openJob(id) {
  if (stream) stream.close();
  const job = await api(`/v1/jobs/${encodeURIComponent(id)}`);
  currentJob = { ...job, lossPoints: [], epochLoss: [], pkPoints: {}, lastEpoch: null, activationError: null };
  remember("jobs", job.id);
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
    const hasLoss = p.loss !== null && p.loss !== undefined && p.step !== null && p.step !== undefined;
    if (hasLoss && isEpochEnd(p)) {
      if (!j.epochLoss.some(([x]) => x === p.step)) j.epochLoss.push([p.step, p.loss]);
    } else if (hasLoss) j.lossPoints.push([p.step, p.loss]);
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
    if (ENDED.includes(s.state)) {
      const fresh = await api(`/v1/jobs/${encodeURIComponent(id)}`).catch(() => null);
      if (fresh && mine === stream) Object.assign(currentJob, { started_at: fresh.started_at, finished_at: fresh.finished_at, activated: fresh.activated });
      if (!currentJob.activate || s.state !== "succeeded") stream.close();
      if ($("#job-logs-box").open) loadLogs().catch(fail);
      refreshJobList().catch(fail);
    }
    renderJob();
  });
  // after success, a job that asked to be activated gets one more event when its version serves
  stream.addEventListener("activated", (e) => {
    if (mine !== stream) return;
    currentJob.activated = true;
    const d = JSON.parse(e.data);
    if (d.model_version) currentJob.model_version = d.model_version;
    stream.close();
    renderJob();
    refreshJobList().catch(fail);
    readiness();
  });
  stream.addEventListener("activation_failed", (e) => {
    if (mine !== stream) return;
    currentJob.activationError = JSON.parse(e.data).error || "refused";
    stream.close();
    renderJob();
  });
  stream.onerror = () => {
    // the server closes the stream after the final event; reconnecting would replay it
    if (ENDED.includes(currentJob.state)) stream.close();
  };
}

// ------------------------------------------------------------------------------------- predict
const kinds = {}; // model name -> "text" | "features", as learned from the server

// A model's input kind: a field of its listing where the server gives one, else one probe (a one-word
// text, top 1): a model that takes sparse features refuses text with a 422 saying so.
async function inputKind(m) {
  const given = m.input_kind || m.input;
  if (given) return /text/.test(given) ? "text" : "features";
  if (kinds[m.name]) return kinds[m.name];
  try {
    await api(`/v1/models/${encodeURIComponent(m.name)}/predict`, { method: "POST", json: { inputs: [{ text: "a" }], top_k: 1 } });
    kinds[m.name] = "text";
  } catch (err) {
    if (err.status === 422 && /feature/.test(err.message)) kinds[m.name] = "features";
    else return null;
  }
  return kinds[m.name];
}

let predictModels = [];
async function loadPredict(name) {
  const data = await allModels(0);  // the active versions only: no version list to read
  predictModels = data.models.filter((m) => m.active_version);
  const select = $("#predict-model");
  const keep = name || select.value;
  select.replaceChildren(...predictModels.map((m) =>
    el("option", { value: m.name }, `${m.name} (v${m.active_version}, ${m.n_labels?.toLocaleString() ?? "?"} labels)${data.default === m.name ? " · default" : ""}`)));
  select.value = predictModels.some((m) => m.name === keep) ? keep : data.default || (predictModels[0] && predictModels[0].name) || "";
  const doc = await openapi();
  // explanations are offered where the server's predict request has the field
  $("#predict-explain").closest(".field").hidden = !((doc.components.schemas.PredictRequest || {}).properties || {}).explain;
  await followModel();
}

function setKind(kind) {
  for (const r of document.querySelectorAll('input[name="kind"]')) r.checked = r.value === kind;
  $("#predict-text-field").hidden = kind !== "text";
  $("#predict-features-field").hidden = kind === "text";
  updateCode();
}

async function followModel() {
  const m = predictModels.find((x) => x.name === $("#predict-model").value);
  if (!m) return;
  if (currentPage === "predict") remember("predict", m.name);
  const kind = await inputKind(m);
  $("#predict-kind-note").textContent = kind ? `(${m.name} takes ${kind === "text" ? "text" : "sparse features"})` : "";
  if (kind) setKind(kind);
}

function parseFeatures(text) {
  const indices = [];
  const values = [];
  for (const tok of text.trim().split(/[\s,]+/).filter(Boolean)) {
    const m = tok.match(/^(\d+)(?::(-?[\d.eE+-]+))?$/);
    if (!m) throw Object.assign(new Error(`features: "${tok}" is not index:value`), { field: "features" });
    indices.push(Number(m[1]));
    values.push(m[2] === undefined ? 1 : Number(m[2]));
  }
  if (indices.length === 0) throw Object.assign(new Error("features: give at least one index:value pair"), { field: "features" });
  return { indices, values };
}

// A label's name as a person reads it: XC labels are numbered, their name is their id ("label 24").
// A label known by its text alone (no training rows yet) is marked so.
function labelName(l) {
  const mark = l.from_text ? [" ", el("span", { class: "badge from-text",
    title: "known by its text alone: no training rows yet; a training job with rows for it refines it" }, "from its text")] : [];
  return String(l.name) === String(l.id) ? el("span", { class: "label-name" }, `label ${l.id}`, ...mark)
    : el("span", { class: "label-name" }, l.name, " ", el("span", { class: "label-id" }, `#${l.id}`), ...mark);
}

// The words behind a label: the input's words shaded by their contribution to the label's score (green adds,
// red takes away), then the largest contributions in numbers.
function explanation(l, input) {
  const ex = l.explanation;
  if (!ex) return "";
  const items = ex.contributions || [];
  const weight = {};
  for (const it of items) {
    if (it.word && !/\s/.test(it.word)) weight[it.word.toLowerCase()] = it.contribution;
  }
  const max = Math.max(...items.map((it) => Math.abs(it.contribution)), 1e-9);
  const shade = (c) => `--a:${(0.15 + 0.75 * Math.min(Math.abs(c) / max, 1)).toFixed(2)}`;
  const text = input.text
    ? el("p", { class: "explain-text" }, input.text.split(/(\s+)/).map((w) => {
      const c = weight[w.toLowerCase().replace(/[^\p{L}\p{N}_'-]/gu, "")];
      if (c === undefined || !w.trim()) return w;
      return el("mark", { class: c >= 0 ? "plus" : "minus", style: shade(c), title: `${c >= 0 ? "+" : ""}${c.toFixed(3)} to the score`,
        "data-contribution": c }, w);
    }))
    : "";
  const chips = el("p", { class: "explain-terms muted" },
    ex.approximate ? `${ex.method} (approximate): ` : `score = bias ${ex.bias.toFixed(3)} + `,
    items.map((it) => el("span", { class: `chip ${it.contribution >= 0 ? "plus" : "minus"}`, style: shade(it.contribution) },
      `${it.word ?? `#${it.feature}`} ${it.contribution >= 0 ? "+" : ""}${it.contribution.toFixed(3)}`)));
  return el("div", { class: "explain", "data-label": l.name }, text, chips);
}

function renderAnswer(r, norm, input) {
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
        labelName(l),
        el("div", { class: "bar-track", role: "img", "aria-label": `${l.name}: ${useProb ? "probability" : "score"} ${shown}` },
          el("div", { class: "bar", style: `width:${(Math.max(0, frac) * 100).toFixed(1)}%` })),
        el("span", { class: "num" }, shown),
        explanation(l, input));
    })));
  $("#predict-result").replaceChildren(el("div", { class: "card" }, parts));
}

// The request the form would send, or null with what is missing.
function predictRequest() {
  const kind = document.querySelector('input[name="kind"]:checked').value;
  let input;
  if (kind === "text") {
    const text = $("#predict-text").value.trim();
    if (!text) throw Object.assign(new Error("text: type something to classify"), { field: "text" });
    input = { text };
  } else input = { features: parseFeatures($("#predict-features").value) };
  const body = { inputs: [input], top_k: Number($("#predict-topk").value) || 10, normalization: $("#predict-norm").value,
    exact: $("#predict-exact").checked };
  if ($("#predict-explain").checked && !$("#predict-explain").closest(".field").hidden) body.explain = true;
  return body;
}

function updateCode() {
  const model = $("#predict-model").value || "MODEL";
  let body;
  try {
    body = predictRequest();
  } catch {
    body = { inputs: [{ text: "..." }], top_k: 10 };
  }
  const url = `${location.origin}/v1/models/${encodeURIComponent(model)}/predict`;
  const json = JSON.stringify(body);
  $("#code-curl").textContent = `curl -s ${url} \\\n  -H 'content-type: application/json' \\\n  -d '${json.replace(/'/g, "'\\''")}'`;
  $("#code-python").textContent = `import httpx\n\nr = httpx.post(\n    "${url}",\n    json=${JSON.stringify(body, null, 4).replace(/\n/g, "\n    ").replace(/\btrue\b/g, "True").replace(/\bfalse\b/g, "False").replace(/\bnull\b/g, "None")},\n)\nr.raise_for_status()\nfor label in r.json()["predictions"][0]["labels"]:\n    print(label["name"], label["prob"], label["score"])`;
}

function initPredict() {
  const syncKind = () => setKind(document.querySelector('input[name="kind"]:checked').value);
  for (const radio of document.querySelectorAll('input[name="kind"]')) radio.addEventListener("change", syncKind);
  syncKind(); // the browser may restore a checked radio on reload
  $("#predict-model").addEventListener("change", () => followModel().catch(fail));
  $("#predict-form").addEventListener("input", updateCode);
  $("#predict-form").addEventListener("change", updateCode);
  for (const b of document.querySelectorAll("[data-copy]")) {
    b.addEventListener("click", async () => {
      const text = document.getElementById(b.dataset.copy).textContent;
      try {
        await navigator.clipboard.writeText(text);
        b.textContent = "Copied";
      } catch {
        const range = document.createRange();  // no clipboard here (plain http): select it for Ctrl+C
        range.selectNodeContents(document.getElementById(b.dataset.copy));
        getSelection().removeAllRanges();
        getSelection().addRange(range);
        b.textContent = "Selected: press Ctrl+C";
      }
      setTimeout(() => { b.textContent = b.dataset.copy === "code-curl" ? "Copy curl" : "Copy Python"; }, 2500);
    });
  }
  $("#predict-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const submit = $("#predict-submit");
    const controls = { text: $("#predict-text"), features: $("#predict-features"), top_k: $("#predict-topk"),
      normalization: $("#predict-norm"), exact: $("#predict-exact") };
    const controlFor = (path, name) => controls[name] || controls[path.split(".").find((p) => controls[p])] || null;
    clearErrors($("#predict-form"));
    const model = $("#predict-model").value;
    let body;
    try {
      if (!model) throw new Error("no model is loaded yet");
      body = predictRequest();
    } catch (err) {
      $("#predict-result").replaceChildren();
      return showError(submit, err, controlFor);
    }
    updateCode();
    try {
      const r = await api(`/v1/models/${encodeURIComponent(model)}/predict`, { method: "POST", json: body });
      renderAnswer(r, body.normalization, body.inputs[0]);
      $("#flash").replaceChildren();
    } catch (err) {
      $("#predict-result").replaceChildren();  // an answer to an earlier request is not this one's
      showError(submit, err, controlFor);
    }
  });
}

// ------------------------------------------------------------------------------------------ home
// Prometheus text: [{name, labels, value}] for every sample line.
export function parseMetrics(text) {
  const out = [];
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const m = line.match(/^([a-zA-Z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)/);
    if (!m) continue;
    const labels = {};
    for (const l of (m[2] || "").matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]] = l[2].replace(/\\(.)/g, "$1");
    out.push({ name: m[1], labels, value: Number(m[3]) });
  }
  return out;
}

// The q-quantile of a histogram's cumulative buckets [[le, count]], by linear interpolation in its bucket.
function quantile(buckets, q) {
  const total = buckets.length ? buckets[buckets.length - 1][1] : 0;
  if (!total) return null;
  const rank = q * total;
  let [prevLe, prevCount] = [0, 0];
  for (const [le, count] of buckets) {
    if (count >= rank) {
      if (!Number.isFinite(le)) return prevLe;
      return prevLe + ((rank - prevCount) / Math.max(count - prevCount, 1e-9)) * (le - prevLe);
    }
    [prevLe, prevCount] = [le, count];
  }
  return prevLe;
}

let lastScrape = null;
// Per route: requests/s and errors since the last read, p50/p99 over the last read's new requests (since
// the start on the first read); per model: rows answered per second.
function traffic(samples, prev, dt) {
  const routes = {};
  const key = (l) => `${l.method} ${l.route}`;
  for (const s of samples) {
    const l = s.labels;
    if (s.name === "ovex_requests_total") {
      const r = (routes[key(l)] ||= { route: l.route, method: l.method, count: 0, errors: 0, buckets: {} });
      r.count += s.value;
      if (Number(l.status) >= 400) r.errors += s.value;
    } else if (s.name === "ovex_request_duration_seconds_bucket") {
      const r = (routes[key(l)] ||= { route: l.route, method: l.method, count: 0, errors: 0, buckets: {} });
      const le = l.le === "+Inf" ? Infinity : Number(l.le);
      r.buckets[le] = (r.buckets[le] || 0) + s.value;
    }
  }
  // per model, whichever route asked: rows answered, requests, errors and latency
  const models = {};
  const model = (name) => (models[name] ||= { rows: 0, count: 0, errors: 0, buckets: {} });
  for (const s of samples) {
    const l = s.labels;
    if (s.name === "ovex_predicted_rows_total") model(l.model).rows += s.value;
    else if (s.name === "ovex_predict_errors_total") model(l.model).errors += s.value;
    else if (s.name === "ovex_predict_duration_seconds_count") model(l.model).count += s.value;
    else if (s.name === "ovex_predict_duration_seconds_bucket") {
      const b = model(l.model).buckets;
      const le = l.le === "+Inf" ? Infinity : Number(l.le);
      b[le] = (b[le] || 0) + s.value;
    }
  }
  const since = (r, before) => {
    const les = Object.keys(r.buckets).map(Number).sort((a, b) => a - b);
    const delta = les.map((le) => [le, r.buckets[le] - (before ? before.buckets[le] || 0 : 0)]);
    const recent = before && delta.length && delta[delta.length - 1][1] > 0;
    const cum = recent ? delta : les.map((le) => [le, r.buckets[le]]);
    r.p50 = les.length ? quantile(cum, 0.5) : null;
    r.p99 = les.length ? quantile(cum, 0.99) : null;
    r.window = recent ? "last 5 s" : "since start";
    r.rate = before && dt ? (r.count - before.count) / dt : null;
    r.newErrors = before ? r.errors - before.errors : null;
  };
  for (const r of Object.values(routes)) since(r, prev && prev.routes[`${r.method} ${r.route}`]);
  for (const [name, m] of Object.entries(models)) {
    since(m, prev && prev.models[name]);
    m.rowRate = prev && prev.models[name] && dt ? (m.rows - prev.models[name].rows) / dt : null;
  }
  return { routes, models };
}

const ms = (s) => (s === null || s === undefined ? "–" : s < 0.001 ? `${(s * 1e6).toFixed(0)} µs` : `${(s * 1000).toFixed(1)} ms`);

async function readTraffic() {
  const resp = await fetch("/metrics");
  if (!resp.ok) throw new ApiError(resp.status, `/metrics answered ${resp.status}`);
  const now = Date.now();
  const dt = lastScrape ? (now - lastScrape.at) / 1000 : null;
  const t = traffic(parseMetrics(await resp.text()), lastScrape, dt);
  const routes = Object.values(t.routes).filter((r) => !["/metrics", "unmatched"].includes(r.route) && r.count > 0)
    .sort((a, b) => b.count - a.count);
  $("#home-traffic").replaceChildren(routes.length === 0 ? el("p", { class: "muted" }, "No request yet.")
    : table([["route"], ["requests/s", "num"], ["p50", "num"], ["p99", "num"], ["errors (4xx/5xx)", "num"], ["requests", "num"]],
      routes.map((r) => el("tr", { "data-route": `${r.method} ${r.route}` },
        el("td", {}, el("code", {}, `${r.method} ${r.route}`)),
        el("td", { class: "num" }, r.rate === null ? "…" : r.rate.toFixed(2)),
        el("td", { class: "num", title: r.window }, ms(r.p50)),
        el("td", { class: "num", title: r.window }, ms(r.p99)),
        el("td", { class: "num" }, `${r.errors.toLocaleString()}${r.newErrors ? ` (+${r.newErrors})` : ""}`),
        el("td", { class: "num" }, r.count.toLocaleString())))));
  const models = Object.entries(t.models);
  $("#home-models-traffic").replaceChildren(models.length === 0 ? ""
    : table([["model"], ["requests/s", "num"], ["p50", "num"], ["p99", "num"], ["errors", "num"],
      ["rows answered/s", "num"], ["rows answered", "num"]],
      models.map(([name, m]) => el("tr", { "data-model": name },
        el("td", {}, el("a", { href: link("models", name) }, name)),
        el("td", { class: "num" }, m.rate === null ? "…" : m.rate.toFixed(2)),
        el("td", { class: "num", title: m.window }, ms(m.p50)),
        el("td", { class: "num", title: m.window }, ms(m.p99)),
        el("td", { class: "num" }, `${m.errors.toLocaleString()}${m.newErrors ? ` (+${m.newErrors})` : ""}`),
        el("td", { class: "num" }, m.rowRate === null ? "…" : m.rowRate.toFixed(2)),
        el("td", { class: "num" }, m.rows.toLocaleString())))));
  lastScrape = { at: now, routes: t.routes, models: t.models };
}

async function loadHome() {
  const [data, dsets, jobs] = await Promise.all([
    allModels(0),
    api("/v1/datasets").then((r) => r.datasets).catch(() => null),
    api("/v1/jobs?limit=5").then((r) => r.jobs).catch(() => null),
  ]);
  const served = data.models.filter((m) => m.active_version);
  $("#home-served").replaceChildren(served.length === 0 ? el("p", { class: "muted" }, "No model serves yet.")
    : table([["model"], ["version"], ["labels", "num"], ["p@1", "num"]], served.map((m) => el("tr", {},
      el("td", {}, el("a", { href: link("models", m.name) }, m.name), data.default === m.name ? el("span", { class: "badge" }, "default") : ""),
      el("td", {}, el("a", { href: link("models", m.name, m.active_version) }, m.active_version)),
      el("td", { class: "num" }, m.n_labels?.toLocaleString() ?? "–"),
      el("td", { class: "num" }, num(m.metrics["p@1"]))))));
  $("#home-jobs").replaceChildren(jobs === null ? el("p", { class: "muted" }, "Enter the API key to see the jobs.")
    : jobs.length === 0 ? el("p", { class: "muted" }, "No job yet.") : jobsTable(jobs));
  let next;
  if (dsets === null) {
    next = [el("strong", {}, "Next: enter the API key"), " at the top of the page (", el("code", {}, "make run"), " prints it) to upload data and train."];
  } else if (dsets.length === 0) {
    next = [el("strong", {}, "Next: "), el("a", { href: "#datasets", id: "next-step" }, "upload a dataset"),
      " (XC or JSONL text with labels), then train a model on it."];
  } else if (!jobs || jobs.length === 0) {
    next = [el("strong", {}, "Next: "), el("a", { href: "#jobs", id: "next-step" }, "train a model"),
      ` on one of your ${dsets.length} dataset${dsets.length === 1 ? "" : "s"}.`];
  } else {
    next = [el("strong", {}, "Next: "), el("a", { href: "#predict", id: "next-step" }, "try a prediction"),
      served.length ? ` with ${data.default || served[0].name}` : "", ", or ", el("a", { href: "#models" }, "compare versions"), "."];
  }
  $("#home-next").replaceChildren(el("p", {}, ...next));
  await readTraffic();
}

// ---------------------------------------------------------------------------------------- start
Object.assign(loaders, { home: loadHome, models: loadModels, datasets: loadDatasets, jobs: loadJobs, predict: loadPredict });
$("#models-refresh").addEventListener("click", () => loadModels().catch(fail));
$("#datasets-refresh").addEventListener("click", () => loadDatasets().catch(fail));
$("#jobs-refresh").addEventListener("click", () => refreshJobList().catch(fail));
initKey();
initUpload();
initJobForm();
initPredict();
readiness();
setInterval(readiness, 15000);
setInterval(() => {
  if (currentPage === "home" && !document.hidden) readTraffic().catch(() => {});
}, 5000);
show(location.hash.slice(1) || "home");
